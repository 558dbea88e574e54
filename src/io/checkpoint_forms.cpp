// FP8 block-scale dequantization at read time (checkpoint_forms.h).
#include "hmla/io/checkpoint_forms.h"

#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <vector>

#include "hmla/core/error.h"

namespace hmla::io {

float e4m3_to_f32(uint8_t code) {
  const int sign = code >> 7, exp = (code >> 3) & 0xf, man = code & 0x7;
  if (exp == 0xf && man == 0x7) return std::nanf("");
  // Subnormal: man / 8 * 2^-6; normal: (1 + man / 8) * 2^(exp - 7). ldexp of a small integer is exact.
  const float mag = exp == 0 ? std::ldexp(float(man), -9) : std::ldexp(float(8 + man), exp - 10);
  return sign ? -mag : mag;
}

float e8m0_to_f32(uint8_t code) { return code == 0xff ? std::nanf("") : std::ldexp(1.f, int(code) - 127); }

float e2m1_to_f32(uint8_t code) {
  const int sign = (code >> 3) & 1, exp = (code >> 1) & 3, man = code & 1;
  // Subnormal: man / 2; normal: (1 + man / 2) * 2^(exp - 1).
  const float mag = exp == 0 ? 0.5f * float(man) : std::ldexp(float(2 + man), exp - 2);
  return sign ? -mag : mag;
}

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The two names a weight's scales go by: DeepSeek-V3.2's `X.weight_scale_inv`, V4's `X.scale`
// (transformers renames the second to the first).
std::string scale_inv_name(const std::string& weight) { return weight + "_scale_inv"; }
std::string scale_name(const std::string& weight) { return weight.substr(0, weight.size() - 7) + ".scale"; }

// A weight's block scales as f32, whichever form the file holds.
struct Scales {
  std::string name, dtype;
  Shape shape;
  std::vector<float> v;
};

// Finds and decodes the scales of `name` (checkpoint_forms.h), checked finite.
Scales find_scales(const TensorMap& tensors, const StoredMap& fp8, const std::string& name, const char* kind,
                   const std::string& what) {
  const std::string a = scale_inv_name(name), b = scale_name(name);
  const bool has_a = tensors.count(a) || fp8.count(a), has_b = tensors.count(b) || fp8.count(b);
  HMLA_CHECK(!(has_a && has_b), IoError, what, ": ", kind, " tensor '", name, "' has scales under two names ('", a,
             "' and '", b, "'); a checkpoint holds one");
  HMLA_CHECK(has_a || has_b, IoError, what, ": ", kind, " tensor '", name, "' has no '", a, "' (or '", b,
             "': its block scales); the checkpoint is incomplete");
  Scales s;
  s.name = has_a ? a : b;
  if (auto it = tensors.find(s.name); it != tensors.end()) {
    HMLA_CHECK(it->second.dtype() == DType::f32, IoError, what, ": tensor '", s.name, "' is ",
               dtype_name(it->second.dtype()), "; block scales are F32, F8_E8M0 or e8m0 bytes (U8)");
    s.dtype = "f32";
    s.shape = it->second.shape();
    s.v = it->second.to_vector<float>();
  } else {
    const StoredTensor& t = fp8.at(s.name);
    HMLA_CHECK(t.dtype == "F8_E8M0" || t.dtype == "U8", IoError, what, ": tensor '", s.name, "' is ", t.dtype,
               "; block scales are F32, F8_E8M0 or e8m0 bytes (U8)");
    s.dtype = t.dtype;
    s.shape = t.shape;
    for (char c : t.bytes) s.v.push_back(e8m0_to_f32(uint8_t(c)));
  }
  for (size_t i = 0; i < s.v.size(); ++i)
    HMLA_CHECK(std::isfinite(s.v[i]), IoError, what, ": tensor '", s.name, "' holds a non-finite scale (", s.v[i],
               " at flat index ", i, ")");
  return s;
}

// One quantized weight, checked, with its scales and blocks: the logical shape (FP4: twice the
// stored columns) and the block the scale grid implies.
struct Quantized {
  Shape shape;
  int64_t br = 0, bc = 0;
  bool fp4 = false;
  Scales scales;
};

Quantized check_weight(const TensorMap& tensors, const StoredMap& fp8, const std::string& name,
                       const StoredTensor& w, const Fp8Blocks& b, const std::string& what) {
  Quantized q;
  q.fp4 = w.dtype == "I8";
  HMLA_CHECK(name.ends_with(".weight") && w.shape.size() == 2, IoError, what, ": tensor '", name, "' is ", w.dtype,
             " ", shape_str(w.shape), "; hmla dequantizes 2-D quantized weights named *.weight only");
  HMLA_CHECK(!q.fp4 || b.fp4, IoError, what, ": tensor '", name,
             "' is I8; hmla reads I8 weights as packed FP4 only with expert_dtype \"fp4\" in config.json");
  q.shape = {w.shape[0], q.fp4 ? 2 * w.shape[1] : w.shape[1]};
  q.scales = find_scales(tensors, fp8, name, q.fp4 ? "FP4" : "FP8", what);
  const Shape& ss = q.scales.shape;
  if (q.fp4) {  // the grid sets the block (DeepSeek's [1, 32]), as transformers' Fp8Dequantize derives it
    HMLA_CHECK(ss.size() == 2 && ss[0] >= 1 && ss[1] >= 1 && q.shape[0] % ss[0] == 0 && q.shape[1] % ss[1] == 0,
               IoError, what, ": tensor '", q.scales.name, "' is ", q.scales.dtype, " ", shape_str(ss), "; the scales of the FP4 weight '",
               name, "' (", shape_str(q.shape), " unpacked) must divide it into whole blocks");
    q.br = q.shape[0] / ss[0];
    q.bc = q.shape[1] / ss[1];
  } else {
    q.br = b.rows;
    q.bc = b.cols;
    const Shape need{ceil_div(w.shape[0], b.rows), ceil_div(w.shape[1], b.cols)};
    HMLA_CHECK(ss == need, IoError, what, ": tensor '", q.scales.name, "' is ", q.scales.dtype, " ", shape_str(ss), "; the scales of '",
               name, "' ", shape_str(w.shape), " in ", b.rows, "x", b.cols, " blocks (weight_block_size) are ",
               shape_str(need));
    HMLA_CHECK(w.dtype == "F8_E4M3", IoError, what, ": tensor '", name, "' is ", w.dtype,
               "; quantized weights are F8_E4M3 (or I8 packed FP4 experts)");
    for (size_t i = 0; i < w.bytes.size(); ++i)
      HMLA_CHECK((uint8_t(w.bytes[i]) & 0x7f) != 0x7f, IoError, what, ": tensor '", name,
                 "' holds an e4m3 NaN code at flat index ", i, "; weights must be finite");
  }
  return q;
}

Tensor dequantize(const StoredTensor& w, const Quantized& q) {
  const int64_t rows = q.shape[0], cols = q.shape[1], sc = q.scales.shape[1];
  Tensor out = Tensor::empty(q.shape, DType::f32);
  float* o = out.data<float>();
  const float* s = q.scales.v.data();
  const auto* b = reinterpret_cast<const uint8_t*>(w.bytes.data());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const float x = q.fp4 ? e2m1_to_f32(uint8_t(b[(i * cols + j) / 2] >> (4 * (j % 2))) & 0xf)
                            : e4m3_to_f32(b[i * cols + j]);
      o[i * cols + j] = x * s[(i / q.br) * sc + j / q.bc];  // the one rounding: exact code times f32
    }
  return out;
}

}  // namespace

void dequantize_fp8_weights(TensorMap& tensors, StoredMap& fp8, const Fp8Blocks* fmt, const std::string& what) {
  if (fp8.empty()) return;
  std::map<std::string, Quantized> plan;
  std::set<std::string> scales;
  for (const auto& [name, w] : fp8) {
    if (w.dtype != "F8_E4M3" && w.dtype != "I8") continue;  // scales: consumed by their weight
    HMLA_CHECK(fmt, IoError, what, ": tensor '", name, "' is ", w.dtype,
               " but the config has no quantization_config (quant_method \"fp8\", weight_block_size)");
    Quantized q = check_weight(tensors, fp8, name, w, *fmt, what);
    scales.insert(q.scales.name);
    plan.emplace(name, std::move(q));
  }
  for (const auto& [name, w] : fp8)
    HMLA_CHECK(plan.count(name) || scales.count(name), IoError, what, ": tensor '", name, "' is ", w.dtype,
               " but no quantized weight names it as its scales ('X.scale' or 'X.weight_scale_inv' of 'X.weight')");
  for (auto& [name, q] : plan) {
    tensors[name] = dequantize(fp8.at(name), q);
    tensors.erase(q.scales.name);
  }
  fp8.clear();
}

}  // namespace hmla::io
