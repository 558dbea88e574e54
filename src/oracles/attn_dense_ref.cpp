// Per (batch row, head, query row): scores over A(t), softmax (with the sink in the
// denominator), output; backward from the textbook formulas dl = P * (dP - D), D = dout . out,
// dsink = -P_sink * D. Deliberately simple: loops only, no tiling, no shared code with kernels.
#include "attn_dense_ref.h"

#include <cmath>
#include <limits>

namespace hmla::ref {

template <class T>
AttnRefResult<T> attn_dense_ref(const AttnDims& d, const std::vector<T>& q, const std::vector<T>& k,
                                const std::vector<T>& v, const std::vector<int32_t>& doc_start,
                                const std::vector<T>& sink, T scale, const std::vector<T>& dout) {
  const bool bwd = !dout.empty();
  AttnRefResult<T> r;
  r.out.assign(d.b * d.s * d.H * d.Dv, T(0));
  r.lse.assign(d.b * d.H * d.s, T(0));
  if (bwd) {
    r.dq.assign(q.size(), T(0));
    r.dk.assign(k.size(), T(0));
    r.dv.assign(v.size(), T(0));
    if (!sink.empty()) r.dsink.assign(d.H, T(0));
  }
  const int64_t group = d.H / d.Hkv;
  std::vector<T> l(d.s), P(d.s);
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t hk = h / group;
      for (int64_t t = 0; t < d.s; ++t) {
        const int64_t lo = doc_start[b * d.s + t];
        const T* qt = &q[((b * d.s + t) * d.H + h) * d.Dqk];
        T* o = &r.out[((b * d.s + t) * d.H + h) * d.Dv];
        T& lse = r.lse[(b * d.H + h) * d.s + t];
        if (lo > t) {
          lse = std::numeric_limits<T>::infinity();
          continue;
        }
        T mx = -std::numeric_limits<T>::infinity();
        for (int64_t j = lo; j <= t; ++j) {
          const T* kj = &k[((b * d.s + j) * d.Hkv + hk) * d.Dqk];
          T acc = 0;
          for (int64_t c = 0; c < d.Dqk; ++c) acc += qt[c] * kj[c];
          l[j] = scale * acc;
          mx = std::max(mx, l[j]);
        }
        if (!sink.empty()) mx = std::max(mx, sink[h]);
        T z = 0;
        for (int64_t j = lo; j <= t; ++j) z += std::exp(l[j] - mx);
        if (!sink.empty()) z += std::exp(sink[h] - mx);
        lse = mx + std::log(z);
        for (int64_t j = lo; j <= t; ++j) {
          P[j] = std::exp(l[j] - lse);
          const T* vj = &v[((b * d.s + j) * d.Hkv + hk) * d.Dv];
          for (int64_t c = 0; c < d.Dv; ++c) o[c] += P[j] * vj[c];
        }
        if (!bwd) continue;
        const T* g = &dout[((b * d.s + t) * d.H + h) * d.Dv];
        T D = 0;
        for (int64_t c = 0; c < d.Dv; ++c) D += g[c] * o[c];
        if (!sink.empty()) r.dsink[h] -= std::exp(sink[h] - lse) * D;
        T* dqt = &r.dq[((b * d.s + t) * d.H + h) * d.Dqk];
        for (int64_t j = lo; j <= t; ++j) {
          const T* kj = &k[((b * d.s + j) * d.Hkv + hk) * d.Dqk];
          const T* vj = &v[((b * d.s + j) * d.Hkv + hk) * d.Dv];
          T* dkj = &r.dk[((b * d.s + j) * d.Hkv + hk) * d.Dqk];
          T* dvj = &r.dv[((b * d.s + j) * d.Hkv + hk) * d.Dv];
          T dP = 0;
          for (int64_t c = 0; c < d.Dv; ++c) {
            dP += g[c] * vj[c];
            dvj[c] += P[j] * g[c];
          }
          const T dl = P[j] * (dP - D) * scale;
          for (int64_t c = 0; c < d.Dqk; ++c) {
            dqt[c] += dl * kj[c];
            dkj[c] += dl * qt[c];
          }
        }
      }
    }
  return r;
}

template AttnRefResult<double> attn_dense_ref<double>(const AttnDims&, const std::vector<double>&,
                                                      const std::vector<double>&,
                                                      const std::vector<double>&,
                                                      const std::vector<int32_t>&,
                                                      const std::vector<double>&, double,
                                                      const std::vector<double>&);
template AttnRefResult<float> attn_dense_ref<float>(const AttnDims&, const std::vector<float>&,
                                                    const std::vector<float>&,
                                                    const std::vector<float>&,
                                                    const std::vector<int32_t>&,
                                                    const std::vector<float>&, float,
                                                    const std::vector<float>&);

}  // namespace hmla::ref
