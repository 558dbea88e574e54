#include "attn_sparse_ref.h"

#include <cmath>
#include <limits>

namespace hmla::ref {

template <class T>
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
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t t = 0; t < d.s; ++t) {
      std::vector<int64_t> js, cand;
      for (int64_t i = 0; i < d.KW; ++i) {
        const int32_t j = idx[(b * d.s + t) * d.KW + i];
        if (j < 0) continue;
        js.push_back(j);
        cand.push_back(i < d.K);
      }
      if (js.empty()) continue;
      for (int64_t h = 0; h < d.H; ++h) {
        const T* qh = &q[((b * d.s + t) * d.H + h) * d.Dqk];
        std::vector<T> l(js.size());
        T mx = -inf, mc = -inf;
        for (size_t i = 0; i < js.size(); ++i) {
          T acc = 0;
          for (int64_t c = 0; c < d.Dqk; ++c) acc += qh[c] * kv[(b * d.s + js[i]) * d.Dqk + c];
          l[i] = scale * acc;
          mx = std::max(mx, l[i]);
          if (cand[i]) mc = std::max(mc, l[i]);
        }
        T z = 0, zc = 0;
        for (size_t i = 0; i < js.size(); ++i) {
          z += std::exp(l[i] - mx);
          if (cand[i]) zc += std::exp(l[i] - mc);
        }
        if (!sink.empty()) z += std::exp(sink[h] - mx);
        const T lse = mx + std::log(z);
        r.lse[(b * d.H + h) * d.s + t] = lse;
        if (zc > 0) r.lse_c[(b * d.H + h) * d.s + t] = mc + std::log(zc);
        T* o = &r.out[((b * d.s + t) * d.H + h) * d.Dv];
        for (size_t i = 0; i < js.size(); ++i)
          for (int64_t c = 0; c < d.Dv; ++c) o[c] += std::exp(l[i] - lse) * kv[(b * d.s + js[i]) * d.Dqk + c];
        if (dout.empty()) continue;
        const T* g = &dout[((b * d.s + t) * d.H + h) * d.Dv];
        T D = 0;
        for (int64_t c = 0; c < d.Dv; ++c) D += g[c] * o[c];
        if (!sink.empty()) r.dsink[h] -= std::exp(sink[h] - lse) * D;
        for (size_t i = 0; i < js.size(); ++i) {
          const T P = std::exp(l[i] - lse);
          T* dk = &r.dkv[(b * d.s + js[i]) * d.Dqk];
          const T* k = &kv[(b * d.s + js[i]) * d.Dqk];
          T dP = 0;
          for (int64_t c = 0; c < d.Dv; ++c) {
            dP += g[c] * k[c];
            dk[c] += P * g[c];
          }
          const T dl = P * (dP - D) * scale;
          for (int64_t c = 0; c < d.Dqk; ++c) {
            r.dq[((b * d.s + t) * d.H + h) * d.Dqk + c] += dl * k[c];
            dk[c] += dl * qh[c];
          }
        }
      }
    }
  return r;
}

template SparseRefResult<double> attn_sparse_ref<double>(const SparseDims&, const std::vector<double>&,
                                                         const std::vector<double>&, const std::vector<int32_t>&,
                                                         const std::vector<double>&, double,
                                                         const std::vector<double>&);
template SparseRefResult<float> attn_sparse_ref<float>(const SparseDims&, const std::vector<float>&,
                                                       const std::vector<float>&, const std::vector<int32_t>&,
                                                       const std::vector<float>&, float, const std::vector<float>&);

}  // namespace hmla::ref
