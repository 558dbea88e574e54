// The float64 oracle of the CSA indexer's KL (tests/common/csa_kl_oracle.h, docs/csa_indexer_kl.md)
// checked on its own, before any op uses it: its gradients against central differences of its own
// loss; its target against Megatron's definition written out differently (per head the full
// [s, s + n_e + 1] probability table over window keys, entries and the sink, restricted to the
// candidates, summed over heads, normalised); and the edge cases of the note's section 7 (rows
// without entries, padding, infinite sinks, equal-mass heads = the MLA mean, sparse tables).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "csa_kl_oracle.h"

namespace hmla {
namespace {

using op_cases::CsaKlCase;
using op_cases::CsaKlData;
using op_cases::CsaKlInputs;
using op_cases::CsaKlRef;
using op_cases::csa_kl_data;
using op_cases::csa_kl_ref;

// b = 2: row 0 holds documents [0,3) (shorter than the rate: no entry), [3,11), [11,24) and padding
// 24..27; row 1 one document [0,25) and padding. H = 3, d = 4, nI = 2, dI = 3, W = 3, m = 2.
CsaKlCase small_case(int64_t K, bool sink = true, uint32_t seed = 7) {
  return {2, 28, 3, 4, 2, 3, 3, 2, K, {{0, 3, 11, 24}, {0, 25}}, sink, seed};
}

// Each gradient of coeff * kl_sum against (L(x + h) - L(x - h)) / 2h. With h = 1e-4 the truncation
// error is h^2 / 6 |L'''| and the cancellation about 1e-16 |L| / h: with scores of a few units both
// stay far below 1e-6 of the tensor's largest gradient, while a missing term (a relu mask, a head
// weight, a row weight) moves a gradient by a sizeable fraction of it. The sparse table is held fixed
// (it carries no gradient). No s_g lies within 1e-3 of the relu kink in these data (checked).
TEST(CsaKlOracle, GradientsMatchCentralDifferences) {
  for (int64_t K : {0, 2}) {
    CsaKlData data = csa_kl_data(small_case(K));
    CsaKlInputs& x = data.x;
    const CsaKlRef r = csa_kl_ref(x, data.layout);
    ASSERT_GT(r.kl_sum, 0) << "K = " << K;
    for (int64_t bb = 0; bb < x.dm.b; ++bb)
      for (int64_t t = 0; t < x.dm.s; ++t)
        for (int64_t e = 0; e < x.dm.n_e; ++e)
          if (r.cand[size_t((bb * x.dm.s + t) * x.dm.n_e + e)])
            for (int64_t g = 0; g < x.dm.nI; ++g) {
              double sg = 0;
              for (int64_t c = 0; c < x.dm.dI; ++c)
                sg += x.qI[size_t(((bb * x.dm.s + t) * x.dm.nI + g) * x.dm.dI + c)] * x.kI[size_t((bb * x.dm.n_e + e) * x.dm.dI + c)];
              ASSERT_GT(std::abs(sg), 1e-3) << "a score at the relu kink: pick another seed";
            }
    const double h = 1e-4;
    auto fd = [&](std::vector<double>& v, const std::vector<double>& grad, const char* name) {
      ASSERT_EQ(v.size(), grad.size()) << name;
      double gmax = 0;
      for (double gi : grad) gmax = std::max(gmax, std::abs(gi));
      ASSERT_GT(gmax, 1e-4) << name << ": a trivial gradient tests nothing";
      for (size_t i = 0; i < v.size(); ++i) {
        const double v0 = v[i];
        v[i] = v0 + h;
        const double lp = csa_kl_ref(x, data.layout).loss;
        v[i] = v0 - h;
        const double lm = csa_kl_ref(x, data.layout).loss;
        v[i] = v0;
        EXPECT_NEAR((lp - lm) / (2 * h), grad[i], 1e-6 * gmax) << name << "[" << i << "] K = " << K;
      }
    };
    fd(x.qI, r.dqI, "dqI");
    fd(x.kI, r.dkI, "dkI");
    fd(x.w, r.dw, "dw");
  }
}

// Megatron's definition, materialised and computed another way: per (batch row, head) the logit
// table [s, s + n_e + 1] (window key columns, entry columns masked to the attended set, the sink
// column), its row softmax as exp(l) / sum exp(l) without a shift (logits of a few units here), the
// entry columns of the candidates summed over heads and L1-normalised; Q a masked softmax of the
// [s, n_e] score table; kl per row; the loss a mean over the non-padding rows.
struct Materialised {
  std::vector<double> P, lse;  // [b, s, n_e], [b, H, s]
  double kl_mean = 0;
};

Materialised megatron_materialised(const CsaKlInputs& x, const DocLayout& layout) {
  const auto& m = x.dm;
  const int64_t s = m.s, n_e = m.n_e, ncol = s + n_e + 1;
  const int32_t* ds = layout.doc_start.data<int32_t>();
  Materialised out;
  out.P.assign(size_t(m.b * s * n_e), 0.0), out.lse.assign(size_t(m.b * m.H * s), INFINITY);
  std::vector<double> target(size_t(m.b * s * n_e), 0.0);
  for (int64_t bb = 0; bb < m.b; ++bb) {
    // Masks [s, ncol]: attended columns (window, entries, sink) and candidate columns (entries).
    std::vector<char> attend(size_t(s * ncol), 0), cand(size_t(s * ncol), 0);
    for (int64_t t = 0; t < s; ++t) {
      const int64_t st = ds[bb * s + t];
      if (st > t) continue;
      for (int64_t u = 0; u < s; ++u) attend[size_t(t * ncol + u)] = u >= st && u <= t && u > t - m.window;
      for (int64_t e = 0; e < n_e; ++e) {
        const bool vis = x.ent_doc[size_t(bb * n_e + e)] == st && x.ent_last[size_t(bb * n_e + e)] <= t;
        bool listed = m.K == 0;
        for (int64_t i = 0; i < m.K; ++i) listed = listed || x.topk[size_t((bb * s + t) * m.K + i)] == e;
        cand[size_t(t * ncol + s + e)] = attend[size_t(t * ncol + s + e)] = vis && listed;
      }
      attend[size_t(t * ncol + s + n_e)] = !x.sink.empty();
    }
    for (int64_t h = 0; h < m.H; ++h) {
      std::vector<double> L(size_t(s * ncol), -INFINITY);
      for (int64_t t = 0; t < s; ++t)
        for (int64_t j = 0; j < ncol; ++j) {
          if (!attend[size_t(t * ncol + j)]) continue;
          if (j == s + n_e) {
            L[size_t(t * ncol + j)] = x.sink[size_t(h)];
            continue;
          }
          const double* key = j < s ? &x.kv[size_t((bb * s + j) * m.d)] : &x.ent[size_t((bb * n_e + j - s) * m.d)];
          double acc = 0;
          for (int64_t c = 0; c < m.d; ++c) acc += x.q[size_t(((bb * s + t) * m.H + h) * m.d + c)] * key[c];
          L[size_t(t * ncol + j)] = x.scale * acc;
        }
      for (int64_t t = 0; t < s; ++t) {
        double den = 0;
        bool any = false;
        for (int64_t j = 0; j < ncol; ++j)
          if (attend[size_t(t * ncol + j)]) den += std::exp(L[size_t(t * ncol + j)]), any = true;
        if (!any) continue;
        out.lse[size_t((bb * m.H + h) * s + t)] = std::log(den);
        for (int64_t e = 0; e < n_e; ++e)
          if (cand[size_t(t * ncol + s + e)]) target[size_t((bb * s + t) * n_e + e)] += std::exp(L[size_t(t * ncol + s + e)]) / den;
      }
    }
    for (int64_t t = 0; t < s; ++t) {
      const int64_t row = bb * s + t;
      double sum = 0, qden = 0;
      std::vector<double> I(size_t(n_e), 0.0);
      for (int64_t e = 0; e < n_e; ++e) {
        if (!cand[size_t(t * ncol + s + e)]) continue;
        sum += target[size_t(row * n_e + e)];
        for (int64_t g = 0; g < m.nI; ++g) {
          double sg = 0;
          for (int64_t c = 0; c < m.dI; ++c)
            sg += x.qI[size_t((row * m.nI + g) * m.dI + c)] * x.kI[size_t((bb * n_e + e) * m.dI + c)];
          I[size_t(e)] += x.w[size_t(row * m.nI + g)] * (sg > 0 ? sg : 0);
        }
        qden += std::exp(I[size_t(e)]);
      }
      if (!(sum > 0)) continue;
      for (int64_t e = 0; e < n_e; ++e) {
        if (!cand[size_t(t * ncol + s + e)]) continue;
        const double p = out.P[size_t(row * n_e + e)] = target[size_t(row * n_e + e)] / sum;
        out.kl_mean += p * (std::log(p) - (I[size_t(e)] - std::log(qden)));
      }
    }
  }
  int64_t valid = 0;
  for (int64_t i = 0; i < m.b * s; ++i) valid += ds[i] <= i % s;
  out.kl_mean /= double(valid);
  return out;
}

TEST(CsaKlOracle, TargetMatchesMegatronMaterialised) {
  for (int64_t K : {0, 2}) {
    for (bool sink : {true, false}) {
      const CsaKlData data = csa_kl_data(small_case(K, sink, 11));
      const CsaKlRef r = csa_kl_ref(data.x, data.layout);
      const Materialised mt = megatron_materialised(data.x, data.layout);
      for (size_t i = 0; i < r.P.size(); ++i) EXPECT_NEAR(r.P[i], mt.P[i], 1e-13) << "P[" << i << "] K = " << K;
      for (size_t i = 0; i < r.lse.size(); ++i) {
        if (std::isinf(mt.lse[i])) {
          EXPECT_EQ(r.lse[i], mt.lse[i]) << "lse[" << i << "]";
        } else {
          EXPECT_NEAR(r.lse[i], mt.lse[i], 1e-13) << "lse[" << i << "] K = " << K;
        }
      }
      // rw = mask / valid_rows: kl_sum is Megatron's mean over the non-padding rows.
      EXPECT_NEAR(r.kl_sum, mt.kl_mean, 1e-14) << "K = " << K;
    }
  }
}

// The mixture form (note section 4): P = sum_h pi_h softmax_C(z_h), pi_h = c_h / Z, c_h the head's
// candidate mass; with H = 1, P = softmax_C(z). Unequal masses here make P differ from the 1/H mean.
std::vector<double> softmax_c(const CsaKlInputs& x, const CsaKlRef& r, int64_t row, int64_t h) {
  const auto& m = x.dm;
  const int64_t bb = row / m.s, n_e = m.n_e;
  std::vector<double> z(size_t(n_e), 0.0);
  double den = 0;
  for (int64_t e = 0; e < n_e; ++e) {
    if (!r.cand[size_t(row * n_e + e)]) continue;
    double acc = 0;
    for (int64_t c = 0; c < m.d; ++c) acc += x.q[size_t((row * m.H + h) * m.d + c)] * x.ent[size_t((bb * n_e + e) * m.d + c)];
    den += z[size_t(e)] = std::exp(x.scale * acc);
  }
  for (double& v : z) v /= den;
  return z;
}
// c_h(t) = sum_C exp(z - lse_h).
double head_mass(const CsaKlInputs& x, const CsaKlRef& r, int64_t row, int64_t h) {
  const auto& m = x.dm;
  const int64_t bb = row / m.s, n_e = m.n_e;
  double c = 0;
  for (int64_t e = 0; e < n_e; ++e) {
    if (!r.cand[size_t(row * n_e + e)]) continue;
    double acc = 0;
    for (int64_t ch = 0; ch < m.d; ++ch) acc += x.q[size_t((row * m.H + h) * m.d + ch)] * x.ent[size_t((bb * n_e + e) * m.d + ch)];
    c += std::exp(x.scale * acc - r.lse[size_t((bb * m.H + h) * m.s + row % m.s)]);
  }
  return c;
}

TEST(CsaKlOracle, TargetIsTheMassWeightedMixtureOfHeads) {
  const CsaKlData data = csa_kl_data(small_case(0));
  const CsaKlInputs& x = data.x;
  const CsaKlRef r = csa_kl_ref(x, data.layout);
  const int64_t n_e = x.dm.n_e;
  double mean_gap = 0;
  for (int64_t row = 0; row < x.dm.b * x.dm.s; ++row) {
    if (!r.has_target[size_t(row)]) continue;
    std::vector<double> c(size_t(x.dm.H));
    double Z = 0;
    for (int64_t h = 0; h < x.dm.H; ++h) Z += c[size_t(h)] = head_mass(x, r, row, h);
    std::vector<double> mix(size_t(n_e), 0.0), mean(size_t(n_e), 0.0);
    for (int64_t h = 0; h < x.dm.H; ++h) {
      const std::vector<double> sm = softmax_c(x, r, row, h);
      for (int64_t e = 0; e < n_e; ++e) mix[size_t(e)] += c[size_t(h)] / Z * sm[size_t(e)], mean[size_t(e)] += sm[size_t(e)] / double(x.dm.H);
    }
    for (int64_t e = 0; e < n_e; ++e) {
      EXPECT_NEAR(r.P[size_t(row * n_e + e)], mix[size_t(e)], 1e-14) << "row " << row << " e " << e;
      mean_gap = std::max(mean_gap, std::abs(r.P[size_t(row * n_e + e)] - mean[size_t(e)]));
    }
  }
  EXPECT_GT(mean_gap, 1e-3) << "unequal head masses should move P off the 1/H mean";

  CsaKlCase c1 = small_case(0);
  c1.H = 1;
  const CsaKlData d1 = csa_kl_data(c1);
  const CsaKlRef r1 = csa_kl_ref(d1.x, d1.layout);
  for (int64_t row = 0; row < d1.x.dm.b * d1.x.dm.s; ++row) {
    if (!r1.has_target[size_t(row)]) continue;
    const std::vector<double> sm = softmax_c(d1.x, r1, row, 0);
    for (int64_t e = 0; e < d1.x.dm.n_e; ++e) EXPECT_NEAR(r1.P[size_t(row * d1.x.dm.n_e + e)], sm[size_t(e)], 1e-14);
  }
}

// Rows before a document's first entry (positions < m - 1, and the whole document shorter than m)
// have no candidate: kl 0, zero gradients, and they still count in valid_rows (rw = 1 / valid).
// A row with one candidate has P = Q = 1: kl 0 and dI 0.
TEST(CsaKlOracle, RowsWithoutEntriesCountInTheDivisorWithKlZero) {
  CsaKlCase c = small_case(0);
  c.m = 4;
  const CsaKlData data = csa_kl_data(c);
  const CsaKlInputs& x = data.x;
  const CsaKlRef r = csa_kl_ref(x, data.layout);
  const int32_t* ds = data.layout.doc_start.data<int32_t>();
  int64_t empty = 0, single = 0, valid = 0;
  double sum = 0;
  for (int64_t row = 0; row < x.dm.b * x.dm.s; ++row) {
    const int64_t t = row % x.dm.s, st = ds[row];
    if (st > t) continue;
    ++valid, sum += r.kl[size_t(row)];
    int64_t n = 0;
    for (int64_t e = 0; e < x.dm.n_e; ++e) n += r.cand[size_t(row * x.dm.n_e + e)];
    EXPECT_EQ(n, (t - st + 1) / c.m) << "row " << row;  // the windows of m that ended by t
    if (n > 1) continue;
    n == 0 ? ++empty : ++single;
    EXPECT_GT(x.row_weight[size_t(row)], 0) << "a real token counts in valid_rows";
    EXPECT_EQ(r.kl[size_t(row)], 0.0) << "row " << row;
    for (int64_t i = 0; i < x.dm.nI * x.dm.dI; ++i) EXPECT_EQ(r.dqI[size_t(row * x.dm.nI * x.dm.dI + i)], 0.0) << "row " << row;
    for (int64_t g = 0; g < x.dm.nI; ++g) EXPECT_EQ(r.dw[size_t(row * x.dm.nI + g)], 0.0) << "row " << row;
  }
  EXPECT_GE(empty, 3 + 3 + 3 + 3) << "docs [0,3) entire, [3,11), [11,24), [0,25): 3 rows each";
  EXPECT_GT(single, 0);
  EXPECT_NEAR(r.kl_sum, sum / double(valid), 1e-15);
}

// Padding rows (mask 0): lse +inf on every head, no target, kl 0, zero gradients; a row weight put
// on them by mistake changes nothing.
TEST(CsaKlOracle, PaddingRowsHaveNoTarget) {
  CsaKlData data = csa_kl_data(small_case(0));
  CsaKlInputs& x = data.x;
  const CsaKlRef r = csa_kl_ref(x, data.layout);
  const int32_t* ds = data.layout.doc_start.data<int32_t>();
  int64_t pads = 0;
  for (int64_t row = 0; row < x.dm.b * x.dm.s; ++row) {
    if (ds[row] <= row % x.dm.s) continue;
    ++pads;
    EXPECT_EQ(x.row_weight[size_t(row)], 0.0);
    EXPECT_FALSE(r.has_target[size_t(row)]);
    for (int64_t h = 0; h < x.dm.H; ++h) EXPECT_EQ(r.lse[size_t(((row / x.dm.s) * x.dm.H + h) * x.dm.s + row % x.dm.s)], INFINITY);
    x.row_weight[size_t(row)] = 1.0;
  }
  EXPECT_EQ(pads, 4 + 3);
  const CsaKlRef r2 = csa_kl_ref(x, data.layout);
  EXPECT_EQ(r2.kl_sum, r.kl_sum);
  EXPECT_EQ(r2.dqI, r.dqI);
  EXPECT_EQ(r2.dkI, r.dkI);
  EXPECT_EQ(r2.dw, r.dw);
}

// The same inputs without head h0 (q's head dropped, and its sink).
CsaKlInputs drop_head(const CsaKlInputs& x, int64_t h0) {
  CsaKlInputs y = x;
  y.dm.H = x.dm.H - 1;
  y.q.clear(), y.sink.clear();
  for (int64_t row = 0; row < x.dm.b * x.dm.s; ++row)
    for (int64_t h = 0; h < x.dm.H; ++h)
      if (h != h0) y.q.insert(y.q.end(), x.q.begin() + (row * x.dm.H + h) * x.dm.d, x.q.begin() + (row * x.dm.H + h + 1) * x.dm.d);
  for (int64_t h = 0; h < x.dm.H; ++h)
    if (h != h0) y.sink.push_back(x.sink[size_t(h)]);
  return y;
}

// Sink +inf on one head: that head's lse is +inf, its candidate mass 0, so the target, kl and the
// gradients are those of the other heads alone. +inf on every head: no target anywhere (kl 0,
// gradients 0, no NaN). -inf is no sink, exactly. A large sink (80) makes every c_h tiny while P
// still sums to 1.
TEST(CsaKlOracle, InfiniteAndLargeSinks) {
  for (int64_t K : {0, 2}) {
    CsaKlData data = csa_kl_data(small_case(K));
    CsaKlInputs& x = data.x;
    x.sink[1] = INFINITY;
    const CsaKlRef r = csa_kl_ref(x, data.layout);
    const CsaKlRef r2 = csa_kl_ref(drop_head(x, 1), data.layout);
    for (int64_t row = 0; row < x.dm.b * x.dm.s; ++row) {
      if (data.layout.doc_start.data<int32_t>()[row] > row % x.dm.s) continue;
      EXPECT_EQ(r.lse[size_t(((row / x.dm.s) * x.dm.H + 1) * x.dm.s + row % x.dm.s)], INFINITY);
    }
    for (size_t i = 0; i < r.P.size(); ++i) EXPECT_NEAR(r.P[i], r2.P[i], 1e-15) << "P[" << i << "] K = " << K;
    EXPECT_NEAR(r.kl_sum, r2.kl_sum, 1e-15);
    for (size_t i = 0; i < r.dqI.size(); ++i) EXPECT_NEAR(r.dqI[i], r2.dqI[i], 1e-15);
    for (size_t i = 0; i < r.dkI.size(); ++i) EXPECT_NEAR(r.dkI[i], r2.dkI[i], 1e-15);
    for (size_t i = 0; i < r.dw.size(); ++i) EXPECT_NEAR(r.dw[i], r2.dw[i], 1e-15);

    std::fill(x.sink.begin(), x.sink.end(), INFINITY);
    const CsaKlRef ri = csa_kl_ref(x, data.layout);
    EXPECT_EQ(ri.kl_sum, 0.0);
    for (char ht : ri.has_target) EXPECT_FALSE(ht);
    for (double v : ri.dqI) EXPECT_EQ(v, 0.0);
    for (double v : ri.dkI) EXPECT_EQ(v, 0.0);
    for (double v : ri.dw) EXPECT_EQ(v, 0.0);

    std::fill(x.sink.begin(), x.sink.end(), -INFINITY);
    const CsaKlRef rn = csa_kl_ref(x, data.layout);
    CsaKlInputs none = x;
    none.sink.clear();
    const CsaKlRef rw = csa_kl_ref(none, data.layout);
    EXPECT_EQ(rn.P, rw.P);
    EXPECT_EQ(rn.kl_sum, rw.kl_sum);
    EXPECT_EQ(rn.dqI, rw.dqI);

    std::fill(x.sink.begin(), x.sink.end(), 80.0);
    const CsaKlRef rl = csa_kl_ref(x, data.layout);
    for (int64_t row = 0; row < x.dm.b * x.dm.s; ++row) {
      if (!rl.has_target[size_t(row)]) continue;
      double sum = 0;
      for (int64_t e = 0; e < x.dm.n_e; ++e) sum += rl.P[size_t(row * x.dm.n_e + e)];
      EXPECT_NEAR(sum, 1.0, 1e-14);
      EXPECT_LT(head_mass(x, rl, row, 0), 1e-30);
    }
    EXPECT_TRUE(std::isfinite(rl.kl_sum));
    EXPECT_GT(rl.kl_sum, 0);
  }
}

// Equal candidate masses make pi_h = 1/H, so P is hmla's MLA-style target (1/H) sum_h softmax_C(z_h)
// (the note's sections 4 and 6). Identical heads give that on every row; distinct heads whose sinks
// are tuned to equalise the masses at one row t0 give it at t0 (and not elsewhere).
TEST(CsaKlOracle, EqualMassHeadsGiveTheMlaMean) {
  auto mla_mean = [](const CsaKlInputs& x, const CsaKlRef& r, int64_t row) {
    std::vector<double> mean(size_t(x.dm.n_e), 0.0);
    for (int64_t h = 0; h < x.dm.H; ++h) {
      const std::vector<double> sm = softmax_c(x, r, row, h);
      for (int64_t e = 0; e < x.dm.n_e; ++e) mean[size_t(e)] += sm[size_t(e)] / double(x.dm.H);
    }
    return mean;
  };
  {
    CsaKlData data = csa_kl_data(small_case(0));
    CsaKlInputs& x = data.x;
    for (int64_t row = 0; row < x.dm.b * x.dm.s; ++row)
      for (int64_t h = 1; h < x.dm.H; ++h)
        std::copy_n(x.q.begin() + row * x.dm.H * x.dm.d, x.dm.d, x.q.begin() + (row * x.dm.H + h) * x.dm.d);
    std::fill(x.sink.begin(), x.sink.end(), 0.2);
    const CsaKlRef r = csa_kl_ref(x, data.layout);
    for (int64_t row = 0; row < x.dm.b * x.dm.s; ++row) {
      if (!r.has_target[size_t(row)]) continue;
      const std::vector<double> mean = mla_mean(x, r, row);
      for (int64_t e = 0; e < x.dm.n_e; ++e) EXPECT_NEAR(r.P[size_t(row * x.dm.n_e + e)], mean[size_t(e)], 1e-14);
    }
  }
  {
    CsaKlData data = csa_kl_data(small_case(0));
    CsaKlInputs& x = data.x;
    const int64_t bb = 1, t0 = 20, row0 = bb * x.dm.s + t0;  // document [0, 25) of row 1: 10 entries visible
    x.sink.clear();
    const CsaKlRef r0 = csa_kl_ref(x, data.layout);  // without sink: lse_h = log(W_h + E_h)
    std::vector<double> Wm(size_t(x.dm.H)), Em(size_t(x.dm.H));
    double c = 1;
    for (int64_t h = 0; h < x.dm.H; ++h) {
      Em[size_t(h)] = head_mass(x, r0, row0, h) * std::exp(r0.lse[size_t((bb * x.dm.H + h) * x.dm.s + t0)]);
      Wm[size_t(h)] = std::exp(r0.lse[size_t((bb * x.dm.H + h) * x.dm.s + t0)]) - Em[size_t(h)];
      c = std::min(c, Em[size_t(h)] / (Wm[size_t(h)] + Em[size_t(h)]));
    }
    c *= 0.5;  // a common mass every head reaches with a positive sink term
    for (int64_t h = 0; h < x.dm.H; ++h) x.sink.push_back(std::log(Em[size_t(h)] / c - Wm[size_t(h)] - Em[size_t(h)]));
    const CsaKlRef r = csa_kl_ref(x, data.layout);
    for (int64_t h = 0; h < x.dm.H; ++h) EXPECT_NEAR(head_mass(x, r, row0, h), c, 1e-13 * c);
    const std::vector<double> mean = mla_mean(x, r, row0);
    double gap = 0;
    for (int64_t e = 0; e < x.dm.n_e; ++e) {
      EXPECT_NEAR(r.P[size_t(row0 * x.dm.n_e + e)], mean[size_t(e)], 1e-13);
      gap = std::max(gap, std::abs(mean[size_t(e)] - softmax_c(x, r, row0, 0)[size_t(e)]));
    }
    EXPECT_GT(gap, 1e-3) << "the heads' softmaxes differ: the mean is not trivial";
    const int64_t row1 = bb * x.dm.s + 12;
    const std::vector<double> mean1 = mla_mean(x, r, row1);
    double gap1 = 0;
    for (int64_t e = 0; e < x.dm.n_e; ++e) gap1 = std::max(gap1, std::abs(r.P[size_t(row1 * x.dm.n_e + e)] - mean1[size_t(e)]));
    EXPECT_GT(gap1, 1e-4) << "another row keeps unequal masses";
  }
}

// Sparse tables: the order of a row's K slots changes nothing; -1 slots, invisible picks and repeats
// are not candidates (the set); K at least every row's visible count gives the dense KL.
TEST(CsaKlOracle, SparseTableIsASetAndLargeKIsDense) {
  CsaKlData data = csa_kl_data(small_case(3));
  CsaKlInputs& x = data.x;
  const CsaKlRef r = csa_kl_ref(x, data.layout);
  CsaKlInputs dense = x;
  dense.dm.K = 0;
  std::mt19937 g(5);
  CsaKlInputs y = x;
  y.dm.K = x.dm.K + 2;  // two more slots: a repeat and an invisible pick (or -1 where none exists)
  y.topk.assign(size_t(x.dm.b * x.dm.s * y.dm.K), -1);
  for (int64_t row = 0; row < x.dm.b * x.dm.s; ++row) {
    const std::vector<char> vis = op_cases::csa_kl_candidates(dense, data.layout, row / x.dm.s, row % x.dm.s);
    int32_t* o = &y.topk[size_t(row * y.dm.K)];
    std::copy_n(&x.topk[size_t(row * x.dm.K)], x.dm.K, o);
    o[x.dm.K] = o[0];
    for (int64_t e = x.dm.n_e - 1; e >= 0; --e)
      if (!vis[size_t(e)]) o[x.dm.K + 1] = int32_t(e);
    std::shuffle(o, o + y.dm.K, g);
  }
  const CsaKlRef ry = csa_kl_ref(y, data.layout);
  EXPECT_EQ(ry.cand, r.cand);
  EXPECT_NEAR(ry.kl_sum, r.kl_sum, 1e-15);
  for (size_t i = 0; i < r.dqI.size(); ++i) EXPECT_NEAR(ry.dqI[i], r.dqI[i], 1e-15);
  for (size_t i = 0; i < r.dkI.size(); ++i) EXPECT_NEAR(ry.dkI[i], r.dkI[i], 1e-15);
  for (size_t i = 0; i < r.dw.size(); ++i) EXPECT_NEAR(ry.dw[i], r.dw[i], 1e-15);

  // K = n_e lists every visible entry of every row: the dense KL.
  const CsaKlData big = csa_kl_data(small_case(32));
  CsaKlInputs big_dense = big.x;
  big_dense.dm.K = 0;
  const CsaKlRef rb = csa_kl_ref(big.x, big.layout), rd = csa_kl_ref(big_dense, big.layout);
  EXPECT_EQ(rb.cand, rd.cand);
  EXPECT_NEAR(rb.kl_sum, rd.kl_sum, 1e-15);
  for (size_t i = 0; i < rd.dqI.size(); ++i) EXPECT_NEAR(rb.dqI[i], rd.dqI[i], 1e-15);
  for (size_t i = 0; i < rd.dkI.size(); ++i) EXPECT_NEAR(rb.dkI[i], rd.dkI[i], 1e-15);
  // K below the visible count: a strict subset, a different loss.
  EXPECT_NE(r.kl_sum, rd.kl_sum);
}

}  // namespace
}  // namespace hmla
