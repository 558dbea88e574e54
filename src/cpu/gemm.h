// Row-major single-precision products for the CPU kernels: C = alpha * op(A) op(B) + beta * C,
// op(X) = X or X^T. OpenBLAS (OpenMP build) when configured, else the built-in kernel below.
// Called inside an OpenMP parallel region a product runs on the calling thread, so results
// depend only on the inputs (and the BLAS build), never on scheduling.
#pragma once
#include <cstdint>

namespace hmla::cpu {

enum class Trans : uint8_t { no, yes };

void sgemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// Whether sgemm runs on OpenBLAS (for reports).
bool sgemm_uses_blas();

}  // namespace hmla::cpu
