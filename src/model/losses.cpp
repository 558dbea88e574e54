// The loss rows of DESIGN.md section 3.
#include "hmla/model/losses.h"

#include <algorithm>
#include <vector>

#include "hmla/core/error.h"

namespace hmla {

namespace {
std::vector<float> row_mask(const DocLayout& layout, const Tensor* input_ids, int64_t pad) {
  const int64_t b = layout.b, s = layout.s;
  std::vector<int64_t> ids;
  if (input_ids) {
    HMLA_CHECK(input_ids->shape() == Shape({b, s}), ShapeError, "input_ids must be [b, s] = ", shape_str({b, s}));
    if (input_ids->dtype() == DType::i64) {
      ids = input_ids->to_vector<int64_t>();
    } else {
      for (int32_t v : input_ids->to_vector<int32_t>()) ids.push_back(v);
    }
  }
  std::vector<float> m(b * s);
  for (int64_t r = 0; r < b; ++r)
    for (int64_t t = 0; t < s; ++t)
      m[r * s + t] = (!input_ids || (ids[r * s + t] != pad && !layout.is_padding(r, t))) ? 1.f : 0.f;
  return m;
}
}  // namespace

int64_t loss_row_count(const DocLayout& layout, const Tensor* input_ids, int64_t pad) {
  int64_t n = 0;
  for (float v : row_mask(layout, input_ids, pad)) n += v > 0.f;
  return n;
}

Tensor loss_row_weights(const DocLayout& layout, const Tensor* input_ids, int64_t pad, int64_t global_valid) {
  std::vector<float> m = row_mask(layout, input_ids, pad);
  int64_t count = 0;
  for (float v : m) count += v > 0.f;
  const int64_t valid = global_valid > 0 ? global_valid : std::max<int64_t>(count, 1);
  for (float& v : m) v /= float(valid);
  return Tensor::from_vector<float>({layout.b, layout.s}, m);
}

int64_t loss_sequence_count(const DocLayout& layout, const Tensor* input_ids, int64_t pad) {
  const std::vector<float> m = row_mask(layout, input_ids, pad);
  int64_t n = 0;
  for (int64_t r = 0; r < layout.b; ++r) {
    bool any = false;
    for (int64_t t = 0; t < layout.s; ++t) any |= m[size_t(r * layout.s + t)] > 0.f;
    n += any;
  }
  return n;
}

}  // namespace hmla
