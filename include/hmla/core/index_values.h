// Integer tensors read from users' files that index memory or a table (token ids, cu_seqlens,
// end rows): widened or range-checked in their own dtype before anything narrows them, so an
// i64 id of 2^32 + 41 is an error, never id 41.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "hmla/core/tensor.h"

namespace hmla {

// The values of an i32 or i64 tensor, widened to int64; IoError naming `what` for other dtypes.
std::vector<int64_t> index_values(const Tensor& t, const std::string& what);

// Token ids (i32 or i64, any shape) as an i32 tensor of the same shape. Every id is checked
// against [0, vocab_size) in its own dtype first; IoError naming `what`, the position and the
// value otherwise. vocab_size <= 0 (a config without one) bounds the ids by int32 instead.
Tensor token_ids(const Tensor& t, int64_t vocab_size, const std::string& what);

}  // namespace hmla
