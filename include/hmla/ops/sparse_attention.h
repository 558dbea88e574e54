// Sparse latent MQA attention (DESIGN.md section 4, FlashMLA conventions): each query row t
// attends over the keys listed in idx[t, 0..K+W) (-1 = no key; duplicates rejected), all H
// heads sharing one (Rkv + Dr)-wide key per position whose first Dv = Rkv channels are the value.
//   l_h(t, j) = scale * q_h(t) . kv(j);  P_h = softmax over the listed j (+ exp(sink_h) in the
//   denominator);  out_h(t) = sum_j P_h(t, j) kv(j)[:Dv];  lse_h(t) saved.
// With K > 0 the forward also saves lse_c: the logsumexp over the first K slots only, without the
// sink (the indexer KL's lseC when a window or a sink makes it differ from lse).
// Rows without a listed key: out = 0, lse = lse_c = +inf, zero gradients.
// Cost O(s * (K + W) * H * (Rkv + Dr)); -1 slots cost nothing. The backward writes dq, dkv (the
// key's and the value's gradient in one tensor) and ADDS into dsink (a parameter's gradient:
// hmla/ops/nn.h's convention): the given tensor, else zeros.
#pragma once
#include <cstdint>

#include "hmla/core/tensor.h"
#include "hmla/ops/index_table.h"

namespace hmla {

// The backends' params struct (FlashAttention's one struct per kernel family): pointers on the
// backend's device with their strides in elements, filled and validated by the entry points below.
// The query rows may be a slice of the key rows (context parallelism): q, idx and every per-query
// tensor have sq rows, kv and dkv have skv >= sq rows; idx holds key positions in [0, skv).
struct AttnSparseParams {
  DType dtype = DType::f32;  // of q, kv, out, dout, dq, dkv
  int64_t b = 0, sq = 0, skv = 0, H = 0, Dqk = 0, Dv = 0;
  int64_t KW = 0;  // slots per row of idx
  int64_t K = 0;   // slots [0, K) are the candidates (lse_c); 0: no lse_c
  float scale = 0.f;
  const void* q = nullptr;  // [b, sq, H, Dqk], last dim contiguous
  int64_t q_bstride = 0, q_rstride = 0, q_hstride = 0;
  const void* kv = nullptr;        // [b, skv, Dqk] contiguous
  const int32_t* idx = nullptr;    // [b, sq, KW] contiguous
  const float* sink = nullptr;     // [H] or null
  void* out = nullptr;             // [b, sq, H, Dv] contiguous
  float* lse = nullptr;            // [b, H, sq]
  float* lse_c = nullptr;          // [b, H, sq], forward with K > 0 only
  // Backward only.
  const void* dout = nullptr;  // [b, sq, H, Dv] contiguous
  void* dq = nullptr;          // [b, sq, H, Dqk] contiguous
  void* dkv = nullptr;         // [b, skv, Dqk] contiguous
  float* dsink = nullptr;      // [H] or null
};

// The Tensor inputs of the entry points: q, idx and every per-query output have s rows, kv and
// dkv have skv >= s rows.
struct AttnSparseInputs {
  Tensor q;      // [b, s, H, Dqk], last dim contiguous
  Tensor kv;     // [b, skv, Dqk] contiguous: the shared key; value = its first Dv channels
  int64_t Dv = 0;
  Tensor idx;    // [b, s, KW] i32 contiguous
  int64_t K = 0; // slots [0, K) are the top-k candidates (lse_c); 0: no lse_c
  Tensor sink;   // [H] f32, optional
  float scale = 0.f;
  TableOrigin idx_origin = TableOrigin::external;  // own: indexer_topk's table, not checked (index_table.h)
};

struct AttnSparseSaved {
  Tensor out;    // [b, s, H, Dv]
  Tensor lse;    // [b, H, s]
  Tensor lse_c;  // [b, H, s], only with K > 0
};

struct AttnSparseGrads {
  Tensor dq;     // [b, s, H, Dqk]
  Tensor dkv;    // [b, skv, Dqk]
  Tensor dsink;  // [H], with a sink
};

AttnSparseSaved attn_sparse_fwd(const AttnSparseInputs& in);
// Into given outputs (validated: contiguous, the shapes above; lse_c only with K > 0).
void attn_sparse_fwd(const AttnSparseInputs& in, const AttnSparseSaved& saved);
AttnSparseGrads attn_sparse_bwd(const AttnSparseInputs& in, const AttnSparseSaved& saved, const Tensor& dout,
                                const Tensor& dsink = {});

}  // namespace hmla

// The family's backend entries (op_list.h); check_table throws ShapeError unless every entry is -1
// or in [0, skv) and no row lists a key twice.
#define HMLA_ATTN_SPARSE_PARAMS(X) X(AttnSparseParams)
#define HMLA_ATTN_SPARSE_OPS(X)                      \
  X(void, attn_sparse_check_table, AttnSparseParams) \
  X(void, attn_sparse_fwd, AttnSparseParams)         \
  X(void, attn_sparse_bwd, AttnSparseParams)
