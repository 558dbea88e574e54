// The CSA indexer's KL ("full CSA denominator") on the CPU (hmla/ops/compressed_index.h; the algorithm
// of docs/csa_indexer_kl.md section 5). Per row, from the attention's saved lse_h and the candidate-only
// lseE_h (computed here): log Z = logsumexp_h(lseE_h - lse_h), P = sum_h exp(z_h - (lse_h + log Z)).
// Dense: a rows pass (item: a tile of kBq rows) walks the tile's entry hull twice in tiles of kBk, first
// for lseI and lseE_h (online), then for P, Q, kl and dI into dqI and dw; an entries pass (item: a tile
// of kBk entries) walks the rows that see it, recomputes dI from the saved row statistics (log Z, lseI)
// and adds dS^T qI into its own dkI rows. Sparse: the same on each row's candidate set (sorted, repeats
// and invisible picks dropped) and, for dkI, on each entry's rows (an inverse index built in row order).
// Every item writes only its own rows or entries and the kl sum runs over a [b, s] table in row order, so
// the bits depend on neither the thread count nor the schedule. Nothing is [s, n_e].
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu_kernels.h"
#include "entry_range.h"
#include "hmla/core/tensor.h"
#include "hmla/ops/compressed_index.h"
#include "indexer_tile.h"
#include "softmax_tile.h"
#include "vexp.h"

namespace hmla::cpu {

namespace {

using T = IndexerCpuTraits;
using KlP = CompressedIndexKlParams;

// The local row of global position t of batch row bb in the query-side tensors (rows [q_row0, q_row0 + sq)).
int64_t qrow(const KlP& p, int64_t bb, int64_t t) { return bb * p.sq + t - p.q_row0; }

// [lo, hi): the entries row t (global) of batch row bb sees (empty for padding rows).
void row_range(const KlP& p, int64_t bb, int64_t t, int64_t& lo, int64_t& hi) {
  lo = hi = 0;
  const int64_t st = p.doc_start[bb * p.s + t];
  if (st <= t && p.n_e > 0) visible_entries(p.ent_doc + bb * p.n_e, p.ent_last + bb * p.n_e, p.n_e, st, t, lo, hi);
}

// X [nq, nk] of entries [e0, e0 + nk): -inf outside each row's [lo[r], hi[r]).
void mask_tile(float* X, int64_t nq, int64_t nk, int64_t e0, const int64_t* lo, const int64_t* hi) {
  for (int64_t r = 0; r < nq; ++r) {
    const int64_t a = std::clamp<int64_t>(lo[r] - e0, 0, nk), c = std::max(a, std::clamp<int64_t>(hi[r] - e0, 0, nk));
    std::fill(X + r * nk, X + r * nk + a, -INFINITY);
    std::fill(X + r * nk + c, X + (r + 1) * nk, -INFINITY);
  }
}

// log Z = logsumexp_h(lseE_h - lse_h) in f64 over heads (lseE at stride se, lse at stride sl); -inf
// when no head has candidate mass (no candidate, or every lse_h = +inf): the row has no target.
double log_z(const float* lseE, int64_t se, const float* lse, int64_t sl, int64_t H) {
  double m = -INFINITY;
  for (int64_t h = 0; h < H; ++h) m = std::max(m, double(lseE[h * se]) - double(lse[h * sl]));
  if (!(m > -INFINITY)) return -INFINITY;
  double sum = 0;
  for (int64_t h = 0; h < H; ++h) sum += std::exp(double(lseE[h * se]) - double(lse[h * sl]) - m);
  return m + std::log(sum);
}

// The exponent shift of head h's probabilities: lse_h + log Z (+inf where the head or the row has none).
float shift_of(float lse, double logZ) {
  return std::isfinite(lse) && std::isfinite(logZ) ? float(double(lse) + logZ) : INFINITY;
}

// The per-row statistics both passes read: log Z (f64), lseI (+inf without candidates), kl.
struct RowStats {
  Tensor logZ, lseI, kl;  // [b, s] f64, f32, f32
  explicit RowStats(int64_t rows)
      : logZ(Tensor::empty({rows}, DType::f64)),
        lseI(Tensor::empty({rows}, DType::f32)),
        kl(Tensor::zeros({rows}, DType::f32)) {}
};

// Adds sum_t rw[t] kl(t), from 0 in row order, into *kl_acc.
void finish(const KlP& p, const RowStats& st) {
  const float* kl = st.kl.data<float>();
  double sum = 0;
  for (int64_t r = 0; r < p.b * p.sq; ++r) sum += double(p.row_weight[r]) * double(kl[r]);
  *p.kl_acc += sum;
}

// One query tile's scratch (rows pass and dense entries pass): tiles of [kBq, kBk], heads' statistics.
struct Tile {
  float *S, *dS, *I, *L, *P, *dI, *mE, *lE, *shift, *mI, *lI, *lseI, *gr, *kl, *dw;
  static int64_t floats(const KlP& p) {
    return 2 * T::kBq * p.nI * T::kBk + 4 * T::kBq * T::kBk + 3 * p.H * T::kBq + 6 * T::kBq + T::kBq * p.nI;
  }
  Tile(float* f, const KlP& p) {
    auto take = [&f](int64_t n) { float* r = f; f += n; return r; };
    S = take(T::kBq * p.nI * T::kBk), dS = take(T::kBq * p.nI * T::kBk);
    I = take(T::kBq * T::kBk), L = take(T::kBq * T::kBk), P = take(T::kBq * T::kBk), dI = take(T::kBq * T::kBk);
    mE = take(p.H * T::kBq), lE = take(p.H * T::kBq), shift = take(p.H * T::kBq);
    mI = take(T::kBq), lI = take(T::kBq), lseI = take(T::kBq), gr = take(T::kBq), kl = take(T::kBq);
    dw = take(T::kBq * p.nI);
  }
};

// L [nq, nk] = scale q_h(rows t0..) ent(e0..)^T for batch row bb.
void logits(const KlP& p, int64_t bb, int64_t t0, int64_t nq, int64_t h, int64_t e0, int64_t nk, float* L) {
  sgemm(Trans::no, Trans::yes, nq, nk, p.d, p.scale, f32p(p.q) + bb * p.q_bstride + (t0 - p.q_row0) * p.q_rstride + h * p.q_hstride,
        p.q_rstride, f32p(p.ent) + (bb * p.n_e + e0) * p.d, p.d, 0.f, L, nk);
}

// For rows [t0, t0 + nq) and entries [e0, e0 + nk) with the masks lo, hi and the row statistics in the
// tile (shift per head, lseI, gr): S, I, P and dI = gr (Q - P) (kl added into tl.kl); then dS.
void tile_grad(const KlP& p, const Tile& tl, int64_t bb, int64_t t0, int64_t nq, int64_t e0, int64_t nk,
               const int64_t* lo, const int64_t* hi) {
  const int64_t row0 = qrow(p, bb, t0);
  indexer_score_tile(f32p(p.qI) + row0 * p.nI * p.dI, f32p(p.kI) + (bb * p.n_e + e0) * p.dI, p.w + row0 * p.nI, nq, nk, p.nI, p.dI,
                     tl.S, tl.I);
  mask_tile(tl.I, nq, nk, e0, lo, hi);
  std::fill(tl.P, tl.P + nq * nk, 0.f);
  for (int64_t h = 0; h < p.H; ++h) {
    logits(p, bb, t0, nq, h, e0, nk, tl.L);
    mask_tile(tl.L, nq, nk, e0, lo, hi);
    accumulate_probs(tl.L, nq, nk, tl.shift + h * T::kBq, tl.P);
  }
  kl_tile(tl.P, tl.I, nq, nk, tl.lseI, tl.gr, tl.kl, tl.dI);
}

// Rows pass of the dense KL on rows [t0, t0 + nq) of batch row bb.
void dense_rows(const KlP& p, const Tile& tl, const RowStats& st, int64_t bb, int64_t t0, int64_t nq) {
  const int64_t row0 = qrow(p, bb, t0);
  std::memset(p.dqI + row0 * p.nI * p.dI, 0, nq * p.nI * p.dI * sizeof(float));
  std::memset(p.dw + row0 * p.nI, 0, nq * p.nI * sizeof(float));
  int64_t lo[T::kBq], hi[T::kBq], elo = p.n_e, ehi = 0;
  for (int64_t r = 0; r < nq; ++r) {
    row_range(p, bb, t0 + r, lo[r], hi[r]);
    if (hi[r] > lo[r]) elo = std::min(elo, lo[r]), ehi = std::max(ehi, hi[r]);
  }
  double* logZ = st.logZ.data<double>() + row0;
  float* lseI = st.lseI.data<float>() + row0;
  // Pass 1: lseI and lseE_h over the hull.
  std::fill(tl.mI, tl.mI + nq, -INFINITY), std::fill(tl.lI, tl.lI + nq, 0.f);
  std::fill(tl.mE, tl.mE + p.H * T::kBq, -INFINITY), std::fill(tl.lE, tl.lE + p.H * T::kBq, 0.f);
  for (int64_t e0 = elo; e0 < ehi; e0 += T::kBk) {
    const int64_t nk = std::min(T::kBk, ehi - e0);
    indexer_score_tile(f32p(p.qI) + row0 * p.nI * p.dI, f32p(p.kI) + (bb * p.n_e + e0) * p.dI, p.w + row0 * p.nI, nq, nk, p.nI,
                       p.dI, tl.S, tl.I);
    mask_tile(tl.I, nq, nk, e0, lo, hi);
    softmax_online_tile(tl.I, nq, nk, tl.mI, tl.lI, nullptr, 0);
    for (int64_t h = 0; h < p.H; ++h) {
      logits(p, bb, t0, nq, h, e0, nk, tl.L);
      mask_tile(tl.L, nq, nk, e0, lo, hi);
      softmax_online_tile(tl.L, nq, nk, tl.mE + h * T::kBq, tl.lE + h * T::kBq, nullptr, 0);
    }
  }
  bool any = false;
  for (int64_t r = 0; r < nq; ++r) {
    for (int64_t h = 0; h < p.H; ++h) {  // lseE_h in place of the running max
      float& m = tl.mE[h * T::kBq + r];
      m = tl.lE[h * T::kBq + r] > 0.f ? m + std::log(tl.lE[h * T::kBq + r]) : -INFINITY;
    }
    lseI[r] = tl.lI[r] > 0.f ? tl.mI[r] + std::log(tl.lI[r]) : INFINITY;
    const float* lse = p.lse + bb * p.H * p.sq + t0 - p.q_row0 + r;
    logZ[r] = log_z(tl.mE + r, T::kBq, lse, p.sq, p.H);
    for (int64_t h = 0; h < p.H; ++h) tl.shift[h * T::kBq + r] = shift_of(lse[h * p.sq], logZ[r]);
    tl.gr[r] = std::isfinite(logZ[r]) ? p.coeff * p.row_weight[row0 + r] : 0.f;
    tl.lseI[r] = lseI[r];
    any = any || std::isfinite(logZ[r]);
  }
  if (!any) return;  // kl 0 and no gradient on every row
  // Pass 2: P, Q, kl and dI per entry tile, into dqI and dw.
  float* kl = st.kl.data<float>() + row0;
  std::fill(tl.kl, tl.kl + nq, 0.f);
  for (int64_t e0 = elo; e0 < ehi; e0 += T::kBk) {
    const int64_t nk = std::min(T::kBk, ehi - e0);
    tile_grad(p, tl, bb, t0, nq, e0, nk, lo, hi);
    relu_head_sum_bwd(tl.S, p.w + row0 * p.nI, tl.dI, nq, p.nI, nk, tl.dS, p.dw + row0 * p.nI);
    sgemm(Trans::no, Trans::no, nq * p.nI, p.dI, nk, 1.f, tl.dS, nk, f32p(p.kI) + (bb * p.n_e + e0) * p.dI, p.dI, 1.f,
          p.dqI + row0 * p.nI * p.dI, p.dI);
  }
  std::copy(tl.kl, tl.kl + nq, kl);
}

// Entries pass of the dense KL: dkI of entries [e0, e0 + nk) of batch row bb, over the rows that see
// them (from the first one's last row to the last one's document end, within the query rows) in tiles
// of kBq.
void dense_entries(const KlP& p, const Tile& tl, const RowStats& st, int64_t bb, int64_t e0, int64_t nk) {
  float* dkI = p.dkI + (bb * p.n_e + e0) * p.dI;
  std::memset(dkI, 0, nk * p.dI * sizeof(float));
  const int32_t* doc = p.ent_doc + bb * p.n_e;
  while (nk > 0 && doc[e0 + nk - 1] == -1) --nk;  // unused slots end the row
  if (nk == 0) return;
  // Entries go by document, then by last row, so ent_last rises over the tile.
  const int64_t r_lo = std::max<int64_t>(p.ent_last[bb * p.n_e + e0], p.q_row0);
  const int64_t r_hi = std::min<int64_t>(p.doc_end[bb * p.s + doc[e0 + nk - 1]], p.q_row0 + p.sq);
  for (int64_t t0 = r_lo; t0 < r_hi; t0 += T::kBq) {
    const int64_t nq = std::min(T::kBq, r_hi - t0), row0 = qrow(p, bb, t0);
    int64_t lo[T::kBq], hi[T::kBq];
    bool any = false;
    for (int64_t r = 0; r < nq; ++r) {
      row_range(p, bb, t0 + r, lo[r], hi[r]);
      const double logZ = st.logZ.data<double>()[row0 + r];
      tl.gr[r] = std::isfinite(logZ) ? p.coeff * p.row_weight[row0 + r] : 0.f;
      tl.lseI[r] = st.lseI.data<float>()[row0 + r];
      for (int64_t h = 0; h < p.H; ++h) tl.shift[h * T::kBq + r] = shift_of(p.lse[(bb * p.H + h) * p.sq + t0 - p.q_row0 + r], logZ);
      any = any || (tl.gr[r] != 0.f && std::max(lo[r], e0) < std::min(hi[r], e0 + nk));
    }
    if (!any) continue;  // dI = 0 on the whole tile
    std::fill(tl.kl, tl.kl + nq, 0.f), std::fill(tl.dw, tl.dw + nq * p.nI, 0.f);  // not needed here
    tile_grad(p, tl, bb, t0, nq, e0, nk, lo, hi);
    relu_head_sum_bwd(tl.S, p.w + row0 * p.nI, tl.dI, nq, p.nI, nk, tl.dS, tl.dw);
    sgemm(Trans::yes, Trans::no, nk, p.dI, nq * p.nI, 1.f, tl.dS, nk, f32p(p.qI) + row0 * p.nI * p.dI, p.dI, 1.f, dkI, p.dI);
  }
}

// Runs fn(thread's scratch, item) over n items; each item's result depends on nothing else.
template <class Fn>
void for_items(int64_t n, int64_t per_thread, Fn&& fn) {
  const int nthreads = omp_get_max_threads();
  Tensor scratch = Tensor::empty({nthreads, std::max<int64_t>(per_thread, 1)}, DType::f32);
#pragma omp parallel num_threads(nthreads)
  {
    float* f = scratch.data<float>() + omp_get_thread_num() * std::max<int64_t>(per_thread, 1);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n; ++i) fn(f, i);
  }
}

}  // namespace

void compressed_index_kl_dense(const KlP& p) {
  RowStats st(p.b * p.sq);
  const int64_t qt = (p.sq + T::kBq - 1) / T::kBq, et = (p.n_e + T::kBk - 1) / T::kBk;
  for_items(p.b * qt, Tile::floats(p), [&](float* f, int64_t i) {
    const int64_t bb = i / qt, t0 = p.q_row0 + (i % qt) * T::kBq;
    dense_rows(p, Tile(f, p), st, bb, t0, std::min(T::kBq, p.q_row0 + p.sq - t0));
  });
  for_items(p.b * et, Tile::floats(p), [&](float* f, int64_t i) {
    const int64_t bb = i / et, e0 = (i % et) * T::kBk;
    dense_entries(p, Tile(f, p), st, bb, e0, std::min(T::kBk, p.n_e - e0));
  });
  finish(p, st);
}

void compressed_index_kl_sparse(const KlP& p) {
  const int64_t K = p.K, rows = p.b * p.sq;
  RowStats st(rows);
  // Each row's candidate set: the visible entries of its K slots, ascending, once each; then -1.
  Tensor cand_t = Tensor::empty({rows, K}, DType::i32), count_t = Tensor::empty({rows}, DType::i32);
  int32_t *cand = cand_t.data<int32_t>(), *count = count_t.data<int32_t>();
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < rows; ++row) {
    int64_t lo, hi, n = 0;
    row_range(p, row / p.sq, p.q_row0 + row % p.sq, lo, hi);
    int32_t* c = cand + row * K;
    for (int64_t i = 0; i < K; ++i) {
      const int32_t e = p.topk[row * K + i];
      if (e >= lo && e < hi) c[n++] = e;
    }
    std::sort(c, c + n);
    n = std::unique(c, c + n) - c;
    std::fill(c + n, c + K, -1);
    count[row] = int32_t(n);
  }
  // Rows pass: one row on its gathered candidates ([nI, n] and [H, n] blocks).
  const int64_t row_floats = 2 * p.nI * K + p.H * K + 3 * K + K * p.dI + K * p.d + 2 * p.H;
  for_items(rows, row_floats, [&](float* f, int64_t row) {
    float *S = f, *dS = S + p.nI * K, *L = dS + p.nI * K, *I = L + p.H * K, *P = I + K, *dI = P + K;
    float *Kc = dI + K, *Ec = Kc + K * p.dI, *lseE = Ec + K * p.d, *shift = lseE + p.H;
    const int64_t bb = row / p.sq, t = row % p.sq, n = count[row];  // t: the local row
    const int32_t* c = cand + row * K;
    float* dqI = p.dqI + row * p.nI * p.dI;
    float* dw = p.dw + row * p.nI;
    std::memset(dqI, 0, p.nI * p.dI * sizeof(float));
    std::memset(dw, 0, p.nI * sizeof(float));
    double& logZ = st.logZ.data<double>()[row];
    float& lseI = st.lseI.data<float>()[row];
    logZ = -INFINITY, lseI = INFINITY;
    if (n == 0) return;
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(Kc + i * p.dI, f32p(p.kI) + (bb * p.n_e + c[i]) * p.dI, p.dI * sizeof(float));
      std::memcpy(Ec + i * p.d, f32p(p.ent) + (bb * p.n_e + c[i]) * p.d, p.d * sizeof(float));
    }
    const float* w = p.w + row * p.nI;
    indexer_score_tile(f32p(p.qI) + row * p.nI * p.dI, Kc, w, 1, n, p.nI, p.dI, S, I);
    sgemm(Trans::no, Trans::yes, p.H, n, p.d, p.scale, f32p(p.q) + bb * p.q_bstride + t * p.q_rstride, p.q_hstride, Ec, p.d,
          0.f, L, n);
    for (int64_t h = 0; h < p.H; ++h) {  // lseE_h over the candidates
      const float m = row_max(L + h * n, n);
      float z = 0.f;
      for (int64_t i = 0; i < n; ++i) z += exp_approx(L[h * n + i] - m);
      lseE[h] = m + std::log(z);
    }
    const float* lse = p.lse + bb * p.H * p.sq + t;
    logZ = log_z(lseE, 1, lse, p.sq, p.H);
    const float mI = row_max(I, n);
    float zI = 0.f;
    for (int64_t i = 0; i < n; ++i) zI += exp_approx(I[i] - mI);
    lseI = mI + std::log(zI);
    if (!std::isfinite(logZ)) return;  // no target: kl 0, no gradient
    std::fill(P, P + n, 0.f);
    for (int64_t h = 0; h < p.H; ++h) {
      shift[h] = shift_of(lse[h * p.sq], logZ);
      accumulate_probs(L + h * n, 1, n, shift + h, P);
    }
    const float gr = p.coeff * p.row_weight[row];
    kl_tile(P, I, 1, n, &lseI, &gr, st.kl.data<float>() + row, dI);
    relu_head_sum_bwd(S, w, dI, 1, p.nI, n, dS, dw);
    sgemm(Trans::no, Trans::no, p.nI, p.dI, n, 1.f, dS, n, Kc, p.dI, 0.f, dqI, p.dI);
  });
  // The inverse index: per entry the rows whose candidate sets hold it, ascending.
  const int64_t ne = p.b * p.n_e;
  Tensor off_t = Tensor::zeros({ne + 1}, DType::i64);
  int64_t* off = off_t.data<int64_t>();
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t i = 0; i < count[row]; ++i) ++off[(row / p.sq) * p.n_e + cand[row * K + i] + 1];
  for (int64_t e = 0; e < ne; ++e) off[e + 1] += off[e];
  Tensor by_t = Tensor::empty({std::max<int64_t>(off[ne], 1)}, DType::i32);
  Tensor fill_t = Tensor::empty({std::max<int64_t>(ne, 1)}, DType::i64);
  int32_t* by = by_t.data<int32_t>();
  int64_t* fill = fill_t.data<int64_t>();
  std::copy(off, off + ne, fill);
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t i = 0; i < count[row]; ++i) by[fill[(row / p.sq) * p.n_e + cand[row * K + i]]++] = int32_t(row % p.sq);
  // Entries pass: entry e over its rows in chunks of kBq (gathered qI, q, w), dkI[e] += dS^T qI.
  const int64_t R = T::kBq;
  const int64_t entry_floats = R * p.nI * p.dI + R * p.H * p.d + 4 * R * p.nI + R * p.H * 2 + 6 * R;
  for_items(ne, entry_floats, [&](float* f, int64_t ie) {
    float *QI = f, *Qt = QI + R * p.nI * p.dI, *W = Qt + R * p.H * p.d, *S = W + R * p.nI, *dS = S + R * p.nI;
    float *L = dS + R * p.nI, *shift = L + R * p.H, *I = shift + R * p.H, *P = I + R, *dI = P + R, *lseI = dI + R;
    float *gr = lseI + R, *kl = gr + R, *dw = kl + R;  // kl, dw: not needed here (kl_tile, relu_head_sum_bwd add into them)
    const int64_t bb = ie / p.n_e;
    float* dkI = p.dkI + ie * p.dI;
    std::memset(dkI, 0, p.dI * sizeof(float));
    for (int64_t j0 = off[ie]; j0 < off[ie + 1]; j0 += R) {
      const int64_t nr = std::min(R, off[ie + 1] - j0);
      bool any = false;
      for (int64_t r = 0; r < nr; ++r) {
        const int64_t t = by[j0 + r], row = bb * p.sq + t;  // t: the local row
        std::memcpy(QI + r * p.nI * p.dI, f32p(p.qI) + row * p.nI * p.dI, p.nI * p.dI * sizeof(float));
        std::memcpy(W + r * p.nI, p.w + row * p.nI, p.nI * sizeof(float));
        for (int64_t h = 0; h < p.H; ++h)
          std::memcpy(Qt + (r * p.H + h) * p.d, f32p(p.q) + bb * p.q_bstride + t * p.q_rstride + h * p.q_hstride, p.d * sizeof(float));
        const double logZ = st.logZ.data<double>()[row];
        for (int64_t h = 0; h < p.H; ++h) shift[r * p.H + h] = shift_of(p.lse[(bb * p.H + h) * p.sq + t], logZ);
        gr[r] = std::isfinite(logZ) ? p.coeff * p.row_weight[row] : 0.f;
        lseI[r] = st.lseI.data<float>()[row];
        any = any || gr[r] != 0.f;
      }
      if (!any) continue;
      std::fill(kl, kl + nr, 0.f), std::fill(dw, dw + nr * p.nI, 0.f);
      sgemm(Trans::no, Trans::yes, nr * p.nI, 1, p.dI, 1.f, QI, p.dI, f32p(p.kI) + ie * p.dI, p.dI, 0.f, S, 1);
      relu_head_sum(S, W, nr, p.nI, 1, I);
      sgemm(Trans::no, Trans::yes, nr * p.H, 1, p.d, p.scale, Qt, p.d, f32p(p.ent) + ie * p.d, p.d, 0.f, L, 1);
      for (int64_t r = 0; r < nr; ++r) {
        float acc = 0.f;
        for (int64_t h = 0; h < p.H; ++h) acc += exp_approx(L[r * p.H + h] - shift[r * p.H + h]);
        P[r] = acc;
      }
      kl_tile(P, I, nr, 1, lseI, gr, kl, dI);
      relu_head_sum_bwd(S, W, dI, nr, p.nI, 1, dS, dw);
      sgemm(Trans::yes, Trans::no, 1, p.dI, nr * p.nI, 1.f, dS, 1, QI, p.dI, 1.f, dkI, p.dI);
    }
  });
  finish(p, st);
}

// The CPU's plan for both KLs (cpu_kernels.h): f32, any shape.
Plan plan(Op, const CompressedIndexKlParams& p) { return plan_if(f32(p.dtype) && f32(p.qk_dtype), Variant::cpu); }

}  // namespace hmla::cpu
