// mHC's per-token mixing math (hmla/ops/mhc.h), written once for both backends' kernels (the CPU's
// src/cpu/mhc.cpp and CUDA's src/cuda/mhc.cu, where it runs on one thread per token): from z the
// weights pre, post and comb (sigmoids, the softmax and the Sinkhorn divisions), and back from
// their gradients to the gradient of a = z * scale + base. f32, sums in index order. The backward
// recomputes the Sinkhorn iterates from the softmax before each division it differentiates
// (O(S^2 n^2) for S = 2 iters - 1 divisions: no [S, n, n] store per token). Derivation: docs/mhc.md.
#pragma once
#include <cmath>

#if defined(__CUDACC__) || defined(HMLA_CUDA_EMULATE)
#define HMLA_MHC_HD __host__ __device__
#else
#define HMLA_MHC_HD
#endif

namespace hmla::mhc {

constexpr int kMaxN = 8;  // hmla::kMhcMaxStreams

HMLA_MHC_HD inline float sigmoid(float a) { return 1.f / (1.f + expf(-a)); }

// Sinkhorn division number j (1-based; odd: columns, the sums over i; even: rows) of c [n, n]
// (c[i * n + k]), each denominator + eps.
HMLA_MHC_HD inline void sinkhorn_step(float* c, int n, int j, float eps) {
  const bool cols = j % 2 == 1;
  for (int a = 0; a < n; ++a) {
    float s = 0.f;
    for (int b = 0; b < n; ++b) s += cols ? c[b * n + a] : c[a * n + b];
    const float den = s + eps;
    for (int b = 0; b < n; ++b) (cols ? c[b * n + a] : c[a * n + b]) /= den;
  }
}

// p [n, n] = the softmax over k of a[i * n + k] (rows of a).
HMLA_MHC_HD inline void softmax_rows(const float* a, int n, float* p) {
  for (int i = 0; i < n; ++i) {
    float mx = a[i * n];
    for (int k = 1; k < n; ++k) mx = fmaxf(mx, a[i * n + k]);
    float s = 0.f;
    for (int k = 0; k < n; ++k) s += p[i * n + k] = expf(a[i * n + k] - mx);
    for (int k = 0; k < n; ++k) p[i * n + k] /= s;
  }
}

// The token's weights from z [m] (m = (2 + n) n, or n when head): pre [n]; unless head, post [n]
// and comb [n, n] after 2 iters - 1 Sinkhorn divisions.
HMLA_MHC_HD inline void mix_fwd(const float* z, const float* base, const float* scale, int n, int iters, float eps,
                                bool head, float* pre, float* post, float* comb) {
  for (int i = 0; i < n; ++i) pre[i] = sigmoid(z[i] * scale[0] + base[i]) + eps;
  if (head) return;
  for (int i = 0; i < n; ++i) post[i] = 2.f * sigmoid(z[n + i] * scale[1] + base[n + i]);
  float a[kMaxN * kMaxN];
  for (int e = 0; e < n * n; ++e) a[e] = z[2 * n + e] * scale[2] + base[2 * n + e];
  softmax_rows(a, n, comb);
  for (int e = 0; e < n * n; ++e) comb[e] += eps;
  for (int j = 1; j <= 2 * iters - 1; ++j) sinkhorn_step(comb, n, j, eps);
}

// da [m], the gradient of a = z * scale + base, from dpre [n] (and unless head dpost [n], dcomb
// [n, n]): sigmoid' for pre and post, then every Sinkhorn division backward from the last (its input
// recomputed from the softmax), then the softmax's Jacobian.
HMLA_MHC_HD inline void mix_bwd(const float* z, const float* base, const float* scale, int n, int iters, float eps,
                                bool head, const float* dpre, const float* dpost, const float* dcomb, float* da) {
  for (int i = 0; i < n; ++i) {
    const float s = sigmoid(z[i] * scale[0] + base[i]);
    da[i] = dpre[i] * (s * (1.f - s));
  }
  if (head) return;
  for (int i = 0; i < n; ++i) {
    const float s = sigmoid(z[n + i] * scale[1] + base[n + i]);
    da[n + i] = dpost[i] * (2.f * s * (1.f - s));
  }
  const int nn = n * n;
  float a[kMaxN * kMaxN], p[kMaxN * kMaxN], c[kMaxN * kMaxN], g[kMaxN * kMaxN];
  for (int e = 0; e < nn; ++e) a[e] = z[2 * n + e] * scale[2] + base[2 * n + e];
  softmax_rows(a, n, p);
  for (int e = 0; e < nn; ++e) g[e] = dcomb[e];
  // Division j maps c to c' = c / den (den = its sum over the divided axis + eps): the gradient of
  // its input is (g - sum over that axis of g c') / den, per column (odd j) or row.
  for (int j = 2 * iters - 1; j >= 1; --j) {
    for (int e = 0; e < nn; ++e) c[e] = p[e] + eps;
    for (int q = 1; q < j; ++q) sinkhorn_step(c, n, q, eps);
    const bool cols = j % 2 == 1;
    for (int u = 0; u < n; ++u) {
      float s = 0.f;
      for (int v = 0; v < n; ++v) s += cols ? c[v * n + u] : c[u * n + v];
      const float den = s + eps;
      float gc = 0.f;
      for (int v = 0; v < n; ++v) {
        const int e = cols ? v * n + u : u * n + v;
        gc += g[e] * (c[e] / den);
      }
      for (int v = 0; v < n; ++v) {
        const int e = cols ? v * n + u : u * n + v;
        g[e] = (g[e] - gc) / den;
      }
    }
  }
  for (int i = 0; i < n; ++i) {
    float gp = 0.f;
    for (int k = 0; k < n; ++k) gp += g[i * n + k] * p[i * n + k];
    for (int k = 0; k < n; ++k) da[2 * n + i * n + k] = p[i * n + k] * (g[i * n + k] - gp);
  }
}

}  // namespace hmla::mhc
