// mHC (hmla/ops/mhc.h) from its definition (docs/deepseek_v4_math.md section 7), in T: double is
// the oracle, float the naive instance whose error sets the STYLE.md bound. Written apart from
// the kernels' token math (hmla/ops/mhc_token.h): the RMS-normalised row is materialised, every
// Sinkhorn iterate is stored and the backward walks the stored iterates (the kernels recompute
// them), the RMS backward goes through the normalised row (the kernels fold it into z). Sums in
// index order. Header-only, no test framework.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace hmla::op_cases {

struct MhcDims {
  int64_t N, n, D, iters;
  double norm_eps, hc_eps;
};

// The entry's (head = false) or hc_head's (head = true) forward and, when dy is given, backward.
// abs_* hold the same sums over absolute values (the magnitudes that enter the weight gradients,
// for the rule's rounding term).
template <class T>
struct MhcMixRef {
  std::vector<T> y, post, comb;         // [N, D], [N, n], [N, n, n]
  std::vector<T> dx, dfn, dbase, dscale;
  std::vector<T> abs_dfn, abs_dbase, abs_dscale;
};

template <class T, class U>
MhcMixRef<T> mhc_mix_ref(const MhcDims& d, bool head, const std::vector<U>& x, const std::vector<U>& fn,
                         const std::vector<U>& base, const std::vector<U>& scale, const std::vector<U>* dy = nullptr,
                         const std::vector<U>* dpost = nullptr, const std::vector<U>* dcomb = nullptr) {
  const int64_t N = d.N, n = d.n, D = d.D, K = n * D, m = head ? n : (2 + n) * n, S = 2 * d.iters - 1;
  const T eps = T(d.hc_eps);
  MhcMixRef<T> r;
  r.y.assign(size_t(N * D), T(0));
  if (!head) r.post.assign(size_t(N * n), T(0)), r.comb.assign(size_t(N * n * n), T(0));
  if (dy) {
    r.dx.assign(size_t(N * K), T(0)), r.dfn.assign(size_t(m * K), T(0)), r.dbase.assign(size_t(m), T(0));
    r.dscale.assign(head ? 1 : 3, T(0));
    r.abs_dfn = r.dfn, r.abs_dbase = r.dbase, r.abs_dscale = r.dscale;
  }
  auto grp = [&](int64_t o) { return head || o < n ? 0 : o < 2 * n ? 1 : 2; };
  for (int64_t t = 0; t < N; ++t) {
    const U* xt = x.data() + t * K;
    T ms = 0;
    for (int64_t j = 0; j < K; ++j) ms += T(xt[j]) * T(xt[j]);
    const T rs = T(1) / std::sqrt(ms / T(K) + T(d.norm_eps));
    std::vector<T> xh(static_cast<size_t>(K)), a(static_cast<size_t>(m)), z(static_cast<size_t>(m));
    for (int64_t j = 0; j < K; ++j) xh[size_t(j)] = T(xt[j]) * rs;
    for (int64_t o = 0; o < m; ++o) {
      T s = 0;
      for (int64_t j = 0; j < K; ++j) s += xh[size_t(j)] * T(fn[size_t(o * K + j)]);
      z[size_t(o)] = s;
      a[size_t(o)] = s * T(scale[size_t(grp(o))]) + T(base[size_t(o)]);
    }
    std::vector<T> sg(static_cast<size_t>(2 * n)), pre(static_cast<size_t>(n)), P(static_cast<size_t>(n * n));
    for (int64_t i = 0; i < (head ? n : 2 * n); ++i) sg[size_t(i)] = T(1) / (T(1) + std::exp(-a[size_t(i)]));
    for (int64_t i = 0; i < n; ++i) pre[size_t(i)] = sg[size_t(i)] + eps;
    std::vector<std::vector<T>> C;  // C[0] = softmax + eps, C[s] after division s
    if (!head) {
      for (int64_t i = 0; i < n; ++i) {
        T mx = a[size_t(2 * n + i * n)], sum = 0;
        for (int64_t k = 0; k < n; ++k) mx = std::max(mx, a[size_t(2 * n + i * n + k)]);
        for (int64_t k = 0; k < n; ++k) sum += P[size_t(i * n + k)] = std::exp(a[size_t(2 * n + i * n + k)] - mx);
        for (int64_t k = 0; k < n; ++k) P[size_t(i * n + k)] /= sum;
      }
      C.push_back(P);
      for (T& v : C[0]) v += eps;
      for (int64_t s = 1; s <= S; ++s) {
        std::vector<T> c = C.back();
        for (int64_t u = 0; u < n; ++u) {  // odd s: column u (sum over i); even: row u
          T sum = 0;
          for (int64_t v = 0; v < n; ++v) sum += s % 2 ? c[size_t(v * n + u)] : c[size_t(u * n + v)];
          for (int64_t v = 0; v < n; ++v) (s % 2 ? c[size_t(v * n + u)] : c[size_t(u * n + v)]) /= sum + eps;
        }
        C.push_back(c);
      }
      for (int64_t i = 0; i < n; ++i) r.post[size_t(t * n + i)] = T(2) * sg[size_t(n + i)];
      for (int64_t e = 0; e < n * n; ++e) r.comb[size_t(t * n * n + e)] = C.back()[size_t(e)];
    }
    for (int64_t dd = 0; dd < D; ++dd)
      for (int64_t i = 0; i < n; ++i) r.y[size_t(t * D + dd)] += pre[size_t(i)] * T(xt[i * D + dd]);
    if (!dy) continue;
    // Backward: da (the logits' gradient), then dz, then the row through the RMS normalisation.
    std::vector<T> da(static_cast<size_t>(m), T(0));
    for (int64_t i = 0; i < n; ++i) {
      T dp = 0;
      for (int64_t dd = 0; dd < D; ++dd) dp += T((*dy)[size_t(t * D + dd)]) * T(xt[i * D + dd]);
      da[size_t(i)] = dp * sg[size_t(i)] * (T(1) - sg[size_t(i)]);
    }
    if (!head) {
      for (int64_t i = 0; i < n; ++i)
        da[size_t(n + i)] = T((*dpost)[size_t(t * n + i)]) * T(2) * sg[size_t(n + i)] * (T(1) - sg[size_t(n + i)]);
      std::vector<T> g(static_cast<size_t>(n * n));
      for (int64_t e = 0; e < n * n; ++e) g[size_t(e)] = T((*dcomb)[size_t(t * n * n + e)]);
      for (int64_t s = S; s >= 1; --s) {  // C[s] = C[s-1] / (sums of C[s-1] + eps)
        const std::vector<T>& in = C[size_t(s - 1)];
        std::vector<T> gin(static_cast<size_t>(n * n));
        for (int64_t u = 0; u < n; ++u) {
          T sum = 0, dot = 0;
          auto at = [&](int64_t v) { return size_t(s % 2 ? v * n + u : u * n + v); };
          for (int64_t v = 0; v < n; ++v) sum += in[at(v)];
          const T den = sum + eps;
          for (int64_t v = 0; v < n; ++v) dot += g[at(v)] * in[at(v)];
          for (int64_t v = 0; v < n; ++v) gin[at(v)] = g[at(v)] / den - dot / (den * den);
        }
        g = gin;
      }
      for (int64_t i = 0; i < n; ++i)
        for (int64_t k = 0; k < n; ++k) {
          T acc = 0;  // sum_k' g[i, k'] dP[i, k'] / da[i, k] = P_k (delta - P_k')
          for (int64_t q = 0; q < n; ++q)
            acc += g[size_t(i * n + q)] * P[size_t(i * n + q)] * ((q == k ? T(1) : T(0)) - P[size_t(i * n + k)]);
          da[size_t(2 * n + i * n + k)] = acc;
        }
    }
    std::vector<T> dxh(static_cast<size_t>(K), T(0));
    for (int64_t o = 0; o < m; ++o) {
      const T dz = da[size_t(o)] * T(scale[size_t(grp(o))]);
      r.dbase[size_t(o)] += da[size_t(o)], r.abs_dbase[size_t(o)] += std::abs(da[size_t(o)]);
      r.dscale[size_t(grp(o))] += da[size_t(o)] * z[size_t(o)];
      r.abs_dscale[size_t(grp(o))] += std::abs(da[size_t(o)] * z[size_t(o)]);
      for (int64_t j = 0; j < K; ++j) {
        r.dfn[size_t(o * K + j)] += dz * xh[size_t(j)], r.abs_dfn[size_t(o * K + j)] += std::abs(dz * xh[size_t(j)]);
        dxh[size_t(j)] += dz * T(fn[size_t(o * K + j)]);
      }
    }
    T gx = 0;  // xh = x rs: dx = rs (dxh - xh mean(dxh xh))
    for (int64_t j = 0; j < K; ++j) gx += dxh[size_t(j)] * xh[size_t(j)];
    for (int64_t i = 0; i < n; ++i)
      for (int64_t dd = 0; dd < D; ++dd) {
        const int64_t j = i * D + dd;
        r.dx[size_t(t * K + j)] = rs * (dxh[size_t(j)] - xh[size_t(j)] * gx / T(K)) +
                                  pre[size_t(i)] * T((*dy)[size_t(t * D + dd)]);
      }
  }
  return r;
}

// The exit: out[t, k] = post[t, k] y[t] + sum_i comb[t, i, k] x[t, i]; with dout, its gradients.
template <class T>
struct MhcPostRef {
  std::vector<T> out, dx, dy, dpost, dcomb;
};
template <class T, class U>
MhcPostRef<T> mhc_post_ref(const MhcDims& d, const std::vector<U>& x, const std::vector<U>& y,
                           const std::vector<U>& post, const std::vector<U>& comb,
                           const std::vector<U>* dout = nullptr) {
  const int64_t N = d.N, n = d.n, D = d.D;
  MhcPostRef<T> r;
  r.out.assign(size_t(N * n * D), T(0));
  if (dout)
    r.dx.assign(size_t(N * n * D), T(0)), r.dy.assign(size_t(N * D), T(0)), r.dpost.assign(size_t(N * n), T(0)),
        r.dcomb.assign(size_t(N * n * n), T(0));
  for (int64_t t = 0; t < N; ++t)
    for (int64_t k = 0; k < n; ++k)
      for (int64_t dd = 0; dd < D; ++dd) {
        const size_t ok = size_t((t * n + k) * D + dd);
        const T pk = T(post[size_t(t * n + k)]), yv = T(y[size_t(t * D + dd)]);
        T s = pk * yv;
        for (int64_t i = 0; i < n; ++i) s += T(comb[size_t((t * n + i) * n + k)]) * T(x[size_t((t * n + i) * D + dd)]);
        r.out[ok] = s;
        if (!dout) continue;
        const T g = T((*dout)[ok]);
        r.dpost[size_t(t * n + k)] += g * yv;
        r.dy[size_t(t * D + dd)] += g * pk;
        for (int64_t i = 0; i < n; ++i) {
          r.dcomb[size_t((t * n + i) * n + k)] += g * T(x[size_t((t * n + i) * D + dd)]);
          r.dx[size_t((t * n + i) * D + dd)] += g * T(comb[size_t((t * n + i) * n + k)]);
        }
      }
  return r;
}

}  // namespace hmla::op_cases
