// The CPU backend's kernels, all declared here (f32, row-major, host pointers). The backend
// (backend.cpp) calls them with validated params; tests and benches may call them directly.
// sgemm: OpenBLAS (OpenMP build) when configured, else the built-in kernel of gemm.cpp; called
// inside an OpenMP parallel region a product runs on the calling thread, so results depend only
// on the inputs (and the BLAS build), never on scheduling. Gradients follow hmla/ops/nn.h: weight
// gradients (dW, dw, db, dE) are added into, activation gradients written.
#pragma once
#include <cstdint>

#include "hmla/ops/attention.h"
#include "hmla/ops/indexer.h"
#include "hmla/ops/nn.h"
#include "hmla/ops/optim.h"
#include "hmla/ops/sparse_attention.h"

namespace hmla::cpu {

using hmla::RopeLayout;
using hmla::Trans;

// ---- products (gemm.cpp) -----------------------------------------------------------------------
// C = alpha * op(A) op(B) + beta * C, op(X) = X or X^T.
void sgemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// Whether sgemm runs on OpenBLAS (for reports).
bool sgemm_uses_blas();

// ---- linear, norms, RoPE, SwiGLU, cross-entropy (nn.cpp) ---------------------------------------
// y[N, out] = x[N, in] W^T, W [out, in]; ldx/ldy are row strides of x and y.
void linear_fwd(float* y, int64_t ldy, const float* x, int64_t ldx, const float* W, int64_t N,
                int64_t in, int64_t out);
// dW [out, in] += dy^T x; dx [N, in] (+)= dy W: `beta` 0 overwrites, 1 accumulates; dx may be null.
void linear_bwd(float* dx, int64_t lddx, float beta, float* dW, const float* dy, int64_t lddy,
                const float* x, int64_t ldx, const float* W, int64_t N, int64_t in, int64_t out);

// y = x * rstd * w per row, rstd = 1 / sqrt(mean(x^2) + eps) saved [N]. x, y have row stride ld*.
void rmsnorm_fwd(float* y, int64_t ldy, float* rstd, const float* x, int64_t ldx, const float* w,
                 int64_t N, int64_t D, float eps);
// dx (overwrite, stride lddx), dw [D] += the rows' sum, rows in order.
void rmsnorm_bwd(float* dx, int64_t lddx, float* dw, const float* dy, int64_t lddy, const float* x,
                 int64_t ldx, const float* w, const float* rstd, int64_t N, int64_t D);

// y = (x - mean) * rstd * w + b per row (LayerNorm); mean and rstd saved [N].
void layernorm_fwd(float* y, float* mean, float* rstd, const float* x, const float* w, const float* b,
                   int64_t N, int64_t D, float eps);
// dx (overwrite), dw and db [D] += the rows' sums, rows in order. Rows contiguous.
void layernorm_bwd(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                   const float* mean, const float* rstd, int64_t N, int64_t D);

// RoPE in place on `heads` slices of width Dr per row, pair i rotated by pos(t) * inv_freq[i]. cos/sin are [s, Dr/2] tables (already multiplied by the
// attention factor); row n of the N = b * s rows sits at position n % s. x + n * ld + h * hstride
// is the slice of head h. `transpose` applies the transposed map (the backward; with the
// attention factor folded into cos/sin the map is a scaled rotation, not orthogonal).
void rope(RopeLayout layout, float* x, int64_t ld, int64_t hstride, int64_t heads, int64_t N, int64_t s,
          int64_t Dr, const float* cos, const float* sin, bool transpose);

// dst = src converted element by element (ConvertParams: f32, bf16, or one dtype copied).
void convert(const ConvertParams& p);

// SwiGLU: y = silu(g) * u elementwise over n values; backward writes dg and du (overwrite).
void swiglu_fwd(float* y, const float* g, const float* u, int64_t n);
void swiglu_bwd(float* dg, float* du, const float* dy, const float* g, const float* u, int64_t n);

// Cross-entropy of logits [N, V] against targets [N] with row weights w [N] (0 skips a row):
// returns sum_n w[n] * (logsumexp(logits[n]) - logits[n, target[n]]) and, when dlogits is not
// null, writes its gradient w[n] * (softmax(logits[n]) - onehot(target[n])) (rows with w = 0
// get 0). Rows are independent; the sum runs in row order.
double cross_entropy(const float* logits, const int32_t* target, const float* w, int64_t N, int64_t V,
                     float* dlogits, double init = 0);

// ---- embedding, element-wise, optimizer steps (nn.cpp, optim.cpp): the params of hmla/ops ----------
void embedding_fwd(const EmbeddingParams& p);
void embedding_bwd(const EmbeddingParams& p);  // adds into dE, rows in token order
void axpy(const AxpyParams& p);
double sum_squares(const SumSquaresParams& p);
void adamw_update(const AdamWParams& p);
void muon_momentum(const MuonParams& p);
void muon_update(const MuonParams& p);

// ---- attention (attn_dense_fwd.cpp, attn_dense_bwd.cpp, attn_sparse.cpp) -----------------------
void attn_dense_fwd(const AttnDenseParams& p);
void attn_dense_bwd(const AttnDenseParams& p);
void attn_sparse_check_table(const AttnSparseParams& p);
void attn_sparse_fwd(const AttnSparseParams& p);
void attn_sparse_bwd(const AttnSparseParams& p);

// ---- the indexer (indexer_topk.cpp, indexer_kl.cpp) --------------------------------------------
void indexer_topk(const IndexerParams& p);
void indexer_select(const IndexerParams& p);
double indexer_kl_dense(const IndexerParams& p);   // returns kl_sum
double indexer_kl_sparse(const IndexerParams& p);

}  // namespace hmla::cpu
