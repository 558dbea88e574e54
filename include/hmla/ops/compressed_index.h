// DeepSeek-V4's CSA lightning indexer over compressed entries, forward (DESIGN.md section 10;
// docs/deepseek_v4_math.md section 6, "Indexer" and "Selection"; docs/v4_attention.md): the scores
// of a query row's visible entries and their top-k. Letters: b batch, s rows, nI index heads, dI
// index head width, n_e entries per batch row, K selected slots per query.
//
// Context parallelism (DESIGN.md section 8): the query-side tensors (qI, w, and the KLs' q, lse,
// row_weight, topk and their outputs dqI, dw, idx, scores) may hold the sq rows [q_row0, q_row0 + sq)
// of the layout's s rows (q_row0 = 0, sq = s: every row); kI, ent and dkI cover every entry. The
// positions t below are global (the layout's).
//
//   I(t, e) = sum_h w[t, h] * relu(qI[t, h] . kI[e])   for the entries e visible to t:
//   ent_doc[e] == doc_start[t] and ent_last[e] <= t (attn_compressed's contract, so they are one
//   contiguous range of entries, found per query by binary search).
// Accumulation order, the same on every backend (the CPU's and CUDA's scores agree bit for bit on
// the same inputs, so their tables do too): per head h, d = 0 then d = fmaf(qI[t, h, c], kI[e, c], d)
// for c = 0 .. dI-1; r = d > 0 ? d : +0; then I = 0 and I = fmaf(w[t, h], r, I) for h = 0 .. nI-1.
// Each step is one explicit fused multiply-add, which no compiler contraction can change.
// That order (and the bits) holds for f32 qI and kI. bf16 qI and kI (CUDA; the CPU's plans take f32)
// at nI and dI multiples of 16 run on the tensor cores (src/cuda/indexer_scores.cuh: f32 sums in an
// order of their own, within twice the f32 bound of tests/common/cases_compressed_index.h); at other
// widths the SIMT kernels widen them exactly and keep the order above.
// Selection: idx[t] = the visible entries by descending I, equal I (-0 equals +0) by ascending e,
// the first min(K, visible) of them, then -1; padding rows (doc_start > t): all -1. A NaN score
// (a NaN input) is not ordered: such a row's table is unspecified. The selection never builds an
// [s, n_e] tensor: per query row the visible range's scores (scratch O(threads n_e)), then a
// partial selection. Forward only: the indexer's gradient comes from the KL.
//
// The KL (docs/csa_indexer_kl.md, "full CSA denominator"): per query row t with candidates C(t)
// (dense: every visible entry; sparse: the visible entries among topk[t]), heads h < H of the
// attention's logits z_h(t, e) = scale q_h(t) . ent[e] and its saved lse_h(t) (window, attended
// entries and sink):
//   P(t, e) = sum_h exp(z_h - lse_h - log Z),  log Z = logsumexp_h(lseE_h - lse_h),
//   lseE_h = logsumexp_{e in C} z_h (computed by the op);  Q = softmax_C(I);
//   kl(t) = sum_C P (log P - log Q);  loss = coeff sum_t rw[t] kl(t);  dI = coeff rw (Q - P),
// chained through I into dqI, dkI and dw. A row with no candidate, or every lse_h = +inf, has kl 0
// and no gradient. Fused: nothing [s, n_e]; workspace O(b s) plus per-thread tiles (the CPU's sparse
// KL also two [b, sq, K] i32 tables: its rows' candidate sets and their inverse, entry -> rows).
#pragma once
#include <cstdint>

#include "hmla/core/layout.h"
#include "hmla/core/tensor.h"

namespace hmla {

// The backends' params struct: pointers on the backend's device, filled and validated by the entry
// points below. Every tensor is contiguous f32 (i32 for the metadata and the table) but qI and kI,
// which are `dtype` (f32 or bf16; the CPU backend's plans take f32 only).
struct CompressedIndexParams {
  DType dtype = DType::f32;              // of qI and kI
  int64_t b = 0, s = 0, nI = 0, dI = 0;  // s: the layout's rows
  int64_t sq = 0, q_row0 = 0;            // query rows and the global position of the first
  int64_t n_e = 0;                     // entries per batch row (0: every row's table is -1)
  int64_t K = 0;                       // topk: slots per query row (>= 1); scores: 0
  const void* qI = nullptr;            // [b, sq, nI, dI] dtype
  const void* kI = nullptr;            // [b, n_e, dI] dtype
  const float* w = nullptr;            // [b, sq, nI]
  const int32_t* ent_last = nullptr;   // [b, n_e] row of the entry's window's last token
  const int32_t* ent_doc = nullptr;    // [b, n_e] start row of the entry's document; -1: unused slot
  const int32_t* doc_start = nullptr;  // [b, s]
  int32_t* idx = nullptr;              // topk: [b, sq, K] output
  float* scores = nullptr;             // scores: [b, sq, n_e] output (-inf where not visible)
};

struct CompressedIndexInputs {
  Tensor qI;        // [b, sq, nI, dI] f32 or bf16 contiguous (the indexer queries, RoPE applied): rows [q_row0, q_row0 + sq)
  Tensor kI;        // [b, n_e, dI] qI's dtype contiguous (the indexer compressor's entries, normed and roped)
  Tensor w;         // [b, sq, nI] f32 contiguous: per-head weights with BOTH scales folded in (weights_proj(x) * nI^-0.5 * dI^-0.5)
  Tensor ent_last;  // [b, n_e] i32: row of the entry's window's last token (attn_compressed's metadata contract)
  Tensor ent_doc;   // [b, n_e] i32: start row of the entry's document; -1 unused slot
  const DocLayout* layout = nullptr;
  int64_t q_row0 = 0;  // global position of qI's first row (q_row0 + sq <= s)
};

// idx [b, sq, K] i32 on the inputs' device: per query row t the visible entries (same contract as
// attn_compressed: ent_doc[e] == doc_start[t] and ent_last[e] <= t) of largest
// I(t, e) = sum_h w[t, h] * relu(qI[t, h] . kI[e]), by descending I, equal I by ascending e; fewer
// than K visible: the rest -1. Padding rows (doc_start > t): all -1.
Tensor compressed_index_topk(const CompressedIndexInputs& in, int64_t K);
// The scores themselves, for tests and for the KL of the next issue: scores [b, s, n_e] f32 of the
// same I (-inf where not visible; [b, sq, n_e] with query rows at an offset). Tests only (it is the [s, n_e] tensor the model never builds).
Tensor compressed_index_scores(const CompressedIndexInputs& in);

// The KLs' params: the scores' fields (K: the table's slots, sparse only) and the attention's.
struct CompressedIndexKlParams : CompressedIndexParams {
  int64_t H = 0, d = 0;
  DType qk_dtype = DType::f32;  // of q and ent (f32 or bf16; the CPU: f32)
  const void* q = nullptr;      // [b, sq, H, d], last dim contiguous
  int64_t q_bstride = 0, q_rstride = 0, q_hstride = 0;
  const void* ent = nullptr;           // [b, n_e, d]
  const float* lse = nullptr;          // [b, H, sq]: the attention's saved lse (+inf: padding rows)
  const float* row_weight = nullptr;   // [b, sq]
  const int32_t* doc_end = nullptr;    // [b, s] exclusive
  const int32_t* topk = nullptr;       // sparse only: [b, sq, K] (-1, out of range, invisible: none; repeats once)
  float scale = 0.f, coeff = 0.f;
  float* dqI = nullptr;      // [b, sq, nI, dI] output
  float* dkI = nullptr;      // [b, n_e, dI] output (this call's query rows' share)
  float* dw = nullptr;       // [b, sq, nI] output
  double* kl_acc = nullptr;  // [1] on the device: sum_t rw[t] kl(t) (rows in order) added
};

struct CompressedIndexKlInputs {
  CompressedIndexInputs sc;  // qI [b, sq, nI, dI], kI [b, n_e, dI], w [b, sq, nI] (scales folded), ent_last, ent_doc, layout
  Tensor q;                  // [b, sq, H, d] f32 or bf16 attention queries (detached; last dim contiguous; may be strided like attn_compressed's q)
  Tensor ent;                // [b, n_e, d] q's dtype contiguous: the attention's compressed entries (detached)
  Tensor lse;                // [b, H, sq] f32: attn_compressed_fwd's saved lse (window + attended entries + sink; +inf on padding rows)
  float scale = 0;           // the attention's scale (on q . ent)
  Tensor row_weight;         // [b, sq] f32: mask[t] / valid_rows
  float coeff = 0.01f;
  Tensor topk;               // sparse KL only (the dense KL ignores it): [b, sq, K] i32, compressed_index_topk's table (-1 pads)
  Tensor kl_acc;             // optional f64 [1] on the inputs' device: kl_sum ADDED into it; then the result's kl_sum/loss are NaN
};

struct CompressedIndexKlResult {
  double kl_sum = 0;    // sum_t rw[t] kl(t), without coeff
  double loss = 0;      // coeff * kl_sum
  Tensor dqI, dkI, dw;  // gradients of loss; shapes of qI, kI, w (f32, written, not added)
};

// C(t) = every visible entry (dsa_warmup; the attention ran dense, so lse is over them all).
CompressedIndexKlResult compressed_index_kl_dense(const CompressedIndexKlInputs& in);
// C(t) = the visible entries among topk[t] (dsa_sparse; the attention ran selected on the same
// table). The table's order changes nothing: a row's candidates are a set.
CompressedIndexKlResult compressed_index_kl_sparse(const CompressedIndexKlInputs& in);

}  // namespace hmla

// The family's backend entries (op_list.h).
#define HMLA_COMPRESSED_INDEX_PARAMS(X) X(CompressedIndexParams) X(CompressedIndexKlParams)
#define HMLA_COMPRESSED_INDEX_OPS(X)                             \
  X(void, compressed_index_topk, CompressedIndexParams)          \
  X(void, compressed_index_scores, CompressedIndexParams)        \
  X(void, compressed_index_kl_dense, CompressedIndexKlParams)    \
  X(void, compressed_index_kl_sparse, CompressedIndexKlParams)
