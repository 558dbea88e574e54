// The CPU's dense ops in f32 (hmla/ops/nn.h): RMSNorm and LayerNorm forward and backward, the
// fused add + RMSNorm, RoPE (both layouts), SwiGLU, embedding, axpy and dtype conversion (the
// cross-entropy is cross_entropy.cpp's); weight gradients added into, activation gradients
// written. Their plans at the end.
#include "cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>


namespace hmla::cpu {

void rmsnorm_fwd(const NormParams& p) {
  float *y = static_cast<float*>(p.y), *rstd = p.rstd;
  const float *x = static_cast<const float*>(p.x), *w = p.w;
  const int64_t ldy = p.ldy, ldx = p.ldx, N = p.N, D = p.D;
  const float eps = p.eps;
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

// The same arithmetic as axpy's a + 1 * b, then rmsnorm_fwd's, so the bits equal the two calls'.
void add_rmsnorm_fwd(const NormParams& p) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < p.N; ++n) {
    const float *a = static_cast<const float*>(p.x) + n * p.ldx, *b = static_cast<const float*>(p.x2) + n * p.ldx2;
    float* xs = p.xs + n * p.ldxs;
    float ss = 0.f;
    for (int64_t d = 0; d < p.D; ++d) {
      xs[d] = a[d] + 1.f * b[d];
      ss += xs[d] * xs[d];
    }
    const float r = 1.f / std::sqrt(ss / float(p.D) + p.eps);
    p.rstd[n] = r;
    float* yr = static_cast<float*>(p.y) + n * p.ldy;
    for (int64_t d = 0; d < p.D; ++d) yr[d] = xs[d] * r * p.w[d];
  }
}

void rmsnorm_bwd(const NormParams& p) {
  float *dx = p.dx, *dw = p.dw;
  const float *dy = p.dy, *x = static_cast<const float*>(p.x), *w = p.w, *rstd = p.rstd;
  const int64_t lddx = p.lddx, lddy = p.lddy, ldx = p.ldx, N = p.N, D = p.D;
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

void layernorm_fwd(const NormParams& p) {  // rows contiguous
  float *y = static_cast<float*>(p.y), *mean = p.mean, *rstd = p.rstd;
  const float *x = static_cast<const float*>(p.x), *w = p.w, *b = p.bias;
  const int64_t N = p.N, D = p.D;
  const float eps = p.eps;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * D;
    float mu = 0.f;
    for (int64_t d = 0; d < D; ++d) mu += xr[d];
    mu /= float(D);
    float var = 0.f;
    for (int64_t d = 0; d < D; ++d) var += (xr[d] - mu) * (xr[d] - mu);
    const float r = 1.f / std::sqrt(var / float(D) + eps);
    mean[n] = mu;
    rstd[n] = r;
    for (int64_t d = 0; d < D; ++d) y[n * D + d] = (xr[d] - mu) * r * w[d] + b[d];
  }
}

void layernorm_bwd(const NormParams& p) {  // rows contiguous
  float *dx = p.dx, *dw = p.dw, *db = p.db;
  const float *dy = p.dy, *x = static_cast<const float*>(p.x), *w = p.w, *mean = p.mean, *rstd = p.rstd;
  const int64_t N = p.N, D = p.D;
  for (int64_t n = 0; n < N; ++n)  // rows in order: bits independent of threads
    for (int64_t d = 0; d < D; ++d) {
      dw[d] += dy[n * D + d] * (x[n * D + d] - mean[n]) * rstd[n];
      db[d] += dy[n * D + d];
    }
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float r = rstd[n];
    float m1 = 0.f, m2 = 0.f;  // means of dxhat and dxhat * xhat
    for (int64_t d = 0; d < D; ++d) {
      const float g = dy[n * D + d] * w[d], xh = (x[n * D + d] - mean[n]) * r;
      m1 += g;
      m2 += g * xh;
    }
    m1 /= float(D);
    m2 /= float(D);
    for (int64_t d = 0; d < D; ++d) {
      const float g = dy[n * D + d] * w[d], xh = (x[n * D + d] - mean[n]) * r;
      dx[n * D + d] = r * (g - m1 - xh * m2);
    }
  }
}

void rope(const RopeParams& prm) {
  const RopeLayout layout = prm.layout;
  float* x = static_cast<float*>(prm.x);
  const int64_t ld = prm.ld, hstride = prm.hstride, heads = prm.heads, N = prm.N, s = prm.s, Dr = prm.Dr;
  const float *cos = prm.cos, *sin = prm.sin;
  const bool transpose = prm.transpose;
  const int64_t half = Dr / 2;
  // Pair i is (p[i * step], p[i * step + off]).
  const int64_t step = layout == RopeLayout::interleaved ? 2 : 1;
  const int64_t off = layout == RopeLayout::interleaved ? 1 : half;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* c = cos + (n % s) * half;
    const float* sn = sin + (n % s) * half;
    for (int64_t h = 0; h < heads; ++h) {
      float* p = x + n * ld + h * hstride;
      for (int64_t i = 0; i < half; ++i) {
        const float a = p[i * step], b = p[i * step + off];
        const float si = transpose ? -sn[i] : sn[i];
        p[i * step] = a * c[i] - b * si;
        p[i * step + off] = b * c[i] + a * si;
      }
    }
  }
}

void swiglu_fwd(const SwigluParams& p) {
  float* y = static_cast<float*>(p.y);
  const float *g = static_cast<const float*>(p.g), *u = static_cast<const float*>(p.u);
  const int64_t n = p.n;
  const float L = p.limit;
  if (L > 0.f) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float gc = g[i] > L ? L : g[i], uc = u[i] > L ? L : u[i] < -L ? -L : u[i];
      y[i] = gc / (1.f + std::exp(-gc)) * uc;
    }
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
}

void swiglu_bwd(const SwigluParams& p) {
  float *dg = p.dg, *du = p.du;
  const float *dy = p.dy, *g = static_cast<const float*>(p.g), *u = static_cast<const float*>(p.u);
  const int64_t n = p.n;
  const float L = p.limit;
  if (L > 0.f) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const bool g_in = !(g[i] > L), u_in = !(u[i] > L || u[i] < -L);
      const float gc = g_in ? g[i] : L, uc = u_in ? u[i] : u[i] > L ? L : -L;
      const float sig = 1.f / (1.f + std::exp(-gc));
      du[i] = u_in ? dy[i] * gc * sig : 0.f;
      dg[i] = g_in ? dy[i] * uc * sig * (1.f + gc * (1.f - sig)) : 0.f;
    }
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float sig = 1.f / (1.f + std::exp(-g[i]));
    du[i] = dy[i] * g[i] * sig;
    dg[i] = dy[i] * u[i] * sig * (1.f + g[i] * (1.f - sig));
  }
}

void embedding_fwd(const EmbeddingParams& p) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < p.N; ++n)
    std::memcpy(p.out + n * p.D, p.E + int64_t(p.ids[n]) * p.D, p.D * sizeof(float));
}

void embedding_bwd(const EmbeddingParams& p) {
  for (int64_t n = 0; n < p.N; ++n) {  // token order: rows of one id add up in a fixed order
    float* row = p.dE + int64_t(p.ids[n]) * p.D;
    const float* src = p.dout + n * p.D;
    for (int64_t i = 0; i < p.D; ++i) row[i] += src[i];
  }
}

void axpy(const AxpyParams& p) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < p.N; ++n) {
    const float* a = p.a + n * p.lda;
    float* o = p.out + n * p.ldout;
    if (p.b) {
      const float* b = p.b + n * p.ldb;
      for (int64_t i = 0; i < p.D; ++i) o[i] = a[i] + p.alpha * b[i];
    } else {
      for (int64_t i = 0; i < p.D; ++i) o[i] = p.alpha * a[i];
    }
  }
}

namespace {
float load(DType t, const void* p, int64_t i) {
  return t == DType::f32 ? static_cast<const float*>(p)[i] : bf16_to_f32(static_cast<const bf16*>(p)[i]);
}
void store(DType t, void* p, int64_t i, float v) {
  if (t == DType::f32) static_cast<float*>(p)[i] = v;
  else static_cast<bf16*>(p)[i] = f32_to_bf16(v);
}
}  // namespace

void convert(const ConvertParams& p) {
  const int64_t s0 = p.dims > 0 ? p.shape[0] : 1, s1 = p.dims > 1 ? p.shape[1] : 1, s2 = p.dims > 2 ? p.shape[2] : 1,
                s3 = p.dims > 3 ? p.shape[3] : 1;
  auto at = [&](const int64_t* st, int64_t i, int64_t j, int64_t k, int64_t l) {
    return (p.dims > 0 ? i * st[0] : 0) + (p.dims > 1 ? j * st[1] : 0) + (p.dims > 2 ? k * st[2] : 0) +
           (p.dims > 3 ? l * st[3] : 0);
  };
  const size_t es = dtype_size(p.src_dtype);
  for (int64_t i = 0; i < s0; ++i)
    for (int64_t j = 0; j < s1; ++j)
      for (int64_t k = 0; k < s2; ++k)
        for (int64_t l = 0; l < s3; ++l) {
          const int64_t a = at(p.src_stride, i, j, k, l), b = at(p.dst_stride, i, j, k, l);
          if (p.src_dtype == p.dst_dtype)
            std::memcpy(static_cast<char*>(p.dst) + b * es, static_cast<const char*>(p.src) + a * es, es);
          else
            store(p.dst_dtype, p.dst, b, load(p.src_dtype, p.src, a));
        }
}

// The CPU's plans (cpu_kernels.h): f32 activations (bf16 ones are CUDA's: nn.h); convert between
// f32 and bf16 either way, any other dtype only to itself.
Plan plan(Op, const NormParams& p) { return plan_if(f32(p.x_dtype) && f32(p.x2_dtype) && f32(p.y_dtype), Variant::cpu); }
Plan plan(Op, const RopeParams& p) { return plan_if(f32(p.x_dtype), Variant::cpu); }
Plan plan(Op, const SwigluParams& p) { return plan_if(f32(p.dtype), Variant::cpu); }
Plan plan(Op, const EmbeddingParams&) { return {Variant::cpu, {}}; }
Plan plan(Op, const CrossEntropyParams&) { return {Variant::cpu, {}}; }
Plan plan(Op, const AxpyParams&) { return {Variant::cpu, {}}; }
Plan plan(Op, const ConvertParams& p) {
  auto fb = [](DType t) { return t == DType::f32 || t == DType::bf16; };
  return plan_if(p.src_dtype == p.dst_dtype || (fb(p.src_dtype) && fb(p.dst_dtype)), Variant::cpu);
}

}  // namespace hmla::cpu
