// DeepSeek-V4's CSA lightning indexer over compressed entries, forward (DESIGN.md section 10;
// docs/deepseek_v4_math.md section 6, "Indexer" and "Selection"; docs/v4_attention.md): the scores
// of a query row's visible entries and their top-k. Letters: b batch, s rows, nI index heads, dI
// index head width, n_e entries per batch row, K selected slots per query.
//
//   I(t, e) = sum_h w[t, h] * relu(qI[t, h] . kI[e])   for the entries e visible to t:
//   ent_doc[e] == doc_start[t] and ent_last[e] <= t (attn_compressed's contract, so they are one
//   contiguous range of entries, found per query by binary search).
// Accumulation order, the same on every backend (the CPU's and CUDA's scores agree bit for bit on
// the same inputs, so their tables do too): per head h, d = 0 then d = fmaf(qI[t, h, c], kI[e, c], d)
// for c = 0 .. dI-1; r = d > 0 ? d : +0; then I = 0 and I = fmaf(w[t, h], r, I) for h = 0 .. nI-1.
// Each step is one explicit fused multiply-add, which no compiler contraction can change.
// Selection: idx[t] = the visible entries by descending I, equal I (-0 equals +0) by ascending e,
// the first min(K, visible) of them, then -1; padding rows (doc_start > t): all -1. A NaN score
// (a NaN input) is not ordered: such a row's table is unspecified. The selection never builds an
// [s, n_e] tensor: per query row the visible range's scores (scratch O(threads n_e)), then a
// partial selection. Forward only: the indexer's gradient comes from the KL.
#pragma once
#include <cstdint>

#include "hmla/core/layout.h"
#include "hmla/core/tensor.h"

namespace hmla {

// The backends' params struct: pointers on the backend's device, filled and validated by the entry
// points below. Every tensor is contiguous f32 (i32 for the metadata and the table).
struct CompressedIndexParams {
  int64_t b = 0, s = 0, nI = 0, dI = 0;
  int64_t n_e = 0;                     // entries per batch row (0: every row's table is -1)
  int64_t K = 0;                       // topk: slots per query row (>= 1); scores: 0
  const float* qI = nullptr;           // [b, s, nI, dI]
  const float* kI = nullptr;           // [b, n_e, dI]
  const float* w = nullptr;            // [b, s, nI]
  const int32_t* ent_last = nullptr;   // [b, n_e] row of the entry's window's last token
  const int32_t* ent_doc = nullptr;    // [b, n_e] start row of the entry's document; -1: unused slot
  const int32_t* doc_start = nullptr;  // [b, s]
  int32_t* idx = nullptr;              // topk: [b, s, K] output
  float* scores = nullptr;             // scores: [b, s, n_e] output (-inf where not visible)
};

struct CompressedIndexInputs {
  Tensor qI;        // [b, s, nI, dI] f32 contiguous (the indexer queries, RoPE applied)
  Tensor kI;        // [b, n_e, dI] f32 contiguous (the indexer compressor's entries, normed and roped)
  Tensor w;         // [b, s, nI] f32 contiguous: per-head weights with BOTH scales folded in (weights_proj(x) * nI^-0.5 * dI^-0.5)
  Tensor ent_last;  // [b, n_e] i32: row of the entry's window's last token (attn_compressed's metadata contract)
  Tensor ent_doc;   // [b, n_e] i32: start row of the entry's document; -1 unused slot
  const DocLayout* layout = nullptr;
};

// idx [b, s, K] i32 on the inputs' device: per query row t the visible entries (same contract as
// attn_compressed: ent_doc[e] == doc_start[t] and ent_last[e] <= t) of largest
// I(t, e) = sum_h w[t, h] * relu(qI[t, h] . kI[e]), by descending I, equal I by ascending e; fewer
// than K visible: the rest -1. Padding rows (doc_start > t): all -1.
Tensor compressed_index_topk(const CompressedIndexInputs& in, int64_t K);
// The scores themselves, for tests and for the KL of the next issue: scores [b, s, n_e] f32 of the
// same I (-inf where not visible). Tests only (it is the [s, n_e] tensor the model never builds).
Tensor compressed_index_scores(const CompressedIndexInputs& in);

}  // namespace hmla

// The family's backend entries (op_list.h).
#define HMLA_COMPRESSED_INDEX_PARAMS(X) X(CompressedIndexParams)
#define HMLA_COMPRESSED_INDEX_OPS(X)                      \
  X(void, compressed_index_topk, CompressedIndexParams)   \
  X(void, compressed_index_scores, CompressedIndexParams)
