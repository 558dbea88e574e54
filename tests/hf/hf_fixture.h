// What the tests against transformers' fixtures share (tests/hf/make_fixtures.py and
// make_v4_fixtures.py store float64 tensors as two f32 tensors, NAME_hi + NAME_lo).
#pragma once
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "hmla/io/safetensors.h"

namespace hmla::testing {

// The float64 values of the fixture tensor `name` (hi + lo; an infinite hi stands alone).
inline std::vector<double> joined(const io::TensorMap& f, const std::string& name) {
  auto hi = f.at(name + "_hi").to_vector<float>(), lo = f.at(name + "_lo").to_vector<float>();
  std::vector<double> out(hi.size());
  for (size_t i = 0; i < hi.size(); ++i) out[i] = std::isinf(hi[i]) ? double(hi[i]) : double(hi[i]) + double(lo[i]);
  return out;
}

// STYLE.md's bound on an f32 evaluation of the fixture tensor `name` whose f32 instance (the oracle
// run in float32) is NAME_f32: twice the naive instance's error plus 8 f32 ulps of the largest value.
inline double fixture_f32_bound(const io::TensorMap& f, const std::string& name) {
  const std::vector<double> ref = joined(f, name);
  const std::vector<float> f32 = f.at(name + "_f32").to_vector<float>();
  double e = 0, mag = 0;
  for (size_t i = 0; i < ref.size(); ++i) e = std::max(e, std::abs(double(f32[i]) - ref[i]));
  for (double v : ref) mag = std::max(mag, std::abs(v));
  return 2 * e + 8 * 0x1p-23 * mag;
}

}  // namespace hmla::testing
