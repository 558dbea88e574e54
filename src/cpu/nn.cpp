#include "nn.h"

#include <cmath>

#include "gemm.h"

namespace hmla::cpu {

void linear_fwd(float* y, int64_t ldy, const float* x, int64_t ldx, const float* W, int64_t N,
                int64_t in, int64_t out) {
  sgemm(Trans::no, Trans::yes, N, out, in, 1.f, x, ldx, W, in, 0.f, y, ldy);
}

void linear_bwd(float* dx, int64_t lddx, float beta, float* dW, const float* dy, int64_t lddy,
                const float* x, int64_t ldx, const float* W, int64_t N, int64_t in, int64_t out) {
  sgemm(Trans::yes, Trans::no, out, in, N, 1.f, dy, lddy, x, ldx, 0.f, dW, in);
  if (dx) sgemm(Trans::no, Trans::no, N, in, out, 1.f, dy, lddy, W, in, beta, dx, lddx);
}

void rmsnorm_fwd(float* y, int64_t ldy, float* rstd, const float* x, int64_t ldx, const float* w,
                 int64_t N, int64_t D, float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * ldx;
    float ss = 0.f;
    for (int64_t d = 0; d < D; ++d) ss += xr[d] * xr[d];
    const float r = 1.f / std::sqrt(ss / float(D) + eps);
    rstd[n] = r;
    float* yr = y + n * ldy;
    for (int64_t d = 0; d < D; ++d) yr[d] = xr[d] * r * w[d];
  }
}

void rmsnorm_bwd(float* dx, int64_t lddx, float* dw, const float* dy, int64_t lddy, const float* x,
                 int64_t ldx, const float* w, const float* rstd, int64_t N, int64_t D) {
  for (int64_t d = 0; d < D; ++d) dw[d] = 0.f;
  // dw is a sum over rows: rows are walked in order so the bits do not depend on threads.
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * ldx;
    const float* g = dy + n * lddy;
    for (int64_t d = 0; d < D; ++d) dw[d] += g[d] * xr[d] * rstd[n];
  }
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * ldx;
    const float* g = dy + n * lddy;
    const float r = rstd[n];
    float dot = 0.f;  // mean over d of (dy * w) * xhat
    for (int64_t d = 0; d < D; ++d) dot += g[d] * w[d] * xr[d] * r;
    dot /= float(D);
    float* o = dx + n * lddx;
    for (int64_t d = 0; d < D; ++d) o[d] = r * (g[d] * w[d] - xr[d] * r * dot);
  }
}

void rope_interleaved(float* x, int64_t ld, int64_t hstride, int64_t heads, int64_t N, int64_t s,
                      int64_t Dr, const float* cos, const float* sin, bool transpose) {
  const int64_t half = Dr / 2;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* c = cos + (n % s) * half;
    const float* sn = sin + (n % s) * half;
    for (int64_t h = 0; h < heads; ++h) {
      float* p = x + n * ld + h * hstride;
      for (int64_t i = 0; i < half; ++i) {
        const float a = p[2 * i], b = p[2 * i + 1];
        const float si = transpose ? -sn[i] : sn[i];
        p[2 * i] = a * c[i] - b * si;
        p[2 * i + 1] = b * c[i] + a * si;
      }
    }
  }
}

}  // namespace hmla::cpu
