// The CSA indexer's KL ("full CSA denominator", docs/csa_indexer_kl.md section 2) in float64 with
// plain loops, straight from the definition: per query row the joint logits of the window keys, the
// attended entries and the sink; P = normalise(sum_h exp(z_h - lse_h)) on the candidates (Megatron's
// formula, not the log Z form of section 4); Q = softmax_C(I); kl, the loss and the gradients of
// coeff * sum_t rw[t] kl(t) with respect to qI, kI and w by the chain rule of section 3. Independent
// of the ops (it reads only the layout's host doc_start); it materialises [b, s, n_e] tables (fine
// in an oracle). Header-only, no test framework. Checked by tests/ops/test_csa_kl_oracle.cpp.
// Letters: b batch, s rows, H heads, d head width, n_e entries per batch row, nI index heads, dI
// index head width, K table slots, W window.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "hmla/core/layout.h"

namespace hmla::op_cases {

struct CsaKlDims {
  int64_t b = 0, s = 0, H = 0, d = 0, n_e = 0, nI = 0, dI = 0;
  int64_t window = 1;  // W >= 1
  int64_t K = 0;       // 0: dense (dsa_warmup, C(t) = E(t)); else the table's slots (dsa_sparse)
};

// Everything in float64; the index tensors as the ops take them. Contracts as compressed_attention.h.
struct CsaKlInputs {
  CsaKlDims dm;
  std::vector<double> q;            // [b, s, H, d] attention queries (detached)
  std::vector<double> kv;           // [b, s, d] window keys
  std::vector<double> ent;          // [b, n_e, d] compressed entries
  std::vector<int32_t> ent_last;    // [b, n_e] row of the entry's window's last token
  std::vector<int32_t> ent_doc;     // [b, n_e] start row of the entry's document; -1: unused slot
  std::vector<double> sink;         // [H] raw logits (may be +-inf); empty: no sink
  double scale = 0;                 // on q . key only
  std::vector<int32_t> topk;        // sparse only: [b, s, K] entry indices (-1: none)
  std::vector<double> qI;           // [b, s, nI, dI]
  std::vector<double> kI;           // [b, n_e, dI]
  std::vector<double> w;            // [b, s, nI] (scales folded in)
  std::vector<double> row_weight;   // [b, s]: mask[t] / valid_rows
  double coeff = 0.01;
};

struct CsaKlRef {
  double kl_sum = 0;  // sum_t rw[t] kl(t), without coeff
  double loss = 0;    // coeff * kl_sum
  std::vector<double> dqI, dkI, dw;  // gradients of loss; shapes of qI, kI, w
  std::vector<double> kl;            // [b, s] per row, without weight or coeff
  std::vector<double> lse;           // [b, H, s] the attention's denominator lse_h(t) (sink included; +inf: padding)
  std::vector<char> cand;            // [b, s, n_e] 1 on C(t)
  std::vector<double> P, Q, I;       // [b, s, n_e] target, prediction (0 without a target), index score; 0 off C(t)
  std::vector<char> has_target;      // [b, s] C(t) non-empty and Z(t) > 0
};

// Visibility (compressed_attention.h): ent_doc[e] == doc_start[t] and ent_last[e] <= t; padding rows
// (doc_start > t) see nothing.
inline bool csa_kl_visible(const CsaKlInputs& x, int64_t st, int64_t bb, int64_t t, int64_t e) {
  const int64_t n_e = x.dm.n_e;
  return st <= t && e >= 0 && e < n_e && x.ent_doc[size_t(bb * n_e + e)] == st && x.ent_last[size_t(bb * n_e + e)] <= t;
}

// The candidates C(t), a set: dense every visible entry; sparse the visible entries listed in the
// table's K slots (-1 and invisible picks are none, a repeat counts once: the selected attention's
// mask, so C(t) is also the attended entry set A_E(t) of the denominator).
inline std::vector<char> csa_kl_candidates(const CsaKlInputs& x, const DocLayout& layout, int64_t bb, int64_t t) {
  const CsaKlDims& m = x.dm;
  const int64_t st = layout.doc_start.data<int32_t>()[bb * m.s + t];
  std::vector<char> c(size_t(m.n_e), 0);
  if (m.K == 0) {
    for (int64_t e = 0; e < m.n_e; ++e) c[size_t(e)] = csa_kl_visible(x, st, bb, t, e);
  } else {
    for (int64_t i = 0; i < m.K; ++i) {
      const int64_t e = x.topk[size_t((bb * m.s + t) * m.K + i)];
      if (csa_kl_visible(x, st, bb, t, e)) c[size_t(e)] = 1;
    }
  }
  return c;
}

inline CsaKlRef csa_kl_ref(const CsaKlInputs& x, const DocLayout& layout) {
  const CsaKlDims& m = x.dm;
  const int64_t b = m.b, s = m.s, H = m.H, d = m.d, n_e = m.n_e, nI = m.nI, dI = m.dI;
  const int32_t* ds = layout.doc_start.data<int32_t>();
  CsaKlRef r;
  r.dqI.assign(x.qI.size(), 0.0), r.dkI.assign(x.kI.size(), 0.0), r.dw.assign(x.w.size(), 0.0);
  r.kl.assign(size_t(b * s), 0.0), r.lse.assign(size_t(b * H * s), INFINITY);
  r.cand.assign(size_t(b * s * n_e), 0), r.has_target.assign(size_t(b * s), 0);
  r.P.assign(size_t(b * s * n_e), 0.0), r.Q = r.P, r.I = r.P;
  auto dot = [](const double* a, const double* c, int64_t n) {
    double acc = 0;
    for (int64_t i = 0; i < n; ++i) acc += a[i] * c[i];
    return acc;
  };
  for (int64_t bb = 0; bb < b; ++bb)
    for (int64_t t = 0; t < s; ++t) {
      const int64_t row = bb * s + t, st = ds[row];
      if (st > t) continue;  // padding: no target, lse +inf
      const std::vector<char> C = csa_kl_candidates(x, layout, bb, t);
      std::copy(C.begin(), C.end(), r.cand.begin() + row * n_e);
      // Per head the joint denominator over Wd(t), A_E(t) = C(t) and the sink, then p_h on C(t).
      std::vector<double> pe(size_t(n_e), 0.0);  // sum_h p_h(t, e)
      for (int64_t h = 0; h < H; ++h) {
        const double* qh = x.q.data() + ((row * H + h) * d);
        std::vector<double> logits;
        for (int64_t u = std::max(st, t - m.window + 1); u <= t; ++u)
          logits.push_back(x.scale * dot(qh, x.kv.data() + (bb * s + u) * d, d));
        std::vector<double> z(size_t(n_e), -INFINITY);
        for (int64_t e = 0; e < n_e; ++e)
          if (C[size_t(e)]) logits.push_back(z[size_t(e)] = x.scale * dot(qh, x.ent.data() + (bb * n_e + e) * d, d));
        if (!x.sink.empty()) logits.push_back(x.sink[size_t(h)]);
        double mx = -INFINITY;
        for (double l : logits) mx = std::max(mx, l);
        double lse = mx;  // +inf (an infinite sink) stays +inf; the window always holds t, so mx > -inf
        if (std::isfinite(mx)) {
          double den = 0;
          for (double l : logits) den += std::exp(l - mx);
          lse = mx + std::log(den);
        }
        r.lse[size_t((bb * H + h) * s + t)] = lse;
        for (int64_t e = 0; e < n_e; ++e)
          if (C[size_t(e)]) pe[size_t(e)] += std::exp(z[size_t(e)] - lse);  // 0 when lse = +inf
      }
      double Z = 0;
      for (int64_t e = 0; e < n_e; ++e) Z += pe[size_t(e)];
      if (std::find(C.begin(), C.end(), 1) == C.end()) continue;  // C(t) empty: kl 0, dI 0
      // Index scores on C(t), lseI, Q.
      std::vector<double> I(size_t(n_e), -INFINITY);
      double mI = -INFINITY;
      for (int64_t e = 0; e < n_e; ++e) {
        if (!C[size_t(e)]) continue;
        double v = 0;
        for (int64_t g = 0; g < nI; ++g)
          v += x.w[size_t(row * nI + g)] * std::max(0.0, dot(x.qI.data() + (row * nI + g) * dI, x.kI.data() + (bb * n_e + e) * dI, dI));
        I[size_t(e)] = r.I[size_t(row * n_e + e)] = v, mI = std::max(mI, v);
      }
      if (!(Z > 0)) continue;  // every head's lse +inf (an infinite sink): no target, kl 0, dI 0
      r.has_target[size_t(row)] = 1;
      double sI = 0;
      for (int64_t e = 0; e < n_e; ++e)
        if (C[size_t(e)]) sI += std::exp(I[size_t(e)] - mI);
      const double lseI = mI + std::log(sI);
      const double rw = x.row_weight[size_t(row)];
      double kl = 0;
      for (int64_t e = 0; e < n_e; ++e) {
        if (!C[size_t(e)]) continue;
        const double P = pe[size_t(e)] / Z, logQ = I[size_t(e)] - lseI, Q = std::exp(logQ);
        r.P[size_t(row * n_e + e)] = P, r.Q[size_t(row * n_e + e)] = Q;
        if (P > 0) kl += P * (std::log(P) - logQ);  // 0 log 0 = 0, no epsilon
        // dI = coeff rw (Q - P) (sum_C P = 1), through I = sum_g w_g relu(s_g).
        const double dI_ = x.coeff * rw * (Q - P);
        for (int64_t g = 0; g < nI; ++g) {
          const double* qg = x.qI.data() + (row * nI + g) * dI;
          const double* ke = x.kI.data() + (bb * n_e + e) * dI;
          const double sg = dot(qg, ke, dI);
          if (!(sg > 0)) continue;  // relu'(0) = 0; relu(s) = 0 adds nothing to dw either
          r.dw[size_t(row * nI + g)] += dI_ * sg;
          const double dsg = dI_ * x.w[size_t(row * nI + g)];
          for (int64_t c = 0; c < dI; ++c) {
            r.dqI[size_t((row * nI + g) * dI + c)] += dsg * ke[c];
            r.dkI[size_t((bb * n_e + e) * dI + c)] += dsg * qg[c];
          }
        }
      }
      r.kl[size_t(row)] = kl;
      r.kl_sum += rw * kl;
    }
  r.loss = x.coeff * r.kl_sum;
  return r;
}

// A case's inputs: documents per batch row from cu_seqlens (rows after the last: padding), an entry
// per m rows of each document (its trailing partial window never compressed), a shorter batch row's
// entry slots unused (-1), values uniform in (-a, a) rounded to f32 (what a backend sees), the sink
// 0.5 h - 0.3, rw = mask / valid_rows. Sparse (K > 0): the table as compressed_index_topk builds it
// from the true scores: the visible entries by descending I, ties to the smaller entry, then -1.
struct CsaKlCase {
  int64_t b, s, H, d, nI, dI, W, m, K;
  std::vector<std::vector<int64_t>> cu;
  bool sink = true;
  uint32_t seed = 1;
};

struct CsaKlData {
  CsaKlInputs x;
  DocLayout layout;
};

inline CsaKlData csa_kl_data(const CsaKlCase& c) {
  CsaKlData r;
  r.layout = layout_from_cu_seqlens(c.s, c.cu);
  CsaKlInputs& x = r.x;
  std::vector<std::vector<std::pair<int32_t, int32_t>>> ents(size_t(c.b));  // (doc, last) per row
  for (int64_t bb = 0; bb < c.b; ++bb)
    for (size_t i = 0; i + 1 < c.cu[size_t(bb)].size(); ++i) {
      const int64_t st = c.cu[size_t(bb)][i], en = c.cu[size_t(bb)][i + 1];
      for (int64_t w = 0; (w + 1) * c.m <= en - st; ++w) ents[size_t(bb)].push_back({int32_t(st), int32_t(st + (w + 1) * c.m - 1)});
    }
  int64_t n_e = 0;
  for (const auto& e : ents) n_e = std::max<int64_t>(n_e, int64_t(e.size()));
  x.dm = {c.b, c.s, c.H, c.d, n_e, c.nI, c.dI, c.W, c.K};
  x.ent_last.assign(size_t(c.b * n_e), -1), x.ent_doc.assign(size_t(c.b * n_e), -1);
  for (int64_t bb = 0; bb < c.b; ++bb)
    for (size_t e = 0; e < ents[size_t(bb)].size(); ++e)
      x.ent_doc[size_t(bb * n_e) + e] = ents[size_t(bb)][e].first, x.ent_last[size_t(bb * n_e) + e] = ents[size_t(bb)][e].second;
  std::mt19937 g(c.seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  auto fill = [&](std::vector<double>& v, int64_t n, double a) {
    v.resize(size_t(n));
    for (double& e : v) e = double(float(a * u(g)));
  };
  fill(x.q, c.b * c.s * c.H * c.d, 2.0);  // attention logits of a few units
  fill(x.kv, c.b * c.s * c.d, 1.5);
  fill(x.ent, c.b * n_e * c.d, 1.5);
  fill(x.qI, c.b * c.s * c.nI * c.dI, 1.0);
  fill(x.kI, c.b * n_e * c.dI, 1.0);
  fill(x.w, c.b * c.s * c.nI, 1.0);  // index scores of a few units, both signs
  x.scale = double(float(1.0 / std::sqrt(double(c.d))));
  if (c.sink)
    for (int64_t h = 0; h < c.H; ++h) x.sink.push_back(0.5 * double(h) - 0.3);
  const int32_t* ds = r.layout.doc_start.data<int32_t>();
  int64_t valid = 0;
  for (int64_t i = 0; i < c.b * c.s; ++i) valid += ds[i] <= i % c.s;
  x.row_weight.resize(size_t(c.b * c.s));
  for (int64_t i = 0; i < c.b * c.s; ++i) x.row_weight[size_t(i)] = ds[i] <= i % c.s ? 1.0 / double(valid) : 0.0;
  x.coeff = 0.5;
  if (c.K > 0) {  // the scores over every visible entry come from the dense oracle's I
    CsaKlInputs dense = x;
    dense.dm.K = 0;
    const CsaKlRef rd = csa_kl_ref(dense, r.layout);
    x.topk.assign(size_t(c.b * c.s * c.K), -1);
    for (int64_t row = 0; row < c.b * c.s; ++row) {
      std::vector<int32_t> vis;
      for (int64_t e = 0; e < n_e; ++e)
        if (rd.cand[size_t(row * n_e + e)]) vis.push_back(int32_t(e));
      std::stable_sort(vis.begin(), vis.end(), [&](int32_t a, int32_t b2) {
        return rd.I[size_t(row * n_e + a)] > rd.I[size_t(row * n_e + b2)];
      });
      for (size_t i = 0; i < vis.size() && int64_t(i) < c.K; ++i) x.topk[size_t(row * c.K) + i] = vis[i];
    }
  }
  return r;
}

}  // namespace hmla::op_cases
