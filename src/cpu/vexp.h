// Vectorisable exp for softmax rows: Cephes-style range reduction and a degree-6 polynomial,
// branch-free so that `omp simd` loops compile to AVX2/AVX-512 code. Relative error < 2 ulp on
// [-87.3, 88.3]; returns exactly 0 below -87.3 (so exp(-inf) = 0, the masked-score case).
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>

// Element-wise kernels are compiled for AVX-512 and the x86-64-v3 baseline; the loader picks one.
#if defined(__x86_64__) && defined(__GNUC__)
#define HMLA_CLONES __attribute__((target_clones("avx512f", "default")))
#else
#define HMLA_CLONES
#endif

namespace hmla::cpu {

#pragma omp declare simd
inline float exp_approx(float x) {
  const float lo = -87.3f, hi = 88.3f;
  float xc = x < lo ? lo : (x > hi ? hi : x);
  float fn = std::floor(xc * 1.44269504088896341f + 0.5f);
  float r = xc - fn * 0.693359375f;
  r = r + fn * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t n = static_cast<int32_t>(fn);
  float scale = std::bit_cast<float>((n + 127) << 23);
  return x < lo ? 0.f : p * scale;
}

// x[i] = exp(x[i] - m) for i < n; returns the sum of the results (in a fixed order).
inline float exp_shift_sum(float* x, int64_t n, float m) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) {
    float e = exp_approx(x[i] - m);
    x[i] = e;
    sum += e;
  }
  return sum;
}

inline float row_max(const float* x, int64_t n) {
  float m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

}  // namespace hmla::cpu
