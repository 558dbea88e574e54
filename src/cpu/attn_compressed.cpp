// DeepSeek-V4's attention core on the CPU (hmla/ops/compressed_attention.h), flash style. Work item
// = one query row with all H heads (one shared K = V head, so each key block is two products
// forward: [H, n] logits, [H, d] output; five backward). The row's keys are walked in blocks of at
// most kBlock: the window (contiguous rows of kv), then its visible entries (dense: a contiguous
// range of ent found by binary search; selected: the row's slots filtered, sorted and deduplicated,
// then gathered). An online softmax carries (max, sum) over the blocks; the backward recomputes P
// from the saved lse. Scratch per thread is O(kBlock (H + d) + k d), independent of s and n_e; the
// backward's key gradients sum over rows into per-thread [b (s + n_e), d] partials added in thread
// order (rows statically assigned: the bits are fixed for a thread count). Nothing [s, s] or
// [s, n_e] exists.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "entry_range.h"
#include "cpu_kernels.h"
#include "hmla/ops/compressed_attention.h"
#include "partials.h"
#include "softmax_tile.h"

namespace hmla::cpu {

namespace {

constexpr int64_t kBlock = 128;    // keys per block: the [H, kBlock] logits stay in L1/L2
constexpr int64_t kRowChunk = 16;  // static chunks: the bits do not depend on scheduling

// One block of a row's keys: n rows of width d at stride d; `first` is the first key's row in kv
// (window) or ent (dense entries); selected entries carry their entry indices in `js`.
struct KeyBlock {
  const float* K;
  int64_t n;
  bool entry;
  int64_t first;
  const int32_t* js;  // null: rows first .. first + n - 1
};

// The visible entry range [lo, hi) of query t (document start st) in batch row bb, by the metadata
// contract (entries sorted by document, then by last row, unused slots last): binary searches, no table.
void visible_range(const AttnCompressedParams& p, int64_t bb, int64_t st, int64_t t, int64_t& lo, int64_t& hi) {
  visible_entries(p.ent_doc + bb * p.n_e, p.ent_last + bb * p.n_e, p.n_e, st, t, lo, hi);
}

bool visible(const AttnCompressedParams& p, int64_t bb, int64_t st, int64_t t, int64_t e) {
  return e >= 0 && e < p.n_e && p.ent_doc[bb * p.n_e + e] == st && p.ent_last[bb * p.n_e + e] <= t;
}

// Calls fn(KeyBlock) for each block of the keys of query `row` (local: batch row bb, global position
// t), st <= t its document start. Selected mode: js (k ints) and Kg (k * d floats) are the thread's
// scratch.
template <class Fn>
void for_each_block(const AttnCompressedParams& p, int64_t row, int64_t bb, int64_t t, int64_t st, int32_t* js,
                    float* Kg, Fn&& fn) {
  const float* kv = static_cast<const float*>(p.kv) + bb * p.s * p.d;
  const int64_t u0 = std::max(st, t - p.window + 1);
  for (int64_t u = u0; u <= t; u += kBlock) fn(KeyBlock{kv + u * p.d, std::min(kBlock, t + 1 - u), false, u, nullptr});
  if (p.n_e == 0) return;
  const float* ent = static_cast<const float*>(p.ent) + bb * p.n_e * p.d;
  if (p.k == 0) {
    int64_t lo = 0, hi = 0;
    visible_range(p, bb, st, t, lo, hi);
    for (int64_t e = lo; e < hi; e += kBlock) fn(KeyBlock{ent + e * p.d, std::min(kBlock, hi - e), true, e, nullptr});
    return;
  }
  const int32_t* slots = p.idx + row * p.k;
  int64_t n = 0;
  for (int64_t i = 0; i < p.k; ++i)
    if (visible(p, bb, st, t, slots[i])) js[n++] = slots[i];
  std::sort(js, js + n);
  n = std::unique(js, js + n) - js;  // transformers' mask: a repeated index counts once
  for (int64_t i = 0; i < n; ++i) std::memcpy(Kg + i * p.d, ent + int64_t(js[i]) * p.d, p.d * sizeof(float));
  for (int64_t i = 0; i < n; i += kBlock) fn(KeyBlock{Kg + i * p.d, std::min(kBlock, n - i), true, 0, js + i});
}

}  // namespace

void attn_compressed_fwd(const AttnCompressedParams& p) {
  const int nthreads = omp_get_max_threads();
  const int64_t H = p.H, d = p.d, gather = p.k * d;
  const int64_t per_thread = H * kBlock + H * d + 2 * H + gather;
  Tensor scratch = Tensor::empty({nthreads, per_thread}, DType::f32);
  Tensor slots = Tensor::empty({nthreads, std::max<int64_t>(p.k, 1)}, DType::i32);
  const float* q = static_cast<const float*>(p.q);
  float* out = static_cast<float*>(p.out);
#pragma omp parallel num_threads(nthreads)
  {
    const int th = omp_get_thread_num();
    float* L = scratch.data<float>() + th * per_thread;
    float* O = L + H * kBlock;
    float* m = O + H * d;
    float* l = m + H;
    float* Kg = l + H;
    int32_t* js = slots.data<int32_t>() + th * std::max<int64_t>(p.k, 1);
#pragma omp for schedule(static, kRowChunk)
    for (int64_t row = 0; row < p.b * p.sq; ++row) {
      const int64_t bb = row / p.sq, tl = row % p.sq, t = p.q_row0 + tl, st = p.doc_start[bb * p.s + t];
      float* o = out + row * H * d;
      if (st > t) {  // padding: no document, no key
        std::memset(o, 0, H * d * sizeof(float));
        for (int64_t h = 0; h < H; ++h) p.lse[(bb * H + h) * p.sq + tl] = INFINITY;
        continue;
      }
      const float* Q = q + bb * p.q_bstride + tl * p.q_rstride;
      std::fill(O, O + H * d, 0.f);
      std::fill(m, m + H, -INFINITY);
      std::fill(l, l + H, 0.f);
      for_each_block(p, row, bb, t, st, js, Kg, [&](const KeyBlock& kb) {
        sgemm(Trans::no, Trans::yes, H, kb.n, d, p.scale, Q, p.q_hstride, kb.K, d, 0.f, L, kb.n);
        softmax_online_tile(L, H, kb.n, m, l, O, d);
        sgemm(Trans::no, Trans::no, H, d, kb.n, 1.f, L, kb.n, kb.K, d, 1.f, O, d);
      });
      for (int64_t h = 0; h < H; ++h) {
        const float denom = l[h] + (p.sink ? std::exp(p.sink[h] - m[h]) : 0.f);
        const float inv = 1.f / denom;
        for (int64_t c = 0; c < d; ++c) o[h * d + c] = O[h * d + c] * inv;
        p.lse[(bb * H + h) * p.sq + tl] = m[h] + std::log(denom);
      }
    }
  }
}

void attn_compressed_bwd(const AttnCompressedParams& p) {
  const int nthreads = omp_get_max_threads();
  const int64_t H = p.H, d = p.d, gather = p.k * d;
  const int64_t per_thread = 2 * H * kBlock + kBlock * d + 2 * H + gather;
  const int64_t nkv = p.b * p.s * d, nent = p.b * p.n_e * d;
  Tensor scratch = Tensor::empty({nthreads, per_thread}, DType::f32);
  Tensor slots = Tensor::empty({nthreads, std::max<int64_t>(p.k, 1)}, DType::i32);
  Tensor part_kv = Tensor::zeros({nthreads, nkv}, DType::f32), part_ent = Tensor::zeros({nthreads, nent}, DType::f32);
  Tensor dsink_part = Tensor::zeros({nthreads, H}, DType::f32);
  const float *q = static_cast<const float*>(p.q), *dO = static_cast<const float*>(p.dout);
  const float* out = static_cast<const float*>(p.out);
  float* dq = static_cast<float*>(p.dq);
#pragma omp parallel num_threads(nthreads)
  {
    const int th = omp_get_thread_num();
    float* P = scratch.data<float>() + th * per_thread;
    float* dS = P + H * kBlock;
    float* dK = dS + H * kBlock;
    float* D = dK + kBlock * d;
    float* lse = D + H;
    float* Kg = lse + H;
    int32_t* js = slots.data<int32_t>() + th * std::max<int64_t>(p.k, 1);
    float* dkv = part_kv.data<float>() + th * nkv;
    float* dent = part_ent.data<float>() + th * nent;
    float* dsink = dsink_part.data<float>() + th * H;
#pragma omp for schedule(static, kRowChunk)
    for (int64_t row = 0; row < p.b * p.sq; ++row) {
      const int64_t bb = row / p.sq, tl = row % p.sq, t = p.q_row0 + tl, st = p.doc_start[bb * p.s + t];
      float* dq_t = dq + row * H * d;
      std::memset(dq_t, 0, H * d * sizeof(float));
      if (st > t) continue;  // padding: no gradient
      const float* Q = q + bb * p.q_bstride + tl * p.q_rstride;
      const float* dO_t = dO + row * H * d;
      const float* O_t = out + row * H * d;
      for (int64_t h = 0; h < H; ++h) {
        lse[h] = p.lse[(bb * H + h) * p.sq + tl];
        float dd = 0.f;
        for (int64_t c = 0; c < d; ++c) dd += dO_t[h * d + c] * O_t[h * d + c];
        D[h] = dd;
        // The sink is a softmax column without a value: d lse-weight is -p_sink D (an infinite
        // sink gives out = 0, D = 0 and no term, never inf - inf).
        if (p.sink && std::isfinite(lse[h])) dsink[h] -= std::exp(p.sink[h] - lse[h]) * dd;
      }
      for_each_block(p, row, bb, t, st, js, Kg, [&](const KeyBlock& kb) {
        sgemm(Trans::no, Trans::yes, H, kb.n, d, p.scale, Q, p.q_hstride, kb.K, d, 0.f, P, kb.n);
        probs_from_lse_tile(P, H, kb.n, lse);
        sgemm(Trans::no, Trans::yes, H, kb.n, d, 1.f, dO_t, d, kb.K, d, 0.f, dS, kb.n);  // dP (value = key)
        dscores_tile(dS, P, H, kb.n, D, p.scale);                                        // dS = P (dP - D) scale
        sgemm(Trans::no, Trans::no, H, d, kb.n, 1.f, dS, kb.n, kb.K, d, 1.f, dq_t, d);
        // K = V: the key's gradient dS^T Q plus the value's P^T dO, one [n, d] block.
        sgemm(Trans::yes, Trans::no, kb.n, d, H, 1.f, dS, kb.n, Q, p.q_hstride, 0.f, dK, d);
        sgemm(Trans::yes, Trans::no, kb.n, d, H, 1.f, P, kb.n, dO_t, d, 1.f, dK, d);
        float* base = kb.entry ? dent + bb * p.n_e * d : dkv + bb * p.s * d;
        for (int64_t i = 0; i < kb.n; ++i) {
          float* dst = base + (kb.js ? int64_t(kb.js[i]) : kb.first + i) * d;
          const float* src = dK + i * d;
          for (int64_t c = 0; c < d; ++c) dst[c] += src[c];
        }
      });
    }
  }
  sum_thread_partials(static_cast<float*>(p.dkv), part_kv.data<float>(), nthreads, nkv);
  if (nent > 0) sum_thread_partials(static_cast<float*>(p.dent), part_ent.data<float>(), nthreads, nent);
  if (p.sink) add_thread_partials(p.dsink, dsink_part.data<float>(), nthreads, H);  // a parameter's gradient: added
}

// The attention mass's sums in f64, rows in order (batch row, query row, head).
void attn_compressed_mass(const AttnMassParams& p) {
  double sum[4] = {0, 0, 0, 0};  // window, entries, sink, (row, head) pairs
  for (int64_t r = 0; r < p.b; ++r)
    for (int64_t t = 0; t < p.sq; ++t) {
      if (!(p.row_weight[r * p.sq + t] > 0.f)) continue;  // not a loss row (padding: lse = +inf)
      for (int64_t h = 0; h < p.H; ++h) {
        const int64_t i = (r * p.H + h) * p.sq + t;
        const double p_sink = std::exp(double(p.sink ? p.sink[h] : -INFINITY) - double(p.lse[i]));
        const double p_ws = std::exp(double(p.lse_ws[i]) - double(p.lse[i]));
        const double part[3] = {p_ws - p_sink, 1 - p_ws, p_sink};  // window, entries, sink
        for (int k = 0; k < 3; ++k) sum[k] += part[k];
        sum[3] += 1;
      }
    }
  for (int k = 0; k < 4; ++k) p.acc[k] += sum[k];
}

// The CPU's plans (cpu_kernels.h): f32, any widths.
Plan plan(Op, const AttnCompressedParams& p) { return plan_if(f32(p.dtype), Variant::cpu); }
Plan plan(Op, const AttnMassParams&) { return {Variant::cpu, {}}; }

}  // namespace hmla::cpu
