// The indexer's KL losses on the CPU (DESIGN.md section 6; derivation in docs/indexer.md).
//
// Dense (dsa_warmup): work item = (batch row, query tile). Pass 1 walks the tile's key range for
// lseI (and lseC per head when the attention's lse cannot stand in); pass 2 walks it again,
// rebuilding P (mean over heads of exp(l_h - lseC_h)) and I per tile, and turns dI = g (Q - P)
// into dqI (rows the item owns), dw (same) and dkI (every earlier key: a per-thread partial,
// summed in thread order at the end). Workspace: per-thread tiles plus threads * s * DI.
// Sparse (dsa_sparse): work item = one row; its candidates are gathered and the same algebra
// runs on [HI, n] and [H, n] blocks.
// Items are statically assigned, so results are fixed for a given thread count.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "attn_dense_tile.h"
#include "cpu_kernels.h"
#include "hmla/ops/indexer.h"
#include "indexer_tile.h"
#include "partials.h"
#include "softmax_tile.h"

namespace hmla::cpu {

namespace {

using T = IndexerCpuTraits;

// Sums per-thread dkI partials in thread order; adds the per-row kl, summed from 0 in row order,
// into *kl_acc.
void finish(const IndexerKlParams& g, const Tensor& partial, int nthreads, const std::vector<float>& kl) {
  sum_thread_partials(g.dkI, partial.data<float>(), nthreads, g.b * g.s * g.DI);
  double sum = 0;
  for (int64_t r = 0; r < g.b * g.sq; ++r) sum += double(g.row_weight[r]) * double(kl[r]);
  *g.kl_acc += sum;
}

}  // namespace

void indexer_kl_dense(const IndexerKlParams& g) {
  const int64_t ntiles = (g.sq + T::kBq - 1) / T::kBq, group = g.H / g.Hkv;
  const int nthreads = omp_get_max_threads();
  const bool have_lse = g.lse_c != nullptr;
  const int64_t tile = T::kBq * T::kBk;
  const int64_t per_thread = T::kBq * g.HI * T::kBk * 2 + 4 * tile + (2 * g.H + 4) * T::kBq;
  Tensor scratch = Tensor::empty({nthreads, per_thread}, DType::f32);
  Tensor partial = Tensor::zeros({nthreads, g.b * g.s * g.DI}, DType::f32);
  std::vector<float> kl(g.b * g.sq, 0.f);
  const float *qI = static_cast<const float*>(g.qI), *kI = static_cast<const float*>(g.kI), *w = g.w;
  const float *q = static_cast<const float*>(g.q), *k = static_cast<const float*>(g.k), *rw = g.row_weight;
  float *dqI = g.dqI, *dw = g.dw;

#pragma omp parallel num_threads(nthreads)
  {
    const int th = omp_get_thread_num();
    float* S = scratch.data<float>() + th * per_thread;  // [kBq * HI, kBk], then dS
    float* dS = S + T::kBq * g.HI * T::kBk;
    float* I = dS + T::kBq * g.HI * T::kBk;
    float* L = I + tile;
    float* P = L + tile;
    float* dI = P + tile;
    float* mC = dI + tile;  // [H, kBq] running max / then lseC
    float* lC = mC + g.H * T::kBq;
    float* mI = lC + g.H * T::kBq;
    float* lI = mI + T::kBq;
    float* gr = lI + T::kBq;  // coeff * rw
    float* dkI = partial.data<float>() + th * g.b * g.s * g.DI;
#pragma omp for schedule(static, 1)
    for (int64_t item = 0; item < g.b * ntiles; ++item) {
      const int64_t bb = item / ntiles, lt0 = (item % ntiles) * T::kBq;  // first local row of the tile
      QueryTile qt = make_query_tile(g.doc_start + bb * g.s, g.q_row0 + g.sq, g.q_row0 + lt0, T::kBq);
      const int64_t nq = qt.nq, row0 = bb * g.sq + lt0;
      std::memset(dqI + row0 * g.HI * g.DI, 0, nq * g.HI * g.DI * sizeof(float));
      std::memset(dw + row0 * g.HI, 0, nq * g.HI * sizeof(float));
      if (qt.empty()) continue;
      for (int64_t r = 0; r < nq; ++r) gr[r] = g.coeff * rw[row0 + r];
      const float* qI_t = qI + row0 * g.HI * g.DI;
      const float* w_t = w + row0 * g.HI;
      auto logits = [&](int64_t h, int64_t j0, int64_t nk) {  // L = scale q_h k_h^T, masked
        sgemm(Trans::no, Trans::yes, nq, nk, g.Dqk, g.scale, q + bb * g.q_bstride + lt0 * g.q_rstride + h * g.q_hstride, g.q_rstride,
              k + bb * g.k_bstride + j0 * g.k_rstride + (h / group) * g.k_hstride, g.k_rstride, 0.f, L, nk);
        qt.mask(L, j0, nk);
      };

      // Pass 1: lseI, and lseC unless the attention's lse is it.
      std::fill(mI, mI + nq, -INFINITY);
      std::fill(lI, lI + nq, 0.f);
      std::fill(mC, mC + g.H * T::kBq, -INFINITY);
      std::fill(lC, lC + g.H * T::kBq, 0.f);
      for (int64_t j0 = qt.jmin; j0 <= qt.jmax; j0 += T::kBk) {
        const int64_t nk = std::min(T::kBk, qt.jmax + 1 - j0);
        indexer_score_tile(qI_t, kI + (bb * g.s + j0) * g.DI, w_t, nq, nk, g.HI, g.DI, S, I);
        qt.mask(I, j0, nk);
        softmax_online_tile(I, nq, nk, mI, lI, nullptr, 0);
        if (have_lse) continue;
        for (int64_t h = 0; h < g.H; ++h) {
          logits(h, j0, nk);
          softmax_online_tile(L, nq, nk, mC + h * T::kBq, lC + h * T::kBq, nullptr, 0);
        }
      }
      for (int64_t r = 0; r < nq; ++r) mI[r] = lI[r] > 0.f ? mI[r] + std::log(lI[r]) : INFINITY;  // lseI
      for (int64_t h = 0; h < g.H; ++h)
        for (int64_t r = 0; r < nq; ++r) {
          float& x = mC[h * T::kBq + r];
          x = have_lse ? g.lse_c[(bb * g.H + h) * g.sq + lt0 + r]
                       : (lC[h * T::kBq + r] > 0.f ? x + std::log(lC[h * T::kBq + r]) : INFINITY);
        }

      // Pass 2: P, Q, kl and dI per key tile, chained into dqI, dw and dkI.
      for (int64_t j0 = qt.jmin; j0 <= qt.jmax; j0 += T::kBk) {
        const int64_t nk = std::min(T::kBk, qt.jmax + 1 - j0);
        const float* kI_j = kI + (bb * g.s + j0) * g.DI;
        indexer_score_tile(qI_t, kI_j, w_t, nq, nk, g.HI, g.DI, S, I);
        qt.mask(I, j0, nk);
        std::fill(P, P + nq * nk, 0.f);
        for (int64_t h = 0; h < g.H; ++h) {
          logits(h, j0, nk);
          accumulate_probs(L, nq, nk, mC + h * T::kBq, P);
        }
        const float inv_h = 1.f / float(g.H);
        for (int64_t i = 0; i < nq * nk; ++i) P[i] *= inv_h;
        kl_tile(P, I, nq, nk, mI, gr, kl.data() + row0, dI);
        relu_head_sum_bwd(S, w_t, dI, nq, g.HI, nk, dS, dw + row0 * g.HI);
        sgemm(Trans::no, Trans::no, nq * g.HI, g.DI, nk, 1.f, dS, nk, kI_j, g.DI, 1.f, dqI + row0 * g.HI * g.DI, g.DI);
        sgemm(Trans::yes, Trans::no, nk, g.DI, nq * g.HI, 1.f, dS, nk, qI_t, g.DI, 1.f, dkI + (bb * g.s + j0) * g.DI,
              g.DI);
      }
    }
  }
  finish(g, partial, nthreads, kl);
}

void indexer_kl_sparse(const IndexerKlParams& g) {
  const int64_t K = g.K, KW = g.K + g.W, group = g.H / g.Hkv;
  const int nthreads = omp_get_max_threads();
  const int64_t per_thread = 2 * g.HI * K + g.H * K + 4 * K + K * g.DI + K * g.Dqk + K * g.DI;
  Tensor scratch = Tensor::empty({nthreads, per_thread}, DType::f32);
  Tensor partial = Tensor::zeros({nthreads, g.b * g.s * g.DI}, DType::f32);
  std::vector<float> kl(g.b * g.sq, 0.f);
  const float *qI = static_cast<const float*>(g.qI), *kI = static_cast<const float*>(g.kI), *w = g.w;
  const float *q = static_cast<const float*>(g.q), *k = static_cast<const float*>(g.k), *rw = g.row_weight;
  const int32_t* idx = g.topk;
  float *dqI = g.dqI, *dw = g.dw;

#pragma omp parallel num_threads(nthreads)
  {
    const int th = omp_get_thread_num();
    float* S = scratch.data<float>() + th * per_thread;  // [HI, n]
    float* dS = S + g.HI * K;
    float* L = dS + g.HI * K;  // [H, n]
    float* I = L + g.H * K;
    float* P = I + K;
    float* dI = P + K;
    float* Kc = dI + K;        // gathered kI [n, DI]
    float* Kg = Kc + K * g.DI;  // gathered attention keys of one kv head [n, Dqk]
    float* dKc = Kg + K * g.Dqk;  // [n, DI]
    float* Ic = dKc + K * g.DI;   // a copy of I (the online softmax overwrites its input)
    float* dkI = partial.data<float>() + th * g.b * g.s * g.DI;
    std::vector<int32_t> C;
#pragma omp for schedule(static, 1)
    for (int64_t row = 0; row < g.b * g.sq; ++row) {
      const int64_t bb = row / g.sq, t = row % g.sq;  // t: local row
      std::memset(dqI + row * g.HI * g.DI, 0, g.HI * g.DI * sizeof(float));
      std::memset(dw + row * g.HI, 0, g.HI * sizeof(float));
      C.clear();
      for (int64_t i = 0; i < K; ++i)
        if (idx[row * KW + i] >= 0) C.push_back(idx[row * KW + i]);
      const int64_t n = static_cast<int64_t>(C.size());
      if (n == 0) continue;
      for (int64_t i = 0; i < n; ++i) std::memcpy(Kc + i * g.DI, kI + (bb * g.s + C[i]) * g.DI, g.DI * sizeof(float));
      const float* qI_t = qI + row * g.HI * g.DI;
      const float* w_t = w + row * g.HI;
      indexer_score_tile(qI_t, Kc, w_t, 1, n, g.HI, g.DI, S, I);
      for (int64_t hk = 0; hk < g.Hkv; ++hk) {  // logits of the heads sharing kv head hk
        for (int64_t i = 0; i < n; ++i)
          std::memcpy(Kg + i * g.Dqk, k + bb * g.k_bstride + C[i] * g.k_rstride + hk * g.k_hstride, g.Dqk * sizeof(float));
        sgemm(Trans::no, Trans::yes, group, n, g.Dqk, g.scale, q + bb * g.q_bstride + t * g.q_rstride + hk * group * g.q_hstride, g.q_hstride,
              Kg, g.Dqk, 0.f, L + hk * group * n, n);
      }
      std::fill(P, P + n, 0.f);
      for (int64_t h = 0; h < g.H; ++h) {  // lseC over the candidates, then P
        float m = -INFINITY, z = 0.f;
        softmax_online_tile(L + h * n, 1, n, &m, &z, nullptr, 0);
        for (int64_t i = 0; i < n; ++i) P[i] += L[h * n + i] / z;
      }
      for (int64_t i = 0; i < n; ++i) P[i] /= float(g.H);
      float mI = -INFINITY, zI = 0.f;
      std::memcpy(Ic, I, n * sizeof(float));
      softmax_online_tile(Ic, 1, n, &mI, &zI, nullptr, 0);
      const float lseI = mI + std::log(zI), gr = g.coeff * rw[row];
      kl_tile(P, I, 1, n, &lseI, &gr, kl.data() + row, dI);
      relu_head_sum_bwd(S, w_t, dI, 1, g.HI, n, dS, dw + row * g.HI);
      sgemm(Trans::no, Trans::no, g.HI, g.DI, n, 1.f, dS, n, Kc, g.DI, 0.f, dqI + row * g.HI * g.DI, g.DI);
      sgemm(Trans::yes, Trans::no, n, g.DI, g.HI, 1.f, dS, n, qI_t, g.DI, 0.f, dKc, g.DI);
      for (int64_t i = 0; i < n; ++i) {
        float* dst = dkI + (bb * g.s + C[i]) * g.DI;
        const float* src = dKc + i * g.DI;
        for (int64_t c = 0; c < g.DI; ++c) dst[c] += src[c];
      }
    }
  }
  finish(g, partial, nthreads, kl);
}

// The CPU's plan for both KLs (cpu_kernels.h): f32 inputs.
Plan plan(Op, const IndexerKlParams& p) { return plan_if(f32(p.dtype) && f32(p.qk_dtype), Variant::cpu); }

}  // namespace hmla::cpu
