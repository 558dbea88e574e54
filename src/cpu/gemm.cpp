// sgemm: OpenBLAS behind HMLA_HAVE_BLAS, else a cache-blocked fallback whose inner loop the
// compiler vectorises (about a quarter of OpenBLAS's speed; it keeps the toolkit-only GPU build
// and its CPU reference free of any BLAS).
#include "cpu_kernels.h"

#include <algorithm>
#include <vector>

#include "hmla/ops/cpu_blas.h"

#ifdef HMLA_HAVE_BLAS
#include <cblas.h>
#endif

namespace hmla::cpu {

bool sgemm_uses_blas() {
#ifdef HMLA_HAVE_BLAS
  return true;
#else
  return false;
#endif
}

std::string cpu_isa() {
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) return "AVX-512";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "AVX2";
  return "SSE";
}

}  // namespace hmla::cpu

namespace hmla {

CpuBlasInfo cpu_blas_info() {
#ifdef HMLA_HAVE_BLAS
  return {openblas_get_config(), openblas_get_corename(), cpu::cpu_isa()};
#else
  return {"built-in", "built-in", cpu::cpu_isa()};
#endif
}

std::string cpu_blas_hint() {
  const CpuBlasInfo i = cpu_blas_info();
  if (i.core != "Prescott" || i.cpu_isa == "SSE") return "";
  const std::string fit = i.cpu_isa == "AVX-512" ? "SkylakeX" : "Haswell";
  // Measured with `hmla bench attention` (sgemm_gflops, 2048^3, 2 threads, AMD EPYC, AVX2):
  // 41 GFLOP/s with Prescott's kernels, 182 with Haswell's.
  return "hmla: note: OpenBLAS runs its SSE3 (Prescott) kernels on this " + i.cpu_isa +
         " CPU, about 4x slower for products (41 vs 182 GFLOP/s measured for a 2048^3 sgemm); "
         "set OPENBLAS_CORETYPE=" + fit + " to use its " + i.cpu_isa + " kernels";
}

}  // namespace hmla

namespace hmla::cpu {

#ifdef HMLA_HAVE_BLAS

void sgemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, ta == Trans::yes ? CblasTrans : CblasNoTrans,
              tb == Trans::yes ? CblasTrans : CblasNoTrans, static_cast<blasint>(M),
              static_cast<blasint>(N), static_cast<blasint>(K), alpha, A, static_cast<blasint>(lda),
              B, static_cast<blasint>(ldb), beta, C, static_cast<blasint>(ldc));
}

#else

namespace {
// Packs op(X) (rows x cols block starting at (r0, c0)) into a dense row-major buffer.
void pack(Trans t, const float* X, int64_t ld, int64_t r0, int64_t c0, int64_t rows, int64_t cols,
          float* out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      out[r * cols + c] = t == Trans::no ? X[(r0 + r) * ld + c0 + c] : X[(c0 + c) * ld + r0 + r];
}
}  // namespace

void sgemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.f ? 0.f : beta * C[i * ldc + j];
  constexpr int64_t MB = 64, NB = 256, KB = 128;
  std::vector<float> a(MB * KB), bb(KB * NB);
  for (int64_t k0 = 0; k0 < K; k0 += KB) {
    int64_t kb = std::min(KB, K - k0);
    for (int64_t j0 = 0; j0 < N; j0 += NB) {
      int64_t nb = std::min(NB, N - j0);
      pack(tb, B, ldb, k0, j0, kb, nb, bb.data());
      for (int64_t i0 = 0; i0 < M; i0 += MB) {
        int64_t mb = std::min(MB, M - i0);
        pack(ta, A, lda, i0, k0, mb, kb, a.data());
        for (int64_t i = 0; i < mb; ++i) {
          float* c = C + (i0 + i) * ldc + j0;
          for (int64_t k = 0; k < kb; ++k) {
            const float aik = alpha * a[i * kb + k];
            const float* b = bb.data() + k * nb;
#pragma omp simd
            for (int64_t j = 0; j < nb; ++j) c[j] += aik * b[j];
          }
        }
      }
    }
  }
}

#endif

// The backend's entry: one sgemm per batch matrix.
void gemm(const GemmParams& p) {
  const float* a = static_cast<const float*>(p.a);
  const float* b = static_cast<const float*>(p.b);
  float* c = static_cast<float*>(p.c);
  for (int64_t i = 0; i < p.batch; ++i)
    sgemm(p.ta, p.tb, p.M, p.N, p.K, p.alpha, a + i * p.a_batch, p.lda, b + i * p.b_batch, p.ldb, p.beta,
          c + i * p.c_batch, p.ldc);
}

// The CPU's plan (cpu_kernels.h): f32 operands.
Plan plan(Op, const GemmParams& p) { return plan_if(f32(p.a_dtype) && f32(p.b_dtype) && f32(p.c_dtype), Variant::cpu); }

}  // namespace hmla::cpu
