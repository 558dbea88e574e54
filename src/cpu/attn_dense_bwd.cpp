// Dense per-document causal attention backward on the CPU, flash style: P is recomputed tile by
// tile from q, k and the saved lse; D = rowsum(dout * out); dS = P * (dP - D). Five products per
// (query tile, key tile): S = QK^T, dV += P^T dO, dP = dO V^T, dQ += dS K, dK += dS^T Q.
//
// Determinism: a work item is (batch row, kv head, slice of that kv head's query heads). It owns
// the dq rows of its heads and one dk/dv accumulator for its kv head, so no two threads ever
// write the same element. With GQA/MQA the query heads of a kv head are cut into slices (only
// as many as there are threads to feed); slice 0 accumulates straight into dk/dv, the others
// into scratch that is summed into dk/dv afterwards in slice order. Results therefore depend on
// the thread count only through the number of slices, and never on scheduling.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "attn_dense_tile.h"
#include "cpu_kernels.h"
#include "hmla/ops/attention.h"
#include "softmax_tile.h"

namespace hmla::cpu {

namespace {

using T = AttnCpuTraits;

struct BwdScratch {
  float* P;   // [kBq, kBk] probabilities
  float* dS;  // [kBq, kBk] dP, then dS
  float* D;   // [kBq] rowsum(dout * out)
};

struct KvAccum {  // where one work item accumulates dk and dv of its kv head
  float* dk;
  int64_t ldk;
  float* dv;
  int64_t ldv;
};

// One query tile of head h against its whole key range. Returns this tile's share of dsink[h].
float bwd_tile(const AttnDenseParams& p, int64_t b, int64_t h, const QueryTile& qt,
               const KvAccum& acc, const BwdScratch& w) {
  const int64_t hk = h / (p.H / p.Hkv);
  const int64_t nq = qt.nq, Dv = p.Dv, Dqk = p.Dqk;
  const int64_t lt0 = qt.t0 - p.q_row0;  // the tile's first local query row
  const float* Q = static_cast<const float*>(p.q) + b * p.q_bstride + lt0 * p.q_rstride + h * p.q_hstride;
  const float* K = static_cast<const float*>(p.k) + b * p.k_bstride + hk * p.k_hstride;
  const float* V = static_cast<const float*>(p.v) + b * p.v_bstride + hk * p.v_hstride;
  const int64_t ld_o = p.H * Dv, ld_q = p.H * Dqk;  // out, dout and dq are contiguous
  const float* O = static_cast<const float*>(p.out) + ((b * p.sq + lt0) * p.H + h) * Dv;
  const float* dO = static_cast<const float*>(p.dout) + ((b * p.sq + lt0) * p.H + h) * Dv;
  float* dQ = static_cast<float*>(p.dq) + ((b * p.sq + lt0) * p.H + h) * Dqk;
  const float* lse = p.lse + (b * p.H + h) * p.sq + lt0;

  float dsink = 0.f;
  for (int64_t r = 0; r < nq; ++r) {
    std::fill(dQ + r * ld_q, dQ + r * ld_q + Dqk, 0.f);
    float d = 0.f;
    const float* o = O + r * ld_o;
    const float* g = dO + r * ld_o;
#pragma omp simd reduction(+ : d)
    for (int64_t c = 0; c < Dv; ++c) d += o[c] * g[c];
    w.D[r] = d;
    if (p.sink && std::isfinite(lse[r])) dsink -= std::exp(p.sink[h] - lse[r]) * d;
  }

  for (int64_t j0 = qt.jmin; j0 <= qt.jmax; j0 += T::kBk) {
    const int64_t nk = std::min(T::kBk, qt.jmax + 1 - j0);
    sgemm(Trans::no, Trans::yes, nq, nk, Dqk, p.scale, Q, p.q_rstride, K + j0 * p.k_rstride,
          p.k_rstride, 0.f, w.P, nk);
    if (!qt.full(j0, nk)) qt.mask(w.P, j0, nk);
    probs_from_lse_tile(w.P, nq, nk, lse);  // +inf on empty rows: P = 0
    sgemm(Trans::yes, Trans::no, nk, Dv, nq, 1.f, w.P, nk, dO, ld_o, 1.f, acc.dv + j0 * acc.ldv,
          acc.ldv);
    sgemm(Trans::no, Trans::yes, nq, nk, Dv, 1.f, dO, ld_o, V + j0 * p.v_rstride, p.v_rstride, 0.f,
          w.dS, nk);
    dscores_tile(w.dS, w.P, nq, nk, w.D, p.scale);
    sgemm(Trans::no, Trans::no, nq, Dqk, nk, 1.f, w.dS, nk, K + j0 * p.k_rstride, p.k_rstride, 1.f,
          dQ, ld_q);
    sgemm(Trans::yes, Trans::no, nk, Dqk, nq, 1.f, w.dS, nk, Q, p.q_rstride, 1.f,
          acc.dk + j0 * acc.ldk, acc.ldk);
  }
  return dsink;
}

void zero_rows(float* x, int64_t rows, int64_t width, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) std::memset(x + r * ld, 0, width * sizeof(float));
}

}  // namespace

void attn_dense_bwd(const AttnDenseParams& p) {
  const int64_t group = p.H / p.Hkv;
  const int nthreads = omp_get_max_threads();
  const int64_t kv_items = p.b * p.Hkv;
  const int64_t nslices = std::min<int64_t>(group, (nthreads + kv_items - 1) / kv_items);
  const int64_t nitems = kv_items * nslices;
  const int64_t ntiles = (p.sq + T::kBq - 1) / T::kBq;
  const int64_t wkv = p.Dqk + p.Dv;  // width of one scratch dk|dv row

  const int64_t per_thread = 2 * T::kBq * T::kBk + T::kBq;
  Tensor scratch = Tensor::empty({nthreads, per_thread}, DType::f32);
  Tensor kv_scratch = Tensor::empty({kv_items * (nslices - 1), p.s, wkv}, DType::f32);
  Tensor dsink_part = Tensor::zeros({p.b, p.H}, DType::f32);
  float* dk = static_cast<float*>(p.dk);
  float* dv = static_cast<float*>(p.dv);
  const int64_t ldk = p.Hkv * p.Dqk, ldv = p.Hkv * p.Dv;

#pragma omp parallel num_threads(nthreads)
  {
    float* base = scratch.data<float>() + omp_get_thread_num() * per_thread;
    BwdScratch w{base, base + T::kBq * T::kBk, base + 2 * T::kBq * T::kBk};
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < nitems; ++item) {
      const int64_t kv = item / nslices, slice = item % nslices;
      const int64_t b = kv / p.Hkv, hk = kv % p.Hkv;
      KvAccum acc;
      if (slice == 0) {
        acc = {dk + b * p.s * ldk + hk * p.Dqk, ldk, dv + b * p.s * ldv + hk * p.Dv, ldv};
      } else {
        float* x = kv_scratch.data<float>() + (kv * (nslices - 1) + slice - 1) * p.s * wkv;
        acc = {x, wkv, x + p.Dqk, wkv};
      }
      zero_rows(acc.dk, p.s, p.Dqk, acc.ldk);
      zero_rows(acc.dv, p.s, p.Dv, acc.ldv);
      const int64_t h_begin = hk * group + slice * group / nslices;
      const int64_t h_end = hk * group + (slice + 1) * group / nslices;
      for (int64_t h = h_begin; h < h_end; ++h) {
        float ds = 0.f;
        for (int64_t tile = 0; tile < ntiles; ++tile) {
          QueryTile qt = make_query_tile(p.doc_start + b * p.s, p.q_row0 + p.sq, p.q_row0 + tile * T::kBq, T::kBq);
          ds += bwd_tile(p, b, h, qt, acc, w);
        }
        dsink_part.data<float>()[b * p.H + h] = ds;
      }
    }

    // Fold the slices' scratch into dk/dv, in slice order, split by rows.
    if (nslices > 1) {
#pragma omp for schedule(static)
      for (int64_t row = 0; row < kv_items * p.s; ++row) {
        const int64_t kv = row / p.s, t = row % p.s;
        const int64_t b = kv / p.Hkv, hk = kv % p.Hkv;
        float* k_out = dk + (b * p.s + t) * ldk + hk * p.Dqk;
        float* v_out = dv + (b * p.s + t) * ldv + hk * p.Dv;
        for (int64_t slice = 1; slice < nslices; ++slice) {
          const float* x = kv_scratch.data<float>() + ((kv * (nslices - 1) + slice - 1) * p.s + t) * wkv;
          for (int64_t c = 0; c < p.Dqk; ++c) k_out[c] += x[c];
          for (int64_t c = 0; c < p.Dv; ++c) v_out[c] += x[p.Dqk + c];
        }
      }
    }
  }

  if (p.dsink) {
    for (int64_t h = 0; h < p.H; ++h) {
      float sum = 0.f;
      for (int64_t b = 0; b < p.b; ++b) sum += dsink_part.data<float>()[b * p.H + h];
      p.dsink[h] += sum;  // a parameter's gradient: added (hmla/ops/nn.h)
    }
  }
}

}  // namespace hmla::cpu
