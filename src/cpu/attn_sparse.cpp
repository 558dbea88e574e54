// Sparse latent MQA attention on the CPU. Work item = one query row: its listed keys are
// gathered once (candidates first, then window keys) and shared by all H heads, so each row is
// two products forward ([H, n] logits, [H, Dv] output) and four backward. dkv sums over rows:
// each thread accumulates into its own partial, added in thread order at the end; rows are
// statically assigned, so the bits are fixed for a thread count.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "cpu_kernels.h"
#include "hmla/ops/sparse_attention.h"
#include "partials.h"
#include "softmax_tile.h"

namespace hmla::cpu {

namespace {

// Gathers row `row`'s keys into Kg [n, Dqk] (slots < K first); returns n, sets nc (candidates).
int64_t gather(const AttnSparseParams& g, int64_t row, float* Kg, int32_t* js, int64_t& nc) {
  const int32_t* idx = g.idx;
  const float* kv = static_cast<const float*>(g.kv);
  const int64_t bb = row / g.sq;
  int64_t n = 0;
  for (int pass = 0; pass < 2; ++pass)
    for (int64_t i = pass ? g.K : 0; i < (pass ? g.KW : g.K); ++i) {
      const int32_t j = idx[row * g.KW + i];
      if (j < 0) continue;
      js[n] = j;
      std::memcpy(Kg + n * g.Dqk, kv + (bb * g.skv + j) * g.Dqk, g.Dqk * sizeof(float));
      ++n;
    }
  nc = 0;
  for (int64_t i = 0; i < g.K; ++i) nc += idx[row * g.KW + i] >= 0;
  return n;
}

constexpr int64_t kRowChunk = 16;  // static chunks: rows near the start have fewer keys

}  // namespace

void attn_sparse_fwd(const AttnSparseParams& g) {
  const int nthreads = omp_get_max_threads();
  const int64_t per_thread = g.KW * g.Dqk + g.H * g.KW;
  Tensor scratch = Tensor::empty({nthreads, per_thread}, DType::f32);
  std::vector<std::vector<int32_t>> js(nthreads, std::vector<int32_t>(g.KW));
  const float* q = static_cast<const float*>(g.q);
  float *out = static_cast<float*>(g.out), *lse = g.lse;
  float* lse_c = g.K > 0 ? g.lse_c : nullptr;
#pragma omp parallel num_threads(nthreads)
  {
    const int th = omp_get_thread_num();
    float* Kg = scratch.data<float>() + th * per_thread;
    float* L = Kg + g.KW * g.Dqk;
#pragma omp for schedule(static, kRowChunk)
    for (int64_t row = 0; row < g.b * g.sq; ++row) {
      const int64_t bb = row / g.sq, t = row % g.sq;
      int64_t nc = 0;
      const int64_t n = gather(g, row, Kg, js[th].data(), nc);
      float* o = out + row * g.H * g.Dv;
      if (n == 0) {
        std::memset(o, 0, g.H * g.Dv * sizeof(float));
        for (int64_t h = 0; h < g.H; ++h) {
          lse[(bb * g.H + h) * g.sq + t] = INFINITY;
          if (lse_c) lse_c[(bb * g.H + h) * g.sq + t] = INFINITY;
        }
        continue;
      }
      const float* Q = q + bb * g.q_bstride + t * g.q_rstride;
      sgemm(Trans::no, Trans::yes, g.H, n, g.Dqk, g.scale, Q, g.q_hstride, Kg, g.Dqk, 0.f, L, n);
      for (int64_t h = 0; h < g.H; ++h) {
        float* l = L + h * n;
        if (lse_c) {  // over the candidates only, no sink
          float mc = -INFINITY;
          for (int64_t i = 0; i < nc; ++i) mc = std::max(mc, l[i]);
          float zc = 0.f;
          for (int64_t i = 0; i < nc; ++i) zc += std::exp(l[i] - mc);
          lse_c[(bb * g.H + h) * g.sq + t] = nc > 0 ? mc + std::log(zc) : INFINITY;
        }
        float m = -INFINITY, z = 0.f;
        softmax_online_tile(l, 1, n, &m, &z, nullptr, 0);  // l = exp(l - m), z = sum
        if (g.sink) z += std::exp(g.sink[h] - m);
        const float inv = 1.f / z;
        for (int64_t i = 0; i < n; ++i) l[i] *= inv;
        lse[(bb * g.H + h) * g.sq + t] = m + std::log(z);
      }
      sgemm(Trans::no, Trans::no, g.H, g.Dv, n, 1.f, L, n, Kg, g.Dqk, 0.f, o, g.Dv);
    }
  }
}

void attn_sparse_bwd(const AttnSparseParams& g) {
  const int nthreads = omp_get_max_threads();
  const int64_t per_thread = 2 * g.KW * g.Dqk + 2 * g.H * g.KW + g.H;
  Tensor scratch = Tensor::empty({nthreads, per_thread}, DType::f32);
  Tensor partial = Tensor::zeros({nthreads, g.b * g.skv * g.Dqk}, DType::f32);
  Tensor dsink_part = Tensor::zeros({nthreads, g.H}, DType::f32);
  std::vector<std::vector<int32_t>> js(nthreads, std::vector<int32_t>(g.KW));
  const float *q = static_cast<const float*>(g.q), *dO = static_cast<const float*>(g.dout);
  const float *out = static_cast<const float*>(g.out), *lse = g.lse;
  float* dq = static_cast<float*>(g.dq);
#pragma omp parallel num_threads(nthreads)
  {
    const int th = omp_get_thread_num();
    float* Kg = scratch.data<float>() + th * per_thread;
    float* dKg = Kg + g.KW * g.Dqk;
    float* P = dKg + g.KW * g.Dqk;
    float* dS = P + g.H * g.KW;
    float* D = dS + g.H * g.KW;
    float* dkv = partial.data<float>() + th * g.b * g.skv * g.Dqk;
    float* dsink = dsink_part.data<float>() + th * g.H;
#pragma omp for schedule(static, kRowChunk)
    for (int64_t row = 0; row < g.b * g.sq; ++row) {
      const int64_t bb = row / g.sq, t = row % g.sq;
      float* dq_t = dq + row * g.H * g.Dqk;
      int64_t nc = 0;
      const int64_t n = gather(g, row, Kg, js[th].data(), nc);
      if (n == 0) {
        std::memset(dq_t, 0, g.H * g.Dqk * sizeof(float));
        continue;
      }
      const float* Q = q + bb * g.q_bstride + t * g.q_rstride;
      const float* dO_t = dO + row * g.H * g.Dv;
      const float* O_t = out + row * g.H * g.Dv;
      sgemm(Trans::no, Trans::yes, g.H, n, g.Dqk, g.scale, Q, g.q_hstride, Kg, g.Dqk, 0.f, P, n);
      for (int64_t h = 0; h < g.H; ++h) {
        const float l = lse[(bb * g.H + h) * g.sq + t];
        for (int64_t i = 0; i < n; ++i) P[h * n + i] = std::exp(P[h * n + i] - l);
        float d = 0.f;
        for (int64_t c = 0; c < g.Dv; ++c) d += dO_t[h * g.Dv + c] * O_t[h * g.Dv + c];
        D[h] = d;
        // lse = +inf only with a sink of +inf (a listed key makes it finite otherwise): out is 0,
        // so D is 0 and the sink's share exp(sink - lse) (inf - inf) is no term: 0, not NaN.
        if (g.sink && std::isfinite(l)) dsink[h] -= std::exp(g.sink[h] - l) * d;
      }
      sgemm(Trans::no, Trans::yes, g.H, n, g.Dv, 1.f, dO_t, g.Dv, Kg, g.Dqk, 0.f, dS, n);  // dP
      dscores_tile(dS, P, g.H, n, D, g.scale);
      sgemm(Trans::no, Trans::no, g.H, g.Dqk, n, 1.f, dS, n, Kg, g.Dqk, 0.f, dq_t, g.Dqk);
      sgemm(Trans::yes, Trans::no, n, g.Dqk, g.H, 1.f, dS, n, Q, g.q_hstride, 0.f, dKg, g.Dqk);
      sgemm(Trans::yes, Trans::no, n, g.Dv, g.H, 1.f, P, n, dO_t, g.Dv, 1.f, dKg, g.Dqk);
      for (int64_t i = 0; i < n; ++i) {
        float* dst = dkv + (bb * g.skv + js[th][i]) * g.Dqk;
        const float* src = dKg + i * g.Dqk;
        for (int64_t c = 0; c < g.Dqk; ++c) dst[c] += src[c];
      }
    }
  }
  sum_thread_partials(static_cast<float*>(g.dkv), partial.data<float>(), nthreads, g.b * g.skv * g.Dqk);
  if (g.sink) add_thread_partials(g.dsink, dsink_part.data<float>(), nthreads, g.H);  // a parameter's gradient: added
}

// -1 or a position of the row; no key twice (stamps: O(s * (K + W)) in all).
void attn_sparse_check_table(const AttnSparseParams& p) {
  const int64_t s = p.sq, KW = p.KW, skv = p.skv;
  const int32_t* idx = p.idx;
  std::vector<int64_t> stamp(skv, -1);
  for (int64_t row = 0; row < p.b * s; ++row)
    for (int64_t i = 0; i < KW; ++i) {
      const int32_t j = idx[row * KW + i];
      if (j == -1) continue;
      HMLA_CHECK(j >= 0 && j < skv, ShapeError, "sparse attention: idx[", row / s, ", ", row % s, ", ", i, "] = ", j,
                 " is neither -1 nor a key position in [0, ", skv, ")");
      HMLA_CHECK(stamp[j] != row, ShapeError, "sparse attention: row ", row % s, " of batch ", row / s,
                 " lists key ", j, " twice; duplicates are not allowed");
      stamp[j] = row;
    }
}

// The CPU's plan for the check and both passes (cpu_kernels.h): f32, any widths.
Plan plan(Op, const AttnSparseParams& p) { return plan_if(f32(p.dtype), Variant::cpu); }

}  // namespace hmla::cpu
