// Helpers of the CUDA checks (no GoogleTest: hmla_cuda_check links them on GPU machines; the gtest
// suites' tests/common/testing.h has the same error measure behind EXPECTs).
#pragma once
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "hmla/core/tensor.h"

namespace hmla::cuda_check {

// A message as a JSON string's contents (quotes, backslashes and control characters escaped).
inline std::string json_escape(const std::string& m) {
  std::string o;
  for (char ch : m) {
    if (ch == '"' || ch == '\\') o += '\\', o += ch;
    else if (static_cast<unsigned char>(ch) < 0x20) o += ' ';
    else o += ch;
  }
  return o;
}

inline float rbf(float x) { return bf16_to_f32(f32_to_bf16(x)); }  // rounded to bf16

inline std::vector<float> randn_bf16(size_t n, uint64_t seed) {  // N(0, 1), bf16-valued
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = rbf(nd(rng));
  return v;
}

// The kernel under test's input: bf16 on a device, f32 on the CPU (the CPU kernels' dtype).
inline Tensor put(const Shape& shape, const std::vector<float>& v, Device dev = Device::cuda) {
  if (dev == Device::cpu) return Tensor::from_vector<float>(shape, v);
  Tensor h = Tensor::empty(shape, DType::bf16);
  for (size_t i = 0; i < v.size(); ++i) h.data<bf16>()[i] = f32_to_bf16(v[i]);
  return h.to(dev);
}

inline std::vector<float> host(const Tensor& t) {  // f32 values of an f32 or bf16 tensor
  Tensor h = t.to(Device::cpu);
  if (h.dtype() == DType::f32) return h.to_vector<float>();
  std::vector<float> v(h.numel());
  for (int64_t i = 0; i < h.numel(); ++i) v[i] = bf16_to_f32(h.data<bf16>()[i]);
  return v;
}

inline double max_abs(const std::vector<double>& v) {  // over finite entries
  double m = 0;
  for (double x : v)
    if (std::isfinite(x)) m = std::max(m, std::abs(x));
  return m;
}

// Max |x - ref|; infinities must match exactly (lse of empty rows), NaN never passes.
template <class A>
double max_err(const std::vector<A>& x, const std::vector<double>& ref) {
  double e = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double xi = double(x[i]);
    if (std::isinf(ref[i]) || std::isinf(xi)) {
      if (xi != ref[i]) return INFINITY;
      continue;
    }
    if (std::isnan(xi)) return INFINITY;
    e = std::max(e, std::abs(xi - ref[i]));
  }
  return e;
}

}  // namespace hmla::cuda_check
