// Top-k selection on the CPU: per query tile, the rows' scores over the tile's key range are
// built tile by tile into a row buffer; each row then keeps its K best keys of R(t) with
// nth_element (O(|R|)) and sorts only those K. Items own their rows: no thread races, and the
// result does not depend on the thread count.
#include <omp.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "attn_dense_tile.h"
#include "hmla/ops/indexer.h"
#include "indexer_tile.h"
#include "cpu_kernels.h"

namespace hmla::cpu {

namespace {

void select_row(const float* I, int64_t jbase, int64_t lo, int64_t t, int64_t K, int64_t W, int32_t* out,
                std::vector<int32_t>& cand) {
  std::fill(out, out + K + W, -1);
  if (lo > t) return;
  const int64_t r_end = std::max(lo, t + 1 - W);  // R(t) = [lo, r_end)
  cand.resize(r_end - lo);
  std::iota(cand.begin(), cand.end(), static_cast<int32_t>(lo));
  auto better = [&](int32_t x, int32_t y) {
    const float a = I[x - jbase], b = I[y - jbase];
    return a != b ? a > b : x < y;
  };
  if (static_cast<int64_t>(cand.size()) > K) {
    std::nth_element(cand.begin(), cand.begin() + K, cand.end(), better);
    cand.resize(K);
  }
  std::sort(cand.begin(), cand.end(), better);
  std::copy(cand.begin(), cand.end(), out);
  for (int64_t j = r_end; j <= t; ++j) out[K + (j - r_end)] = static_cast<int32_t>(j);
}

}  // namespace

void indexer_topk(const IndexerTopkParams& p) {
  using T = IndexerCpuTraits;
  const int64_t b = p.b, sq = p.sq, HI = p.HI, DI = p.DI, s = p.s, q0 = p.q_row0, K = p.K, W = p.W;
  const int64_t ntiles = (sq + T::kBq - 1) / T::kBq;
  const int nthreads = omp_get_max_threads();
  const int64_t per_thread = T::kBq * s + T::kBq * HI * T::kBk + T::kBq * T::kBk;
  Tensor scratch = Tensor::empty({nthreads, per_thread}, DType::f32);
  const float* qI = static_cast<const float*>(p.qI);
  const float* kI = static_cast<const float*>(p.kI);
  const float* w = p.w;
#pragma omp parallel num_threads(nthreads)
  {
    float* rows = scratch.data<float>() + omp_get_thread_num() * per_thread;  // [kBq, range]
    float* S = rows + T::kBq * s;
    float* I = S + T::kBq * HI * T::kBk;
    std::vector<int32_t> cand;
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < b * ntiles; ++item) {
      const int64_t bb = item / ntiles, tile = ntiles - 1 - item % ntiles;
      QueryTile qt = make_query_tile(p.doc_start + bb * s, q0 + sq, q0 + tile * T::kBq, T::kBq);
      const int64_t range = qt.jmax - qt.jmin + 1, lrow = bb * sq + qt.t0 - q0;  // the tile's first local row
      for (int64_t j0 = qt.jmin; j0 <= qt.jmax; j0 += T::kBk) {
        const int64_t nk = std::min(T::kBk, qt.jmax + 1 - j0);
        indexer_score_tile(qI + lrow * HI * DI, kI + (bb * s + j0) * DI, w + lrow * HI, qt.nq, nk, HI, DI, S, I);
        for (int64_t r = 0; r < qt.nq; ++r)
          std::copy(I + r * nk, I + (r + 1) * nk, rows + r * range + (j0 - qt.jmin));
      }
      for (int64_t r = 0; r < qt.nq; ++r) {
        const int64_t t = qt.t0 + r;
        select_row(rows + r * std::max<int64_t>(range, 0), qt.jmin, qt.doc_start[t], t, K, W,
                   p.table + (lrow + r) * (K + W), cand);
      }
    }
  }
}

void indexer_select(const IndexerTopkParams& p) {
  const int64_t b = p.b, sq = p.sq, s = p.s, q0 = p.q_row0, K = p.K, W = p.W;
  const float* I = p.scores;
  const int32_t* ds = p.doc_start;
#pragma omp parallel
  {
    std::vector<int32_t> cand;
#pragma omp for schedule(static)
    for (int64_t row = 0; row < b * sq; ++row) {
      const int64_t t = q0 + row % sq;
      select_row(I + row * s, 0, ds[(row / sq) * s + t], t, K, W, p.table + row * (K + W), cand);
    }
  }
}

// The CPU's plan for scoring and selecting (cpu_kernels.h): f32 (select reads f32 scores anyway).
Plan plan(Op, const IndexerTopkParams& p) { return plan_if(f32(p.dtype), Variant::cpu); }

}  // namespace hmla::cpu
