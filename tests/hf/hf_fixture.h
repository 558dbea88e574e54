// What the tests against transformers' fixtures share (tests/hf/make_fixtures.py and
// make_v4_fixtures.py store float64 tensors as two f32 tensors, NAME_hi + NAME_lo).
#pragma once
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

}  // namespace hmla::testing
