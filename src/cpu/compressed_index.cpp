// The CSA indexer's scores and top-k over compressed entries on the CPU (hmla/ops/compressed_index.h).
// Work item = one query row: its visible entries (one contiguous range, by binary search), their
// scores in the header's fmaf order into a per-thread buffer of n_e floats, then nth_element (O(n))
// and a sort of the K best. Scratch O(threads n_e); nothing [s, n_e] unless the scores are asked for.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "entry_range.h"
#include "cpu_kernels.h"
#include "hmla/ops/compressed_index.h"

namespace hmla::cpu {

namespace {

// The visible entry range [lo, hi) of query t (document start st) of batch row bb: entries sorted by
// document, then by last row, unused slots (ent_doc -1) last (the contract the entry points check).
void visible_range(const CompressedIndexParams& p, int64_t bb, int64_t st, int64_t t, int64_t& lo, int64_t& hi) {
  visible_entries(p.ent_doc + bb * p.n_e, p.ent_last + bb * p.n_e, p.n_e, st, t, lo, hi);
}

// I(t, e) in the header's order: explicit fmaf steps (x86-64-v3 has FMA; CUDA's fmaf is one instruction).
float score(const float* q, const float* w, const float* k, int64_t nI, int64_t dI) {
  float I = 0.f;
  for (int64_t h = 0; h < nI; ++h) {
    const float* qh = q + h * dI;
    float d = 0.f;
    for (int64_t c = 0; c < dI; ++c) d = std::fma(qh[c], k[c], d);
    I = std::fma(w[h], d > 0.f ? d : 0.f, I);
  }
  return I;
}

// Calls fn(row, bb, lo, hi) for each (local) query row with its visible range (empty for padding
// rows), rows statically split over the threads (each row's result depends on nothing else).
template <class Fn>
void for_each_row(const CompressedIndexParams& p, Fn&& fn) {
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < p.b * p.sq; ++row) {
    const int64_t bb = row / p.sq, t = p.q_row0 + row % p.sq, st = p.doc_start[bb * p.s + t];
    int64_t lo = 0, hi = 0;
    if (st <= t && p.n_e > 0) visible_range(p, bb, st, t, lo, hi);
    fn(row, bb, lo, hi);
  }
}

}  // namespace

void compressed_index_topk(const CompressedIndexParams& p) {
  const int64_t K = p.K, nth = omp_get_max_threads(), n_e = std::max<int64_t>(p.n_e, 1);
  // Per thread n_e scores and n_e candidates: the allocator sees the whole workspace.
  Tensor scores = Tensor::empty({nth, n_e}, DType::f32), cands = Tensor::empty({nth, n_e}, DType::i32);
  for_each_row(p, [&](int64_t row, int64_t bb, int64_t lo, int64_t hi) {
    int32_t* out = p.idx + row * K;
    std::fill(out, out + K, -1);
    if (hi <= lo) return;
    float* I = scores.data<float>() + omp_get_thread_num() * n_e;
    int32_t* cand = cands.data<int32_t>() + omp_get_thread_num() * n_e;
    const int64_t n = hi - lo;
    const float* q = f32p(p.qI) + row * p.nI * p.dI;
    const float* w = p.w + row * p.nI;
    for (int64_t e = lo; e < hi; ++e) I[e - lo] = score(q, w, f32p(p.kI) + (bb * p.n_e + e) * p.dI, p.nI, p.dI);
    std::iota(cand, cand + n, int32_t(lo));
    // A strict total order on the range (-0 == +0; ties to the smaller entry): the K best are unique.
    auto better = [&](int32_t x, int32_t y) {
      const float a = I[x - lo], c = I[y - lo];
      return a != c ? a > c : x < y;
    };
    const int64_t kk = std::min(n, K);
    if (n > K) std::nth_element(cand, cand + K, cand + n, better);
    std::sort(cand, cand + kk, better);
    std::copy(cand, cand + kk, out);
  });
}

void compressed_index_scores(const CompressedIndexParams& p) {
  for_each_row(p, [&](int64_t row, int64_t bb, int64_t lo, int64_t hi) {
    float* out = p.scores + row * p.n_e;
    std::fill(out, out + p.n_e, -INFINITY);
    const float* q = f32p(p.qI) + row * p.nI * p.dI;
    const float* w = p.w + row * p.nI;
    for (int64_t e = lo; e < hi; ++e) out[e] = score(q, w, f32p(p.kI) + (bb * p.n_e + e) * p.dI, p.nI, p.dI);
  });
}

// The CPU's plan (cpu_kernels.h): f32, any shape.
Plan plan(Op, const CompressedIndexParams& p) { return plan_if(f32(p.dtype), Variant::cpu); }

}  // namespace hmla::cpu
