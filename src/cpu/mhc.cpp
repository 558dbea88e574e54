// mHC on the CPU (hmla/ops/mhc.h, docs/mhc.md): the products with fn through sgemm (z = xf fn^T,
// then scaled by each token's r; backward dxf += (r dz) fn and dfn += (r dz)^T xf), the per-token
// mixing math of hmla/ops/mhc_token.h on one thread per token, and the sums over tokens (dbase,
// dscale) in token order afterwards. No atomics: the same bits on any thread count.
#include <cmath>
#include <vector>

#include "hmla/ops/mhc_token.h"
#include "cpu_kernels.h"

namespace hmla::cpu {

namespace {

int64_t rows_of(const MhcParams& p, bool head) { return head ? p.n : (2 + p.n) * p.n; }
// The scale of z's entry o: pre, post or comb.
int group(int64_t o, int64_t n, bool head) { return head || o < n ? 0 : o < 2 * n ? 1 : 2; }

void mix_fwd(const MhcParams& p, bool head) {
  const int64_t n = p.n, D = p.D, K = n * D, m = rows_of(p, head);
  if (p.N == 0) return;
  sgemm(Trans::no, Trans::yes, p.N, m, K, 1.f, p.x, K, p.fn, K, 0.f, p.z, m);  // z = xf fn^T, unscaled
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < p.N; ++t) {
    const float* x = p.x + t * K;
    float ss = 0.f;
    for (int64_t j = 0; j < K; ++j) ss += x[j] * x[j];
    const float r = 1.f / std::sqrt(ss / float(K) + p.norm_eps);
    p.rstd[t] = r;
    float* z = p.z + t * m;
    for (int64_t o = 0; o < m; ++o) z[o] *= r;
    float pre[mhc::kMaxN], post[mhc::kMaxN], comb[mhc::kMaxN * mhc::kMaxN];
    mhc::mix_fwd(z, p.base, p.scale, int(n), int(p.iters), p.hc_eps, head, pre, post, comb);
    if (!head)
      for (int64_t i = 0; i < n; ++i) {
        p.post[t * n + i] = post[i];
        for (int64_t k = 0; k < n; ++k) p.comb[(t * n + i) * n + k] = comb[i * n + k];
      }
    float* y = p.y + t * D;
    for (int64_t d = 0; d < D; ++d) {
      float s = 0.f;
      for (int64_t i = 0; i < n; ++i) s += pre[i] * x[i * D + d];
      y[d] = s;
    }
  }
}

void mix_bwd(const MhcParams& p, bool head) {
  const int64_t n = p.n, D = p.D, K = n * D, m = rows_of(p, head);
  if (p.N == 0) return;
  std::vector<float> da(size_t(p.N * m)), dzr(size_t(p.N * m));
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < p.N; ++t) {
    const float* x = p.x + t * K;
    const float* dy = p.dy + t * D;
    const float* z = p.z + t * m;
    const float r = p.rstd[t];
    float pre[mhc::kMaxN], dpre[mhc::kMaxN];
    mhc::mix_fwd(z, p.base, p.scale, int(n), 1, p.hc_eps, true, pre, nullptr, nullptr);
    for (int64_t i = 0; i < n; ++i) {
      float s = 0.f;
      for (int64_t d = 0; d < D; ++d) s += dy[d] * x[i * D + d];
      dpre[i] = s;
    }
    float* a = da.data() + t * m;
    mhc::mix_bwd(z, p.base, p.scale, int(n), int(p.iters), p.hc_eps, head, dpre, head ? nullptr : p.dpost + t * n,
                 head ? nullptr : p.dcomb + t * n * n, a);
    // dz = da * scale[g]; dxf = r dz fn - r^2 (dz . z) / K xf (the RMS statistic's path).
    float dzz = 0.f;
    for (int64_t o = 0; o < m; ++o) {
      const float dz = a[o] * p.scale[group(o, n, head)];
      dzz += dz * z[o];
      dzr[size_t(t * m + o)] = dz * r;
    }
    const float c = r * r * dzz / float(K);
    float* dx = p.dx + t * K;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t d = 0; d < D; ++d) dx[i * D + d] = pre[i] * dy[d] - c * x[i * D + d];
  }
  sgemm(Trans::no, Trans::no, p.N, K, m, 1.f, dzr.data(), m, p.fn, K, 1.f, p.dx, K);   // dx += (r dz) fn
  sgemm(Trans::yes, Trans::no, m, K, p.N, 1.f, dzr.data(), m, p.x, K, 1.f, p.dfn, K);  // dfn += (r dz)^T xf
  float ds[3] = {0.f, 0.f, 0.f};
  for (int64_t o = 0; o < m; ++o) {
    float sb = 0.f;
    for (int64_t t = 0; t < p.N; ++t) sb += da[size_t(t * m + o)];
    p.dbase[o] += sb;
  }
  for (int64_t t = 0; t < p.N; ++t)
    for (int64_t o = 0; o < m; ++o) ds[group(o, n, head)] += da[size_t(t * m + o)] * p.z[t * m + o];
  for (int g = 0; g < (head ? 1 : 3); ++g) p.dscale[g] += ds[g];
}

}  // namespace

void mhc_pre_fwd(const MhcParams& p) { mix_fwd(p, false); }
void mhc_pre_bwd(const MhcParams& p) { mix_bwd(p, false); }
void mhc_head_fwd(const MhcParams& p) { mix_fwd(p, true); }
void mhc_head_bwd(const MhcParams& p) { mix_bwd(p, true); }

void mhc_post_fwd(const MhcParams& p) {
  const int64_t n = p.n, D = p.D;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < p.N; ++t)
    for (int64_t k = 0; k < n; ++k)
      for (int64_t d = 0; d < D; ++d) {
        float s = p.post[t * n + k] * p.y[t * D + d];
        for (int64_t i = 0; i < n; ++i) s += p.comb[(t * n + i) * n + k] * p.x[(t * n + i) * D + d];
        p.out[(t * n + k) * D + d] = s;
      }
}

void mhc_post_bwd(const MhcParams& p) {
  const int64_t n = p.n, D = p.D;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < p.N; ++t) {
    const float* g = p.dout + t * n * D;
    const float* x = p.x + t * n * D;
    for (int64_t d = 0; d < D; ++d) {
      float s = 0.f;
      for (int64_t k = 0; k < n; ++k) s += p.post[t * n + k] * g[k * D + d];
      p.dy_out[t * D + d] = s;
    }
    for (int64_t i = 0; i < n; ++i)
      for (int64_t d = 0; d < D; ++d) {
        float s = 0.f;
        for (int64_t k = 0; k < n; ++k) s += p.comb[(t * n + i) * n + k] * g[k * D + d];
        p.dx[(t * n + i) * D + d] = s;
      }
    for (int64_t k = 0; k < n; ++k) {
      float s = 0.f;
      for (int64_t d = 0; d < D; ++d) s += g[k * D + d] * p.y[t * D + d];
      p.dpost_out[t * n + k] = s;
      for (int64_t i = 0; i < n; ++i) {
        float c = 0.f;
        for (int64_t d = 0; d < D; ++d) c += g[k * D + d] * x[i * D + d];
        p.dcomb_out[(t * n + i) * n + k] = c;
      }
    }
  }
}

// The CPU's plan (cpu_kernels.h): f32, any sizes the entry points accept.
Plan plan(Op, const MhcParams&) { return {Variant::cpu, {}}; }

}  // namespace hmla::cpu
