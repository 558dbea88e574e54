// The lightning indexer's scores, top-k selection and KL losses (DESIGN.md sections 5 and 6).
// Letters: b batch, s rows, HI index heads, DI index head width, H attention heads, K index_topk,
// W index_window.
//
//   I(t, j) = sum_h w[t, h] * relu(qI[t, h] . kI[j])     for j in A(t)
//   selection: S(t) = the K keys of R(t) = A(t) minus its last W keys with the largest I (ties to
//   the smaller j); idx[t] = S(t) by descending I (equal I by ascending j), then the window keys
//   ascending, then -1.
//   KL: P = mean_h softmax_C(l_h), Q = softmax_C(I) over the candidates C(t) (A(t) for the dense
//   KL, S(t) for the sparse one); kl(t) = sum_j P (log P - log Q); dI = coeff * rw[t] * (Q - P)
//   with rw[t] = mask[t] / valid_rows, chained into dqI, dkI and dw.
#pragma once
#include <cstdint>

#include "hmla/core/layout.h"
#include "hmla/core/tensor.h"
#include "hmla/ops/index_table.h"

namespace hmla {

// The backends' params structs (FlashAttention's one struct per kernel family), filled and
// validated by the entry points below: pointers on the backend's device, strides in elements
// where a tensor may be strided. Query rows [q_row0, q_row0 + sq) of the s key rows.
struct IndexerScoreParams {
  DType dtype = DType::f32;  // of qI and kI; w, scores and the KLs' other tensors (but q, k) are f32
  int64_t b = 0, sq = 0, s = 0, HI = 0, DI = 0, q_row0 = 0;
  const void* qI = nullptr;            // [b, sq, HI, DI] contiguous (null for select)
  const void* kI = nullptr;            // [b, s, DI] contiguous (null for select)
  const float* w = nullptr;            // [b, sq, HI] contiguous (null for select)
  const int32_t* doc_start = nullptr;  // [b, s]
  int64_t K = 0, W = 0;                // top-k slots, then window slots, per table row
};

// indexer_topk (the scores from qI, kI, w) and indexer_select (from given scores).
struct IndexerTopkParams : IndexerScoreParams {
  const float* scores = nullptr;  // select only: [b, sq, s], row r holding I(q_row0 + r, j); null for topk
  int32_t* table = nullptr;       // [b, sq, K + W] output
};

// The dense and sparse KLs.
struct IndexerKlParams : IndexerScoreParams {
  int64_t H = 0, Hkv = 0, Dqk = 0;
  DType qk_dtype = DType::f32;  // of q and k (f32 or bf16; the CPU: f32)
  const void* q = nullptr;      // [b, sq, H, Dqk], last dim contiguous
  int64_t q_bstride = 0, q_rstride = 0, q_hstride = 0;
  const void* k = nullptr;  // [b, s, Hkv, Dqk], last dim contiguous
  int64_t k_bstride = 0, k_rstride = 0, k_hstride = 0;
  float scale = 0.f, coeff = 0.f;
  const float* lse_c = nullptr;       // [b, H, sq] or null (dense KL: computed)
  const float* row_weight = nullptr;  // [b, sq]
  const int32_t* topk = nullptr;      // sparse only: [b, sq, K + W], slots < K the candidates
  float* dqI = nullptr;               // [b, sq, HI, DI] output
  float* dkI = nullptr;               // [b, s, DI] output
  float* dw = nullptr;                // [b, sq, HI] output
  double* kl_acc = nullptr;           // [1] on the device: sum_t rw[t] kl(t) (from 0, rows in order) added
};

// Query rows may be a slice of the key rows (context parallelism): qI, w and everything per
// query (the table, q, lse_c, row_weight, dqI, dw) have sq rows at global positions
// [q_row0, q_row0 + sq); kI, k and dkI have the s key rows the layout covers. Table entries are
// global positions.
struct IndexerScores {
  Tensor qI;  // [b, sq, HI, DI] contiguous, rope applied
  Tensor kI;  // [b, s, DI] contiguous, rope applied
  Tensor w;   // [b, sq, HI] contiguous, head weights (scales folded in)
  const DocLayout* layout = nullptr;  // [b, s]
  int64_t q_row0 = 0;
};

// The [b, sq, K + W] i32 selection table. Costs O(s * |A|) time, O(threads * s) scratch.
// CPU: f32 qI, kI, w. CUDA: bf16 qI and kI, f32 w (HI and DI multiples of 16, K <= 2048); the table
// is on the inputs' device.
Tensor indexer_topk(const IndexerScores& sc, int64_t K, int64_t W);
// Into a given [b, sq, K + W] i32 table on the inputs' device (validated).
void indexer_topk(const IndexerScores& sc, int64_t K, int64_t W, const Tensor& table);

// The same selection from given scores: scores [b, sq, s] f32, row r holding I(q_row0 + r, j) for
// every key j (only j in R(t) are read). Both backends return the same table bit for bit on the
// same scores (ties to the smaller j; -0 equals +0).
Tensor indexer_select(const Tensor& scores, const DocLayout& layout, int64_t q_row0, int64_t K, int64_t W);

// The KLs' qI, kI (one dtype) and q, k (one dtype) are f32 or bf16 (the CPU: f32). CUDA runs the
// dense KL on all-bf16 inputs on the tensor cores (f32 scores from the bf16 values; the gradient
// products read dI rounded to bf16: docs/indexer.md); every other mix in f32 math, widening bf16
// exactly (the same bits as f32 tensors holding the same values). Every other input and the
// gradients are f32.
struct IndexerKlInputs {
  IndexerScores sc;
  Tensor q;          // [b, sq, H, Dqk] attention queries (detached; last dim contiguous)
  Tensor k;          // [b, s, Hkv, Dqk] attention keys (detached), q's dtype
  float scale = 0;   // the attention's scale
  Tensor lse_c;      // [b, H, sq] optional: logsumexp of the logits over the candidates, when the
                     // attention already has it (its lse without sink or window); else computed
  Tensor row_weight; // [b, sq] f32: mask[t] / valid_rows (0 drops a row)
  float coeff = 0.01f;
  Tensor topk;       // sparse KL only: [b, sq, K + W] i32 table; slots < K are the candidates
  int64_t K = 0;
  TableOrigin topk_origin = TableOrigin::external;  // own: indexer_topk's table, not checked (index_table.h)
  Tensor kl_acc;     // optional f64 [1] on qI's device (a stats slot): kl_sum is ADDED into it on
                     // the device and the result's kl_sum and loss are NaN (nothing is read back)
};

struct IndexerKlResult {
  double kl_sum = 0;  // sum_t rw[t] * kl(t), without coeff (logged as indexer_kl)
  double loss = 0;    // coeff * kl_sum
  Tensor dqI, dkI, dw;  // gradients of loss, shapes of qI, kI, w
};

// Dense KL over A(t), fused: lseI (and lseC when absent) in a first pass over key tiles, then
// P, Q, the loss and dI tile by tile, straight into dqI/dkI/dw. Nothing of size s*s.
IndexerKlResult indexer_kl_dense(const IndexerKlInputs& in);
// Sparse KL over the candidates S(t) listed in `topk`.
IndexerKlResult indexer_kl_sparse(const IndexerKlInputs& in);

}  // namespace hmla

// The family's backend entries (op_list.h); the KLs add kl_sum (without coeff) into *kl_acc and
// overwrite dqI, dkI, dw with the loss's gradients.
#define HMLA_INDEXER_PARAMS(X) X(IndexerTopkParams) X(IndexerKlParams)
#define HMLA_INDEXER_OPS(X)                         \
  X(void, indexer_topk, IndexerTopkParams)          \
  X(void, indexer_select, IndexerTopkParams)        \
  X(void, indexer_kl_dense, IndexerKlParams)        \
  X(void, indexer_kl_sparse, IndexerKlParams)
