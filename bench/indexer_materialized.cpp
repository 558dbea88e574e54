#include "indexer_materialized.h"

#include <cmath>
#include <cstring>

#include "cpu_kernels.h"

namespace hmla::bench {

using cpu::sgemm;
using cpu::Trans;

IndexerKlResult indexer_kl_materialized(const IndexerKlInputs& in) {
  const int64_t b = in.sc.qI.size(0), s = in.sc.qI.size(1), HI = in.sc.qI.size(2), DI = in.sc.qI.size(3);
  const int64_t H = in.q.size(2), Hkv = in.k.size(2), Dqk = in.q.size(3), group = H / Hkv;
  IndexerKlResult r{0, 0, Tensor::zeros(in.sc.qI.shape(), DType::f32), Tensor::zeros(in.sc.kI.shape(), DType::f32),
                    Tensor::zeros(in.sc.w.shape(), DType::f32)};
  Tensor Pt = Tensor::empty({s, s}, DType::f32), It = Tensor::empty({s, s}, DType::f32),
         Qt = Tensor::empty({s, s}, DType::f32), dIt = Tensor::empty({s, s}, DType::f32),
         St = Tensor::empty({s, s}, DType::f32);
  float *P = Pt.data<float>(), *I = It.data<float>(), *Q = Qt.data<float>(), *dI = dIt.data<float>(), *S = St.data<float>();
  const float* rw = in.row_weight.data<float>();
  double kl_sum = 0;
  for (int64_t bb = 0; bb < b; ++bb) {
    const int32_t* ds = in.sc.layout->doc_start.data<int32_t>() + bb * s;
    const float* qI = in.sc.qI.data<float>() + bb * s * HI * DI;
    const float* kI = in.sc.kI.data<float>() + bb * s * DI;
    const float* w = in.sc.w.data<float>() + bb * s * HI;
    auto allowed = [&](int64_t t, int64_t j) { return j >= ds[t] && j <= t; };
    std::memset(P, 0, s * s * sizeof(float));
    std::memset(I, 0, s * s * sizeof(float));
    for (int64_t h = 0; h < H; ++h) {  // P += softmax(l_h) / H
      sgemm(Trans::no, Trans::yes, s, s, Dqk, in.scale, in.q.data<float>() + bb * in.q.stride(0) + h * in.q.stride(2),
            in.q.stride(1), in.k.data<float>() + bb * in.k.stride(0) + (h / group) * in.k.stride(2), in.k.stride(1),
            0.f, S, s);
      const float* lse = in.lse_c.data<float>() + (bb * H + h) * s;
#pragma omp parallel for schedule(static)
      for (int64_t t = 0; t < s; ++t)
        for (int64_t j = 0; j < s; ++j)
          if (allowed(t, j)) P[t * s + j] += std::exp(S[t * s + j] - lse[t]) / float(H);
    }
    for (int64_t h = 0; h < HI; ++h) {  // I += w_h relu(qI_h kI^T)
      sgemm(Trans::no, Trans::yes, s, s, DI, 1.f, qI + h * DI, HI * DI, kI, DI, 0.f, S, s);
#pragma omp parallel for schedule(static)
      for (int64_t t = 0; t < s; ++t)
        for (int64_t j = 0; j < s; ++j) I[t * s + j] += w[t * HI + h] * std::max(S[t * s + j], 0.f);
    }
#pragma omp parallel for schedule(static) reduction(+ : kl_sum)
    for (int64_t t = 0; t < s; ++t) {  // Q, kl, dI
      float mx = -INFINITY;
      for (int64_t j = 0; j < s; ++j)
        if (allowed(t, j)) mx = std::max(mx, I[t * s + j]);
      float z = 0.f;
      for (int64_t j = 0; j < s; ++j) z += allowed(t, j) ? std::exp(I[t * s + j] - mx) : 0.f;
      const float lseI = mx + std::log(z);
      float kl = 0.f;
      for (int64_t j = 0; j < s; ++j) {
        const float p = P[t * s + j];
        Q[t * s + j] = allowed(t, j) ? std::exp(I[t * s + j] - lseI) : 0.f;
        if (p > 0.f) kl += p * (std::log(p) - (I[t * s + j] - lseI));
        dI[t * s + j] = in.coeff * rw[bb * s + t] * (Q[t * s + j] - p);
      }
      if (mx != -INFINITY) kl_sum += double(rw[bb * s + t]) * kl;
    }
    float* dqI = r.dqI.data<float>() + bb * s * HI * DI;
    float* dkI = r.dkI.data<float>() + bb * s * DI;
    float* dw = r.dw.data<float>() + bb * s * HI;
    for (int64_t h = 0; h < HI; ++h) {  // back through relu and the head weights
      sgemm(Trans::no, Trans::yes, s, s, DI, 1.f, qI + h * DI, HI * DI, kI, DI, 0.f, S, s);
#pragma omp parallel for schedule(static)
      for (int64_t t = 0; t < s; ++t) {
        float acc = 0.f;
        for (int64_t j = 0; j < s; ++j) {
          const float x = S[t * s + j];
          acc += dI[t * s + j] * std::max(x, 0.f);
          S[t * s + j] = x > 0.f ? dI[t * s + j] * w[t * HI + h] : 0.f;
        }
        dw[t * HI + h] = acc;
      }
      sgemm(Trans::no, Trans::no, s, DI, s, 1.f, S, s, kI, DI, 0.f, dqI + h * DI, HI * DI);
      sgemm(Trans::yes, Trans::no, s, DI, s, 1.f, S, s, qI + h * DI, HI * DI, 1.f, dkI, DI);
    }
  }
  r.kl_sum = kl_sum;
  r.loss = in.coeff * kl_sum;
  return r;
}

}  // namespace hmla::bench
