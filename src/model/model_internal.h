// What the model's files share, private to src/model: the LM head's chunk size (model.cpp,
// model_tables.cpp), the micro-batch as the step's kernels read it (model_batch.cpp builds it,
// model.cpp's forward and backward read it) and a saved tensor's slot (mla_layer.cpp, indexer.cpp).
#pragma once
#include <algorithm>
#include <cstdint>
#include <map>
#include <vector>

#include "hmla/core/error.h"
#include "hmla/core/layout.h"
#include "hmla/core/tensor.h"
#include "hmla/dist/comm.h"
#include "hmla/dist/cp.h"
#include "hmla/model/model.h"
#include "hmla/ops/compress.h"

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
// A DeepSeek-V4 compress rate's entries (compressed_entries of the whole layout) and what the
// layers read of them: first [b, n] on the host (entries.first) and on the device (first), the
// window's last row and its document's start (attn_compressed's ent_last / ent_doc, -1: a padding
// slot), and each entry's RoPE row (its window's first position; 0 for padding slots).
struct V4BatchEntries {
  CompressedEntries entries;
  Tensor first, last, doc, rope_row;  // [b, n] i32 each (rope_row [b * n]) on the model's device
};

// A compress rate's V4BatchEntries of `layout` on the host (v4_batch.cpp).
V4BatchEntries v4_entry_tables(const DocLayout& layout, int64_t rate);

struct DeviceBatch {
  Tensor ids;         // [b, s] i32, this rank's rows
  Tensor target;      // [N] i32, N = b * s
  Tensor keep;        // [N] f32, the LM loss's row weights (already over the step's target count)
  Tensor row_weight;  // [b, s] f32, the indexer KL's loss-row weights of this rank's rows
  DocLayout layout;   // the whole batch's layout ([b, S]) with its device form
  // DeepSeek-V4 stacks (v4_batch.cpp), in the same upload: the entries per compress rate, the hash
  // layers' experts per layer ([N, k] i32, tid2eid's rows of the ids), and per MTP depth k its
  // input ids (the token k + 1 ahead in the document, else pad: [b, s]), targets (k + 2 ahead: [N]
  // i32) and their 0/1 weights ([N] f32; v4_mtp_step scales them by the step's counts), and the
  // whole batch's count of those targets (every rank's rows).
  std::map<int64_t, V4BatchEntries> v4_entries;
  std::map<int64_t, Tensor> hash_experts;
  std::vector<Tensor> mtp_ids, mtp_target, mtp_keep;
  std::vector<int64_t> mtp_count;
};

// The host words of a micro-batch's one upload (4 bytes each: i32, or f32 bits): add() appends a
// piece and returns where it starts; after upload(), view() is a piece of the device copy.
class BatchWords {
 public:
  int64_t add(const void* src, int64_t n);
  void upload(Device dev);
  Tensor view(int64_t at, const Shape& shape, DType dt = DType::i32) const;

 private:
  std::vector<int32_t> host_;
  Tensor all_;
};

// A DeepSeek-V4 model's part of the batch (v4_batch.cpp): add_v4_words puts its words into w (the
// rows of shard sh), then v4_batch_views fills d's V4 fields from the uploaded copy.
class V4BatchWords {
 public:
  V4BatchWords(const Model& m, const Batch& batch, const RowShard& sh, BatchWords& w);
  void views(const BatchWords& w, DeviceBatch& d) const;

 private:
  struct Piece {
    int64_t key = 0, at = 0;
    Shape shape;
    DType dt = DType::i32;
  };
  std::vector<std::pair<int64_t, CompressedEntries>> entries_;
  std::vector<Piece> first_, last_, doc_, rope_, hash_, mtp_ids_, mtp_target_, mtp_keep_;
  std::vector<int64_t> mtp_count_;
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
