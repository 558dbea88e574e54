// The CPU backend's kernels, all declared here (f32, row-major, host pointers). The backend
// (backend.cpp) calls them with validated params; tests and benches may call them directly.
// sgemm: OpenBLAS (OpenMP build) when configured, else the built-in kernel of gemm.cpp; called
// inside an OpenMP parallel region a product runs on the calling thread, so results depend only
// on the inputs (and the BLAS build), never on scheduling. Gradients follow hmla/ops/nn.h: weight
// gradients (dW, dw, db, dE) are added into, activation gradients written.
#pragma once
#include <cstdint>

#include "hmla/ops/op_list.h"

namespace hmla::cpu {

using hmla::RopeLayout;
using hmla::Trans;

// ---- products (gemm.cpp) -----------------------------------------------------------------------
// C = alpha * op(A) op(B) + beta * C, op(X) = X or X^T.
void sgemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// Whether sgemm runs on OpenBLAS (for reports).
bool sgemm_uses_blas();

// ---- the backend's entries: one kernel per op of op_list.h, taking the op's params -------------
// products: gemm.cpp (a sgemm per batch matrix); norms, RoPE, SwiGLU, embedding, cross-entropy,
// axpy, convert: nn.cpp; sum of squares and the optimizer steps: optim.cpp; dense attention:
// attn_dense_fwd.cpp, attn_dense_bwd.cpp; sparse attention: attn_sparse.cpp; the indexer:
// indexer_topk.cpp, indexer_kl.cpp (the KLs return kl_sum). Contracts: the params' headers.
HMLA_OP_LIST(HMLA_DECLARE_KERNEL)

// ---- the backend's plans: one per params struct, in the family's kernel file ------------------
// The CPU runs f32 (Variant::cpu) wherever the plan says so; bf16 activations are CUDA's.
HMLA_PARAMS_LIST(HMLA_DECLARE_PLAN)
inline bool f32(DType t) { return t == DType::f32; }
// An f32 input a params struct holds as const void* (its plan took f32 only).
inline const float* f32p(const void* v) { return static_cast<const float*>(v); }

}  // namespace hmla::cpu
