// Small helpers shared by the benchmarks: seeded inputs, wall time, allocator peaks.
#pragma once
#include <chrono>
#include <random>

#include "hmla/core/tensor.h"

namespace hmla::bench {

using Clock = std::chrono::steady_clock;

inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

inline Tensor randn(const Shape& shape, std::mt19937_64& rng, float sd = 1.f) {
  Tensor t = Tensor::empty(shape, DType::f32);
  std::normal_distribution<float> nd(0.f, sd);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = nd(rng);
  return t;
}

// Runs f and returns the device allocator's peak above what was live before it.
template <class F>
size_t peak_above_live(F&& f, Device d = Device::cpu) {
  Allocator& a = allocator(d);
  const size_t live = a.live_bytes();
  a.reset_peak();
  f();
  return a.peak_bytes() - live;
}

}  // namespace hmla::bench
