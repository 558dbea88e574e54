// What the model's files share, private to src/model: the LM head's chunk size (model.cpp,
// model_tables.cpp), the micro-batch as the step's kernels read it (model_batch.cpp builds it,
// model.cpp's forward and backward read it) and a saved tensor's slot (mla_layer.cpp, indexer.cpp).
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "hmla/core/error.h"
#include "hmla/core/layout.h"
#include "hmla/core/tensor.h"
#include "hmla/dist/comm.h"
#include "hmla/model/model.h"

namespace hmla {

// The LM head and its loss run over this many rows at a time, so their logits (the gradient is
// written over them: rows x vocab_size f32) stay within 128 MiB: the [tokens, vocab] matrix of a
// step is never whole. A batch within one chunk computes exactly as one unchunked call. The size
// is the products': at hidden 128 and vocab 129280 (issue 44) the three products of a chunk ran
// at 64, 85, 100 and 104 GFLOP/s with 64, 128, 256 and 512 rows (2 threads, OpenBLAS SkylakeX, per
// second of process CPU time on a shared machine; a 2048^3 sgemm: 165), so 2^25 takes most of it.
inline constexpr int64_t kHeadChunkElems = int64_t(1) << 25;
inline int64_t head_chunk_rows(int64_t vocab) { return std::max<int64_t>(1, kHeadChunkElems / vocab); }

// The LM loss over rows n_final [N, hidden] against the head W [vocab, hidden] (sum of
// keep-weighted cross-entropies, rows in order) added into the device scalar acc; with dn defined,
// the head's weight gradient is added into gW (one product per chunk, its depth the chunk's rows)
// and the rows' gradient written into dn [N, hidden]. The logits' gradient is written over the
// chunk's logits (lm_head.cpp).
void lm_head_loss(const Model& m, const Tensor& W, const Tensor& n_final, const Tensor& target, const Tensor& keep,
                  const Tensor& gW, const Tensor& dn, const Tensor& acc);

// A saved tensor's storage: the view the caller put in `slot` (the activation arena's: its shape
// and dtype must be these), else a new tensor, which the slot then holds.
inline Tensor& saved_slot(Tensor& slot, const Shape& shape, DType dt, Device dev) {
  if (!slot.defined()) return slot = Tensor::empty(shape, dt, dev);
  HMLA_CHECK(slot.shape() == shape && slot.dtype() == dt && slot.device() == dev && slot.is_contiguous(), ShapeError,
             "activation arena: a saved tensor's view is ", dtype_name(slot.dtype()), shape_str(slot.shape()), ", the layer needs ",
             dtype_name(dt), shape_str(shape));
  return slot;
}

// One micro-batch as the step's kernels read it, on the model's device: this rank's token ids, the
// LM targets and their weights, the indexer's loss-row weights, and the layout's device form. Built
// on the host as one buffer of 4-byte words and uploaded in one copy (issue 27: one upload per
// micro-batch; no op uploads a layout of its own); on the CPU the views are that buffer itself.
struct DeviceBatch {
  Tensor ids;         // [b, s] i32, this rank's rows
  Tensor target;      // [N] i32, N = b * s
  Tensor keep;        // [N] f32, the LM loss's row weights (already over the step's target count)
  Tensor row_weight;  // [b, s] f32, the indexer KL's loss-row weights of this rank's rows
  DocLayout layout;   // the whole batch's layout ([b, S]) with its device form
};

// The LM targets `ahead` tokens on (model.h's count_lm_targets; ahead 1: the LM loss's, k + 2: the
// multi-token-prediction depth k's): row n = r s + t of the host ids [b, s] predicts ids[n + ahead]
// when t is no padding, t + ahead lies in t's document and that token is not pad: target [b s] i32
// (0 elsewhere), keep [b s] 1 or 0.
void lm_targets_ahead(const int32_t* ids, const DocLayout& layout, int64_t pad, int64_t ahead,
                      std::vector<int32_t>& target, std::vector<float>& keep);

// The micro-batch on the model's device (DeviceBatch); `lm_targets` and `valid_rows` are the
// step's global counts (0: this batch's own). Checks the token ids against the vocabulary.
DeviceBatch device_batch(const Model& m, const Batch& batch, const Comm& cp, int64_t lm_targets, int64_t valid_rows);

}  // namespace hmla
