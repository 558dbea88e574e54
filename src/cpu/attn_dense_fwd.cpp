// Dense per-document causal attention forward on the CPU, flash style: per (batch row, head,
// query tile), an online softmax over key tiles of the tile's document range; products through
// sgemm, exp vectorised. Saves lse per (head, row); nothing of size s*s exists. Each work item
// writes only its own rows, so results do not depend on the thread count.
#include <omp.h>

#include <cmath>
#include <vector>

#include "attn_dense_tile.h"
#include "cpu_kernels.h"
#include "hmla/ops/attention.h"
#include "softmax_tile.h"

namespace hmla::cpu {

namespace {

using T = AttnCpuTraits;

struct FwdScratch {
  float* S;    // [kBq, kBk] scores, then probabilities
  float* O;    // [kBq, Dv] unnormalised output
  float* m;    // [kBq] running max
  float* l;    // [kBq] running sum
};

void fwd_tile(const AttnDenseParams& p, int64_t b, int64_t h, const QueryTile& qt,
              const FwdScratch& w) {
  const int64_t hk = h / (p.H / p.Hkv);
  const int64_t lt0 = qt.t0 - p.q_row0;  // the tile's first local query row
  const float* Q = static_cast<const float*>(p.q) + b * p.q_bstride + lt0 * p.q_rstride + h * p.q_hstride;
  const float* K = static_cast<const float*>(p.k) + b * p.k_bstride + hk * p.k_hstride;
  const float* V = static_cast<const float*>(p.v) + b * p.v_bstride + hk * p.v_hstride;
  const int64_t nq = qt.nq, Dv = p.Dv;
  std::fill(w.O, w.O + nq * Dv, 0.f);
  std::fill(w.m, w.m + nq, -INFINITY);
  std::fill(w.l, w.l + nq, 0.f);

  for (int64_t j0 = qt.jmin; j0 <= qt.jmax; j0 += T::kBk) {
    const int64_t nk = std::min(T::kBk, qt.jmax + 1 - j0);
    sgemm(Trans::no, Trans::yes, nq, nk, p.Dqk, p.scale, Q, p.q_rstride, K + j0 * p.k_rstride,
          p.k_rstride, 0.f, w.S, nk);
    if (!qt.full(j0, nk)) qt.mask(w.S, j0, nk);
    softmax_online_tile(w.S, nq, nk, w.m, w.l, w.O, Dv);
    sgemm(Trans::no, Trans::no, nq, Dv, nk, 1.f, w.S, nk, V + j0 * p.v_rstride, p.v_rstride, 1.f,
          w.O, Dv);
  }

  float* out = static_cast<float*>(p.out);
  for (int64_t r = 0; r < nq; ++r) {
    const int64_t t = lt0 + r;
    float* o = out + ((b * p.sq + t) * p.H + h) * Dv;
    float* lse = p.lse + (b * p.H + h) * p.sq + t;
    if (w.l[r] == 0.f) {  // empty row: output 0, lse = +inf
      std::fill(o, o + Dv, 0.f);
      *lse = INFINITY;
      continue;
    }
    float denom = w.l[r];
    if (p.sink) denom += std::exp(p.sink[h] - w.m[r]);
    const float inv = 1.f / denom;
    const float* acc = w.O + r * Dv;
#pragma omp simd
    for (int64_t d = 0; d < Dv; ++d) o[d] = acc[d] * inv;
    *lse = w.m[r] + std::log(denom);
  }
}

}  // namespace

void attn_dense_fwd(const AttnDenseParams& p) {
  const int64_t ntiles = (p.sq + T::kBq - 1) / T::kBq;
  const int64_t nitems = p.b * p.H * ntiles;
  const int nthreads = omp_get_max_threads();
  const int64_t per_thread = T::kBq * T::kBk + T::kBq * p.Dv + 2 * T::kBq;
  Tensor scratch = Tensor::empty({nthreads, per_thread}, DType::f32);

#pragma omp parallel num_threads(nthreads)
  {
    float* base = scratch.data<float>() + omp_get_thread_num() * per_thread;
    FwdScratch w{base, base + T::kBq * T::kBk, base + T::kBq * T::kBk + T::kBq * p.Dv,
                 base + T::kBq * T::kBk + T::kBq * p.Dv + T::kBq};
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < nitems; ++item) {
      const int64_t b = item / (p.H * ntiles);
      const int64_t h = (item / ntiles) % p.H;
      const int64_t tile = ntiles - 1 - item % ntiles;  // longest key ranges first
      QueryTile qt = make_query_tile(p.doc_start + b * p.s, p.q_row0 + p.sq, p.q_row0 + tile * T::kBq, T::kBq);
      fwd_tile(p, b, h, qt, w);
    }
  }
}

// The CPU's plan for both passes (cpu_kernels.h): f32, any widths; one implementation, so the
// attention backend switch (auto, hmla) changes nothing here.
Plan plan(Op, const AttnDenseParams& p) { return plan_if(f32(p.dtype), Variant::cpu); }

}  // namespace hmla::cpu
