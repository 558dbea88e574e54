// FP8 block-scale dequantization at read time (checkpoint_forms.h).
#include "hmla/io/checkpoint_forms.h"

#include <cmath>
#include <cstring>

#include "hmla/core/error.h"

namespace hmla::io {

float e4m3_to_f32(uint8_t code) {
  const int sign = code >> 7, exp = (code >> 3) & 0xf, man = code & 0x7;
  if (exp == 0xf && man == 0x7) return std::nanf("");
  // Subnormal: man / 8 * 2^-6; normal: (1 + man / 8) * 2^(exp - 7). ldexp of a small integer is exact.
  const float mag = exp == 0 ? std::ldexp(float(man), -9) : std::ldexp(float(8 + man), exp - 10);
  return sign ? -mag : mag;
}

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string scale_name(const std::string& weight) { return weight + "_scale_inv"; }

// The checks of one FP8 weight and its scale (checkpoint_forms.h), before any is dequantized.
void check_fp8_weight(const TensorMap& tensors, const std::string& name, const StoredTensor& w, const Fp8Blocks& b,
                      const std::string& what) {
  HMLA_CHECK(name.ends_with(".weight") && w.shape.size() == 2, IoError, what, ": tensor '", name, "' is F8_E4M3 ",
             shape_str(w.shape), "; hmla dequantizes 2-D FP8 weights named *.weight only");
  const std::string sn = scale_name(name);
  auto it = tensors.find(sn);
  HMLA_CHECK(it != tensors.end(), IoError, what, ": FP8 tensor '", name, "' has no '", sn,
             "' (its block scales); the checkpoint is incomplete");
  const Tensor& s = it->second;
  const Shape need{ceil_div(w.shape[0], b.rows), ceil_div(w.shape[1], b.cols)};
  HMLA_CHECK(s.dtype() == DType::f32 && s.shape() == need, IoError, what, ": tensor '", sn, "' is ",
             dtype_name(s.dtype()), " ", shape_str(s.shape()), "; the scales of '", name, "' ", shape_str(w.shape),
             " in ", b.rows, "x", b.cols, " blocks (weight_block_size) are f32 ", shape_str(need));
  const float* sv = s.data<float>();
  for (int64_t i = 0; i < s.numel(); ++i)
    HMLA_CHECK(std::isfinite(sv[i]), IoError, what, ": tensor '", sn, "' holds a non-finite scale (", sv[i],
               " at flat index ", i, ")");
  for (size_t i = 0; i < w.bytes.size(); ++i)
    HMLA_CHECK((uint8_t(w.bytes[i]) & 0x7f) != 0x7f, IoError, what, ": tensor '", name,
               "' holds an e4m3 NaN code at flat index ", i, "; weights must be finite");
}

Tensor dequantize(const StoredTensor& w, const Tensor& scale, const Fp8Blocks& b) {
  const int64_t rows = w.shape[0], cols = w.shape[1], sc = scale.size(1);
  Tensor out = Tensor::empty(w.shape, DType::f32);
  float* o = out.data<float>();
  const float* s = scale.data<float>();
  const auto* q = reinterpret_cast<const uint8_t*>(w.bytes.data());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) o[i * cols + j] = e4m3_to_f32(q[i * cols + j]) * s[(i / b.rows) * sc + j / b.cols];
  return out;
}

}  // namespace

void dequantize_fp8_weights(TensorMap& tensors, StoredMap& fp8, const Fp8Blocks* fmt, const std::string& what) {
  if (fp8.empty()) return;
  HMLA_CHECK(fmt, IoError, what, ": tensor '", fp8.begin()->first,
             "' is F8_E4M3 but the config has no quantization_config (quant_method \"fp8\", weight_block_size)");
  for (const auto& [name, w] : fp8) check_fp8_weight(tensors, name, w, *fmt, what);
  for (auto& [name, w] : fp8) {
    const std::string sn = scale_name(name);
    tensors[name] = dequantize(w, tensors.at(sn), *fmt);  // w * s is the one rounding: exact e4m3 times f32
    tensors.erase(sn);
  }
  fp8.clear();
}

}  // namespace hmla::io
