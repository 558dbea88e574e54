// Loops over materialised rows; no tiling and no code shared with the kernels.
#include "indexer_ref.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace hmla::ref {

template <class T>
std::vector<T> indexer_scores_ref(const IndexerDims& d, const std::vector<T>& qI, const std::vector<T>& kI,
                                  const std::vector<T>& w, const std::vector<int32_t>& doc_start) {
  std::vector<T> I(d.b * d.s * d.s, -std::numeric_limits<T>::infinity());
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t t = 0; t < d.s; ++t)
      for (int64_t j = doc_start[b * d.s + t]; j <= t; ++j) {
        T acc = 0;
        for (int64_t h = 0; h < d.HI; ++h) {
          T dot = 0;
          for (int64_t c = 0; c < d.DI; ++c)
            dot += qI[((b * d.s + t) * d.HI + h) * d.DI + c] * kI[(b * d.s + j) * d.DI + c];
          acc += w[(b * d.s + t) * d.HI + h] * std::max(dot, T(0));
        }
        I[(b * d.s + t) * d.s + j] = acc;
      }
  return I;
}

std::vector<int32_t> indexer_topk_ref(const IndexerDims& d, const std::vector<double>& I,
                                      const std::vector<int32_t>& doc_start, int64_t K, int64_t W) {
  std::vector<int32_t> out(d.b * d.s * (K + W), -1);
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t t = 0; t < d.s; ++t) {
      int32_t* row = &out[(b * d.s + t) * (K + W)];
      const int64_t lo = doc_start[b * d.s + t];
      if (lo > t) continue;
      const int64_t r_end = std::max<int64_t>(lo, t + 1 - W);  // R(t) = [lo, r_end)
      std::vector<int64_t> js(r_end - lo);
      std::iota(js.begin(), js.end(), lo);
      const double* Ir = &I[(b * d.s + t) * d.s];
      std::sort(js.begin(), js.end(), [&](int64_t x, int64_t y) { return Ir[x] != Ir[y] ? Ir[x] > Ir[y] : x < y; });
      int64_t n = 0;
      for (; n < std::min<int64_t>(K, js.size()); ++n) row[n] = int32_t(js[n]);
      for (int64_t j = r_end; j <= t; ++j) row[K + (j - r_end)] = int32_t(j);
    }
  return out;
}

template <class T>
KlRefResult<T> indexer_kl_ref(const IndexerDims& d, const KlAttn& a, const std::vector<T>& q,
                              const std::vector<T>& k, const std::vector<T>& qI, const std::vector<T>& kI,
                              const std::vector<T>& w, const std::vector<int32_t>& doc_start,
                              const std::vector<T>& row_weight, T coeff, const std::vector<int32_t>& topk,
                              int64_t K, T (*stored)(T)) {
  auto st = [&](T x) { return stored ? stored(x) : x; };
  KlRefResult<T> r;
  r.dqI.assign(qI.size(), T(0));
  r.dkI.assign(kI.size(), T(0));
  r.dw.assign(w.size(), T(0));
  r.kl.assign(d.b * d.s, T(0));
  const int64_t KW = topk.empty() ? 0 : int64_t(topk.size()) / (d.b * d.s);
  const int64_t group = a.H / a.Hkv;
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t t = 0; t < d.s; ++t) {
      const int64_t row = b * d.s + t;
      std::vector<int64_t> C;
      if (topk.empty()) {
        for (int64_t j = doc_start[row]; j <= t; ++j) C.push_back(j);
      } else {
        for (int64_t i = 0; i < K; ++i)
          if (topk[row * KW + i] >= 0) C.push_back(topk[row * KW + i]);
      }
      if (C.empty()) continue;
      const size_t n = C.size();
      std::vector<T> P(n, T(0)), I(n, T(0)), dot(n * d.HI);
      for (int64_t h = 0; h < a.H; ++h) {
        std::vector<T> l(n);
        T mx = -std::numeric_limits<T>::infinity();
        for (size_t i = 0; i < n; ++i) {
          T acc = 0;
          for (int64_t c = 0; c < a.Dqk; ++c)
            acc += q[(row * a.H + h) * a.Dqk + c] * k[((b * d.s + C[i]) * a.Hkv + h / group) * a.Dqk + c];
          l[i] = T(a.scale) * acc;
          mx = std::max(mx, l[i]);
        }
        T z = 0;
        for (size_t i = 0; i < n; ++i) z += std::exp(l[i] - mx);
        for (size_t i = 0; i < n; ++i) P[i] += std::exp(l[i] - mx - std::log(z)) / T(a.H);
      }
      T mx = -std::numeric_limits<T>::infinity();
      for (size_t i = 0; i < n; ++i) {
        for (int64_t h = 0; h < d.HI; ++h) {
          T acc = 0;
          for (int64_t c = 0; c < d.DI; ++c) acc += qI[(row * d.HI + h) * d.DI + c] * kI[(b * d.s + C[i]) * d.DI + c];
          dot[i * d.HI + h] = acc;
          I[i] += w[row * d.HI + h] * std::max(acc, T(0));
        }
        mx = std::max(mx, I[i]);
      }
      T z = 0;
      for (size_t i = 0; i < n; ++i) z += std::exp(I[i] - mx);
      const T lseI = mx + std::log(z);
      T kl = 0;
      for (size_t i = 0; i < n; ++i)
        if (P[i] > 0) kl += P[i] * (std::log(P[i]) - (I[i] - lseI));
      r.kl[row] = kl;
      r.kl_sum += double(row_weight[row]) * double(kl);
      const T g = coeff * row_weight[row];
      if (g == T(0)) continue;
      for (size_t i = 0; i < n; ++i) {
        const T dI = st(g * (std::exp(I[i] - lseI) - P[i]));
        for (int64_t h = 0; h < d.HI; ++h) {
          const T x = dot[i * d.HI + h];
          r.dw[row * d.HI + h] += dI * std::max(x, T(0));
          if (x <= 0) continue;
          const T ds = dI * w[row * d.HI + h], dsk = stored ? st(ds) : ds;
          for (int64_t c = 0; c < d.DI; ++c) {
            r.dqI[(row * d.HI + h) * d.DI + c] += ds * kI[(b * d.s + C[i]) * d.DI + c];
            r.dkI[(b * d.s + C[i]) * d.DI + c] += dsk * qI[(row * d.HI + h) * d.DI + c];
          }
        }
      }
    }
  r.loss = double(coeff) * r.kl_sum;
  return r;
}

#define HMLA_INSTANTIATE(T)                                                                              \
  template std::vector<T> indexer_scores_ref<T>(const IndexerDims&, const std::vector<T>&,               \
                                                const std::vector<T>&, const std::vector<T>&,            \
                                                const std::vector<int32_t>&);                            \
  template KlRefResult<T> indexer_kl_ref<T>(const IndexerDims&, const KlAttn&, const std::vector<T>&,    \
                                            const std::vector<T>&, const std::vector<T>&,                \
                                            const std::vector<T>&, const std::vector<T>&,                \
                                            const std::vector<int32_t>&, const std::vector<T>&, T,       \
                                            const std::vector<int32_t>&, int64_t, T (*)(T));
HMLA_INSTANTIATE(double)
HMLA_INSTANTIATE(float)
#undef HMLA_INSTANTIATE

}  // namespace hmla::ref
