// What the files of src/model share, private to it.
#pragma once
#include <algorithm>
#include <cstdint>

#include "hmla/core/error.h"
#include "hmla/core/tensor.h"

namespace hmla {

// The LM head and its loss run over this many rows at a time, so their logits and the logits'
// gradient (2 x rows x vocab_size f32) stay within 2 x 32 MiB: the [tokens, vocab] matrix of a
// step is never whole. A batch within one chunk computes exactly as one unchunked call.
inline constexpr int64_t kHeadChunkElems = int64_t(1) << 23;
inline int64_t head_chunk_rows(int64_t vocab) { return std::max<int64_t>(1, kHeadChunkElems / vocab); }

// A saved tensor's storage: the view the caller put in `slot` (the activation arena's: its shape
// and dtype must be these), else a new tensor, which the slot then holds.
inline Tensor& saved_slot(Tensor& slot, const Shape& shape, DType dt, Device dev) {
  if (!slot.defined()) return slot = Tensor::empty(shape, dt, dev);
  HMLA_CHECK(slot.shape() == shape && slot.dtype() == dt && slot.device() == dev && slot.is_contiguous(), ShapeError,
             "activation arena: a saved tensor's view is ", dtype_name(slot.dtype()), shape_str(slot.shape()), ", the layer needs ",
             dtype_name(dt), shape_str(shape));
  return slot;
}

}  // namespace hmla
