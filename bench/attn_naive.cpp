#include "attn_naive.h"

#include <cmath>

#include "cpu_kernels.h"

namespace hmla::bench {

using cpu::sgemm;
using cpu::Trans;

namespace {

struct Geometry {
  int64_t b, s, H, Hkv, Dqk, Dv;
};

Geometry geometry(const AttnDenseInputs& in) {
  return {in.q.size(0), in.q.size(1), in.q.size(2), in.k.size(2), in.q.size(3), in.v.size(3)};
}

// S = scale * Q_h K_h^T over the whole row, masked to A(t), as probabilities P = exp(S - lse).
void probabilities(const AttnDenseInputs& in, const Geometry& g, int64_t b, int64_t h,
                   const float* lse, float* P) {
  const int64_t hk = h / (g.H / g.Hkv);
  const float* Q = in.q.data<float>() + b * in.q.stride(0) + h * in.q.stride(2);
  const float* K = in.k.data<float>() + b * in.k.stride(0) + hk * in.k.stride(2);
  sgemm(Trans::no, Trans::yes, g.s, g.s, g.Dqk, in.scale, Q, in.q.stride(1), K, in.k.stride(1), 0.f,
        P, g.s);
  const int32_t* ds = in.layout->doc_start.data<int32_t>() + b * g.s;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < g.s; ++t) {
    float* row = P + t * g.s;
    for (int64_t j = 0; j < g.s; ++j) {
      const bool allowed = j >= ds[t] && j <= t;
      row[j] = allowed ? std::exp(row[j] - lse[t]) : 0.f;
    }
  }
}

}  // namespace

AttnDenseSaved attn_naive_fwd(const AttnDenseInputs& in) {
  const Geometry g = geometry(in);
  AttnDenseSaved out{Tensor::zeros({g.b, g.s, g.H, g.Dv}, DType::f32),
                     Tensor::empty({g.b, g.H, g.s}, DType::f32)};
  Tensor S = Tensor::empty({g.s, g.s}, DType::f32);
  for (int64_t b = 0; b < g.b; ++b)
    for (int64_t h = 0; h < g.H; ++h) {
      const int64_t hk = h / (g.H / g.Hkv);
      const float* Q = in.q.data<float>() + b * in.q.stride(0) + h * in.q.stride(2);
      const float* K = in.k.data<float>() + b * in.k.stride(0) + hk * in.k.stride(2);
      const float* V = in.v.data<float>() + b * in.v.stride(0) + hk * in.v.stride(2);
      float* P = S.data<float>();
      float* lse = out.lse.data<float>() + (b * g.H + h) * g.s;
      sgemm(Trans::no, Trans::yes, g.s, g.s, g.Dqk, in.scale, Q, in.q.stride(1), K, in.k.stride(1),
            0.f, P, g.s);
      const int32_t* ds = in.layout->doc_start.data<int32_t>() + b * g.s;
      const float sink = in.sink.defined() ? in.sink.data<float>()[h] : -INFINITY;
#pragma omp parallel for schedule(static)
      for (int64_t t = 0; t < g.s; ++t) {
        float* row = P + t * g.s;
        float mx = -INFINITY;
        for (int64_t j = 0; j < g.s; ++j) {
          if (!(j >= ds[t] && j <= t)) row[j] = -INFINITY;
          mx = std::max(mx, row[j]);
        }
        if (mx == -INFINITY) {  // empty row
          for (int64_t j = 0; j < g.s; ++j) row[j] = 0.f;
          lse[t] = INFINITY;
          continue;
        }
        mx = std::max(mx, sink);
        float z = std::exp(sink - mx);
        for (int64_t j = 0; j < g.s; ++j) z += (row[j] = std::exp(row[j] - mx));
        for (int64_t j = 0; j < g.s; ++j) row[j] /= z;
        lse[t] = mx + std::log(z);
      }
      float* O = out.out.data<float>() + b * g.s * g.H * g.Dv + h * g.Dv;
      sgemm(Trans::no, Trans::no, g.s, g.Dv, g.s, 1.f, P, g.s, V, in.v.stride(1), 0.f, O, g.H * g.Dv);
    }
  return out;
}

AttnDenseGrads attn_naive_bwd(const AttnDenseInputs& in, const AttnDenseSaved& saved,
                              const Tensor& dout) {
  const Geometry g = geometry(in);
  AttnDenseGrads gr{Tensor::zeros(in.q.shape(), DType::f32), Tensor::zeros(in.k.shape(), DType::f32),
                    Tensor::zeros(in.v.shape(), DType::f32),
                    in.sink.defined() ? Tensor::zeros({g.H}, DType::f32) : Tensor()};
  Tensor Pt = Tensor::empty({g.s, g.s}, DType::f32), dPt = Tensor::empty({g.s, g.s}, DType::f32);
  float* P = Pt.data<float>();
  float* dP = dPt.data<float>();
  const int64_t ldo = g.H * g.Dv, ldq = g.H * g.Dqk, ldk = g.Hkv * g.Dqk, ldv = g.Hkv * g.Dv;
  for (int64_t b = 0; b < g.b; ++b)
    for (int64_t h = 0; h < g.H; ++h) {
      const int64_t hk = h / (g.H / g.Hkv);
      const float* lse = saved.lse.data<float>() + (b * g.H + h) * g.s;
      probabilities(in, g, b, h, lse, P);
      const float* Q = in.q.data<float>() + b * in.q.stride(0) + h * in.q.stride(2);
      const float* K = in.k.data<float>() + b * in.k.stride(0) + hk * in.k.stride(2);
      const float* V = in.v.data<float>() + b * in.v.stride(0) + hk * in.v.stride(2);
      const float* O = saved.out.data<float>() + b * g.s * ldo + h * g.Dv;
      const float* dO = dout.data<float>() + b * g.s * ldo + h * g.Dv;
      float* dQ = gr.dq.data<float>() + b * g.s * ldq + h * g.Dqk;
      float* dK = gr.dk.data<float>() + b * g.s * ldk + hk * g.Dqk;
      float* dV = gr.dv.data<float>() + b * g.s * ldv + hk * g.Dv;
      sgemm(Trans::yes, Trans::no, g.s, g.Dv, g.s, 1.f, P, g.s, dO, ldo, 1.f, dV, ldv);
      sgemm(Trans::no, Trans::yes, g.s, g.s, g.Dv, 1.f, dO, ldo, V, in.v.stride(1), 0.f, dP, g.s);
      float dsink = 0.f;
#pragma omp parallel for schedule(static) reduction(+ : dsink)
      for (int64_t t = 0; t < g.s; ++t) {
        float D = 0.f;
        for (int64_t c = 0; c < g.Dv; ++c) D += O[t * ldo + c] * dO[t * ldo + c];
        if (in.sink.defined() && std::isfinite(lse[t]))
          dsink -= std::exp(in.sink.data<float>()[h] - lse[t]) * D;
        for (int64_t j = 0; j < g.s; ++j) dP[t * g.s + j] = P[t * g.s + j] * (dP[t * g.s + j] - D) * in.scale;
      }
      if (in.sink.defined()) gr.dsink.data<float>()[h] += dsink;
      sgemm(Trans::no, Trans::no, g.s, g.Dqk, g.s, 1.f, dP, g.s, K, in.k.stride(1), 0.f, dQ, ldq);
      sgemm(Trans::yes, Trans::no, g.s, g.Dqk, g.s, 1.f, dP, g.s, Q, in.q.stride(1), 1.f, dK, ldk);
    }
  return gr;
}

}  // namespace hmla::bench
