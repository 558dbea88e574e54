// Naive sparse latent MQA attention: per row, per head, loops over the listed keys; backward from
// the textbook formulas dS = P (dP - D), D = dout . out, dsink = -P_sink D. One implementation in
// two roles, by its rounding policy: Exact (the float64 oracle every kernel is tested against, and
// its float32 instance, the naive f32 implementation of the STYLE.md rule), or a policy that
// rounds what a low-precision kernel stores (tests/cuda: the naive bf16 implementation).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace hmla::ref {

struct SparseDims {
  int64_t b, s, H, Dqk, Dv, KW, K;
};

template <class T>
struct SparseRefResult {
  std::vector<T> out, lse, lse_c, dq, dkv, dsink;
};

// The rounding of stored intermediates: R::stored(x) is applied to the raw scores q . k (before
// the scale), the probabilities P, the output, dP = dout . v, dS, dq and dkv; sums run in T.
struct Exact {
  template <class T>
  static T stored(T x) {
    return x;
  }
};

// q [b, s, H, Dqk], kv [b, s, Dqk], idx [b, s, KW]; sink [H] or empty; dout [b, s, H, Dv] or empty.
template <class T, class R = Exact>
SparseRefResult<T> attn_sparse_ref(const SparseDims& d, const std::vector<T>& q, const std::vector<T>& kv,
                                   const std::vector<int32_t>& idx, const std::vector<T>& sink, T scale,
                                   const std::vector<T>& dout);

namespace detail {

// One (row, head): lse (and lse_c over the K candidates), out; with dout, dsink, dq and dkv (+=).
template <class T, class R>
void sparse_row_head(const SparseDims& d, const T* qh, const std::vector<const T*>& keys,
                     const std::vector<bool>& cand, const T* sink_h, T scale, const T* g, T& lse, T& lse_c, T* o,
                     T* dsink_h, T* dqh, const std::vector<T*>& dkeys) {
  std::vector<T> l(keys.size()), P(keys.size());
  T m = -std::numeric_limits<T>::infinity(), mc = m;
  for (size_t i = 0; i < keys.size(); ++i) {
    T acc = 0;
    for (int64_t c = 0; c < d.Dqk; ++c) acc += qh[c] * keys[i][c];
    l[i] = scale * R::stored(acc);
    m = std::max(m, l[i]);
    if (cand[i]) mc = std::max(mc, l[i]);
  }
  T z = sink_h ? std::exp(*sink_h - m) : T(0), zc = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    z += std::exp(l[i] - m);
    if (cand[i]) zc += std::exp(l[i] - mc);
  }
  lse = m + std::log(z);
  if (zc > 0) lse_c = mc + std::log(zc);
  std::vector<T> acc(d.Dv, T(0));
  for (size_t i = 0; i < keys.size(); ++i) {
    P[i] = R::stored(std::exp(l[i] - m) / z);
    for (int64_t c = 0; c < d.Dv; ++c) acc[c] += P[i] * keys[i][c];
  }
  for (int64_t c = 0; c < d.Dv; ++c) o[c] = R::stored(acc[c]);
  if (!g) return;
  T D = 0;
  for (int64_t c = 0; c < d.Dv; ++c) D += g[c] * o[c];
  if (sink_h) *dsink_h -= std::exp(*sink_h - lse) * D;
  std::vector<T> dq(d.Dqk, T(0));
  for (size_t i = 0; i < keys.size(); ++i) {
    T dP = 0;
    for (int64_t c = 0; c < d.Dv; ++c) dP += g[c] * keys[i][c];
    const T dS = R::stored(P[i] * (R::stored(dP) - D));
    for (int64_t c = 0; c < d.Dqk; ++c) {
      dq[c] += dS * keys[i][c];
      dkeys[i][c] += scale * dS * qh[c] + (c < d.Dv ? P[i] * g[c] : T(0));
    }
  }
  for (int64_t c = 0; c < d.Dqk; ++c) dqh[c] = R::stored(scale * dq[c]);
}

}  // namespace detail

template <class T, class R>
SparseRefResult<T> attn_sparse_ref(const SparseDims& d, const std::vector<T>& q, const std::vector<T>& kv,
                                   const std::vector<int32_t>& idx, const std::vector<T>& sink, T scale,
                                   const std::vector<T>& dout) {
  const T inf = std::numeric_limits<T>::infinity();
  SparseRefResult<T> r;
  r.out.assign(d.b * d.s * d.H * d.Dv, T(0));
  r.lse.assign(d.b * d.H * d.s, inf);
  r.lse_c.assign(d.b * d.H * d.s, inf);
  r.dq.assign(q.size(), T(0));
  r.dkv.assign(kv.size(), T(0));
  if (!sink.empty()) r.dsink.assign(d.H, T(0));
  for (int64_t row = 0; row < d.b * d.s; ++row) {
    const int64_t b = row / d.s, t = row % d.s;
    std::vector<const T*> keys;
    std::vector<T*> dkeys;
    std::vector<bool> cand;
    for (int64_t i = 0; i < d.KW; ++i) {
      const int32_t j = idx[row * d.KW + i];
      if (j < 0) continue;  // no key
      keys.push_back(&kv[(b * d.s + j) * d.Dqk]);
      dkeys.push_back(&r.dkv[(b * d.s + j) * d.Dqk]);
      cand.push_back(i < d.K);
    }
    if (keys.empty()) continue;  // out 0, lse +inf, dq 0
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t qi = row * d.H + h, li = (b * d.H + h) * d.s + t;
      detail::sparse_row_head<T, R>(d, &q[qi * d.Dqk], keys, cand, sink.empty() ? nullptr : &sink[h], scale,
                                    dout.empty() ? nullptr : &dout[qi * d.Dv], r.lse[li], r.lse_c[li],
                                    &r.out[qi * d.Dv], sink.empty() ? nullptr : &r.dsink[h], &r.dq[qi * d.Dqk],
                                    dkeys);
    }
  }
  for (T& x : r.dkv) x = R::stored(x);
  return r;
}

extern template SparseRefResult<double> attn_sparse_ref<double>(const SparseDims&, const std::vector<double>&,
                                                                const std::vector<double>&, const std::vector<int32_t>&,
                                                                const std::vector<double>&, double,
                                                                const std::vector<double>&);
extern template SparseRefResult<float> attn_sparse_ref<float>(const SparseDims&, const std::vector<float>&,
                                                              const std::vector<float>&, const std::vector<int32_t>&,
                                                              const std::vector<float>&, float,
                                                              const std::vector<float>&);

}  // namespace hmla::ref
