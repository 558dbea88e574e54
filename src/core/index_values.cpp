// Widening and range checks of index tensors (index_values.h).
#include "hmla/core/index_values.h"

#include <limits>
#include <sstream>

namespace hmla {

namespace {

// "[r, t]" of flat element i in a tensor of `shape`.
std::string position(const Shape& shape, int64_t i) {
  Shape idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = shape[d] > 0 ? i % shape[d] : 0;
    i = shape[d] > 0 ? i / shape[d] : 0;
  }
  return shape_str(idx);
}

}  // namespace

std::vector<int64_t> index_values(const Tensor& t, const std::string& what) {
  if (t.dtype() == DType::i64) return t.to_vector<int64_t>();
  HMLA_CHECK(t.dtype() == DType::i32, IoError, what, " must be i32 or i64, got ", dtype_name(t.dtype()));
  std::vector<int64_t> v;
  for (int32_t x : t.to_vector<int32_t>()) v.push_back(x);
  return v;
}

Tensor token_ids(const Tensor& t, int64_t vocab_size, const std::string& what) {
  const int64_t limit = vocab_size > 0 ? vocab_size : int64_t(std::numeric_limits<int32_t>::max()) + 1;
  const std::vector<int64_t> v = index_values(t, what);
  std::vector<int32_t> ids(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    HMLA_CHECK(v[i] >= 0 && v[i] < limit, IoError, what, position(t.shape(), int64_t(i)), " = ", v[i],
               vocab_size > 0 ? " is outside the vocabulary [0, " : " is not a token id: ids lie in [0, ", limit,
               vocab_size > 0 ? ")" : ") (the config has no vocab_size)");
    ids[i] = static_cast<int32_t>(v[i]);
  }
  return Tensor::from_vector<int32_t>(t.shape(), ids);
}

}  // namespace hmla
