// Row slices: the kernels context parallelism runs. Each slice computes query rows [r0, r0 + sq)
// against every key row; concatenating the slices' per-query outputs and summing their key
// gradients must give the full problem's result, checked against the float64 oracles by the
// STYLE.md rule. Slices are cut at s * r / R, deliberately not at tile multiples, and cross
// documents, padding and empty rows.
#include <gtest/gtest.h>

#include "attn_dense_ref.h"
#include "attn_sparse_ref.h"
#include "hmla/ops/attention.h"
#include "hmla/ops/indexer.h"
#include "hmla/ops/sparse_attention.h"
#include "indexer_ref.h"
#include "testing.h"

namespace hmla {
namespace {

using testing::randn;
using testing::to_f64;

using testing::rows_of;

// Writes a slice's rows back into the full [b, s, width] vector.
template <class T>
void put_rows(std::vector<T>& full, const std::vector<T>& part, int64_t b, int64_t s, int64_t width, int64_t r0,
              int64_t n) {
  for (int64_t bb = 0; bb < b; ++bb)
    std::copy(part.begin() + bb * n * width, part.begin() + (bb + 1) * n * width, full.begin() + (bb * s + r0) * width);
}

void add(std::vector<float>& acc, const std::vector<float>& x) {
  for (size_t i = 0; i < acc.size(); ++i) acc[i] += x[i];
}

struct Slice {
  int64_t r0, n;
};

std::vector<Slice> slices(int64_t s, int64_t R) {
  std::vector<Slice> v;
  for (int64_t r = 0; r < R; ++r) v.push_back({s * r / R, s * (r + 1) / R - s * r / R});
  return v;
}

TEST(RowSlices, DenseAttentionMatchesTheOracle) {
  struct Case {
    int64_t b, s, H, Hkv, Dqk, Dv;
    std::vector<std::vector<int64_t>> cu;
    bool sink, v_from_k;
  };
  // A document straddling every cut, tail padding in the last slice, GQA, the latent form.
  const std::vector<Case> cases{{1, 300, 2, 2, 24, 16, {{0, 50, 51, 180, 260}}, false, false},
                                {2, 150, 4, 2, 16, 8, {{0, 140}, {0, 1, 20, 30}}, true, false},
                                {1, 200, 3, 1, 40, 32, {{0, 90, 199}}, true, true}};
  for (const Case& c : cases) {
    DocLayout layout = layout_from_cu_seqlens(c.s, c.cu);
    auto q = randn(c.b * c.s * c.H * c.Dqk, 1), k = randn(c.b * c.s * c.Hkv * c.Dqk, 2),
         dout = randn(c.b * c.s * c.H * c.Dv, 4);
    std::vector<float> v;
    if (c.v_from_k) {
      for (int64_t r = 0; r < c.b * c.s * c.Hkv; ++r) v.insert(v.end(), k.begin() + r * c.Dqk, k.begin() + r * c.Dqk + c.Dv);
    } else {
      v = randn(c.b * c.s * c.Hkv * c.Dv, 3);
    }
    auto sink = c.sink ? randn(c.H, 5) : std::vector<float>{};
    const float scale = 0.2f;
    const int64_t R = 3;
    std::vector<float> out(c.b * c.s * c.H * c.Dv), lse(c.b * c.H * c.s), dq(q.size()), dk(k.size(), 0.f),
        dv(v.size(), 0.f), dsink(c.H, 0.f);
    for (Slice sl : slices(c.s, R)) {
      AttnDenseInputs in;
      in.q = Tensor::from_vector<float>({c.b, sl.n, c.H, c.Dqk}, rows_of(q, c.b, c.s, c.H * c.Dqk, sl.r0, sl.n));
      in.k = Tensor::from_vector<float>({c.b, c.s, c.Hkv, c.Dqk}, k);
      in.v = c.v_from_k ? in.k.slice(3, 0, c.Dv) : Tensor::from_vector<float>({c.b, c.s, c.Hkv, c.Dv}, v);
      if (c.sink) in.sink = Tensor::from_vector<float>({c.H}, sink);
      in.layout = &layout;
      in.scale = scale;
      in.q_row0 = sl.r0;
      AttnDenseSaved sv = attn_dense_fwd(in);
      AttnDenseGrads g = attn_dense_bwd(
          in, sv, Tensor::from_vector<float>({c.b, sl.n, c.H, c.Dv}, rows_of(dout, c.b, c.s, c.H * c.Dv, sl.r0, sl.n)));
      put_rows(out, sv.out.to_vector<float>(), c.b, c.s, c.H * c.Dv, sl.r0, sl.n);
      put_rows(lse, sv.lse.to_vector<float>(), c.b * c.H, c.s, 1, sl.r0, sl.n);  // [b, H, sq] rows
      put_rows(dq, g.dq.to_vector<float>(), c.b, c.s, c.H * c.Dqk, sl.r0, sl.n);
      add(dk, g.dk.to_vector<float>());
      if (c.v_from_k) {  // the value's gradient lands on the key's first Dv channels
        auto gv = g.dv.to_vector<float>();
        for (int64_t r = 0; r < c.b * c.s * c.Hkv; ++r)
          for (int64_t i = 0; i < c.Dv; ++i) dk[r * c.Dqk + i] += gv[r * c.Dv + i];
      } else {
        add(dv, g.dv.to_vector<float>());
      }
      if (c.sink) add(dsink, g.dsink.to_vector<float>());
    }
    ref::AttnDims d{c.b, c.s, c.H, c.Hkv, c.Dqk, c.Dv};
    auto ds = layout.doc_start.to_vector<int32_t>();
    auto o64 = ref::attn_dense_ref<double>(d, to_f64(q), to_f64(k), to_f64(v), ds, to_f64(sink), double(scale), to_f64(dout));
    auto o32 = ref::attn_dense_ref<float>(d, q, k, v, ds, sink, scale, dout);
    if (c.v_from_k) {  // v is k's first Dv channels: the key gets both gradients
      auto fold = [&](auto& dk_, const auto& dv_) {
        for (int64_t r = 0; r < c.b * c.s * c.Hkv; ++r)
          for (int64_t i = 0; i < c.Dv; ++i) dk_[r * c.Dqk + i] += dv_[r * c.Dv + i];
      };
      fold(o64.dk, o64.dv);
      fold(o32.dk, o32.dv);
    }
    testing::expect_within_rule("out", out, o32.out, o64.out);
    testing::expect_within_rule("lse", lse, o32.lse, o64.lse);
    testing::expect_within_rule("dq", dq, o32.dq, o64.dq);
    testing::expect_within_rule("dk", dk, o32.dk, o64.dk);
    if (!c.v_from_k) testing::expect_within_rule("dv", dv, o32.dv, o64.dv);
    if (c.sink) testing::expect_within_rule("dsink", dsink, o32.dsink, o64.dsink);
  }
}

TEST(RowSlices, SparseAttentionMatchesTheOracle) {
  const int64_t b = 2, s = 120, H = 4, Dqk = 40, Dv = 32, K = 16, W = 3, R = 3;
  auto q = randn(b * s * H * Dqk, 11), kv = randn(b * s * Dqk, 12), dout = randn(b * s * H * Dv, 13), sink = randn(H, 14);
  // A causal table from a real selection over two documents per row (window included).
  DocLayout layout = layout_from_cu_seqlens(s, {{0, 70, 115}, {0, 1, 120}});
  IndexerScores sc{Tensor::from_vector<float>({b, s, 2, 8}, randn(b * s * 16, 15)),
                   Tensor::from_vector<float>({b, s, 8}, randn(b * s * 8, 16)),
                   Tensor::from_vector<float>({b, s, 2}, randn(b * s * 2, 17)), &layout};
  auto idx = indexer_topk(sc, K, W).to_vector<int32_t>();
  const float scale = 0.15f;
  std::vector<float> out(b * s * H * Dv), lse(b * H * s), lse_c(b * H * s), dq(q.size()), dkv(kv.size(), 0.f),
      dsink(H, 0.f);
  for (Slice sl : slices(s, R)) {
    AttnSparseInputs in{Tensor::from_vector<float>({b, sl.n, H, Dqk}, rows_of(q, b, s, H * Dqk, sl.r0, sl.n)),
                        Tensor::from_vector<float>({b, s, Dqk}, kv), Dv,
                        Tensor::from_vector<int32_t>({b, sl.n, K + W}, rows_of(idx, b, s, K + W, sl.r0, sl.n)), K,
                        Tensor::from_vector<float>({H}, sink), scale};
    AttnSparseSaved sv = attn_sparse_fwd(in);
    AttnSparseGrads g =
        attn_sparse_bwd(in, sv, Tensor::from_vector<float>({b, sl.n, H, Dv}, rows_of(dout, b, s, H * Dv, sl.r0, sl.n)));
    put_rows(out, sv.out.to_vector<float>(), b, s, H * Dv, sl.r0, sl.n);
    put_rows(lse, sv.lse.to_vector<float>(), b * H, s, 1, sl.r0, sl.n);
    put_rows(lse_c, sv.lse_c.to_vector<float>(), b * H, s, 1, sl.r0, sl.n);
    put_rows(dq, g.dq.to_vector<float>(), b, s, H * Dqk, sl.r0, sl.n);
    add(dkv, g.dkv.to_vector<float>());
    add(dsink, g.dsink.to_vector<float>());
  }
  ref::SparseDims d{b, s, H, Dqk, Dv, K + W, K};
  auto o64 = ref::attn_sparse_ref<double>(d, to_f64(q), to_f64(kv), idx, to_f64(sink), double(scale), to_f64(dout));
  auto o32 = ref::attn_sparse_ref<float>(d, q, kv, idx, sink, scale, dout);
  testing::expect_within_rule("out", out, o32.out, o64.out);
  testing::expect_within_rule("lse", lse, o32.lse, o64.lse);
  testing::expect_within_rule("lse_c", lse_c, o32.lse_c, o64.lse_c);
  testing::expect_within_rule("dq", dq, o32.dq, o64.dq);
  testing::expect_within_rule("dkv", dkv, o32.dkv, o64.dkv);
  testing::expect_within_rule("dsink", dsink, o32.dsink, o64.dsink);
}

// Selection: each slice's table is the full table's rows, entry for entry (the scores of a row
// do not depend on which rows share its tile). KL: summed and concatenated slices by the rule.
TEST(RowSlices, IndexerSelectionAndKlMatchTheFullProblem) {
  const int64_t b = 2, s = 150, HI = 4, DI = 16, H = 4, Hkv = 2, Dqk = 12, K = 20, W = 4, R = 3;
  DocLayout layout = layout_from_cu_seqlens(s, {{0, 40, 41, 42, 130}, {0, 150}});
  auto qI = randn(b * s * HI * DI, 21, 0.5f), kI = randn(b * s * DI, 22, 0.5f), w = randn(b * s * HI, 23),
       q = randn(b * s * H * Dqk, 24), k = randn(b * s * Hkv * Dqk, 25);
  std::vector<float> rw(b * s);
  for (int64_t r = 0; r < b; ++r)
    for (int64_t t = 0; t < s; ++t) rw[r * s + t] = layout.is_padding(r, t) || t == 7 ? 0.f : 1.f / 250.f;
  IndexerScores full{Tensor::from_vector<float>({b, s, HI, DI}, qI), Tensor::from_vector<float>({b, s, DI}, kI),
                     Tensor::from_vector<float>({b, s, HI}, w), &layout};
  const std::vector<int32_t> table = indexer_topk(full, K, W).to_vector<int32_t>();
  const float scale = 0.3f, coeff = 0.5f;
  for (bool sparse : {false, true}) {
    std::vector<float> dqI(qI.size()), dw(w.size()), dkI(kI.size(), 0.f);
    double kl_sum = 0;
    for (Slice sl : slices(s, R)) {
      IndexerKlInputs in;
      in.sc = {Tensor::from_vector<float>({b, sl.n, HI, DI}, rows_of(qI, b, s, HI * DI, sl.r0, sl.n)), full.kI,
               Tensor::from_vector<float>({b, sl.n, HI}, rows_of(w, b, s, HI, sl.r0, sl.n)), &layout, sl.r0};
      const Tensor part = indexer_topk(in.sc, K, W);
      EXPECT_EQ(part.to_vector<int32_t>(), rows_of(table, b, s, K + W, sl.r0, sl.n)) << "slice at " << sl.r0;
      in.q = Tensor::from_vector<float>({b, sl.n, H, Dqk}, rows_of(q, b, s, H * Dqk, sl.r0, sl.n));
      in.k = Tensor::from_vector<float>({b, s, Hkv, Dqk}, k);
      in.scale = scale;
      in.coeff = coeff;
      in.row_weight = Tensor::from_vector<float>({b, sl.n}, rows_of(rw, b, s, 1, sl.r0, sl.n));
      if (sparse) {
        in.topk = part;
        in.K = K;
      }
      IndexerKlResult r = sparse ? indexer_kl_sparse(in) : indexer_kl_dense(in);
      put_rows(dqI, r.dqI.to_vector<float>(), b, s, HI * DI, sl.r0, sl.n);
      put_rows(dw, r.dw.to_vector<float>(), b, s, HI, sl.r0, sl.n);
      add(dkI, r.dkI.to_vector<float>());
      kl_sum += r.kl_sum;
    }
    ref::KlAttn att{H, Hkv, Dqk, scale};
    const std::vector<int32_t> topk = sparse ? table : std::vector<int32_t>{};
    const ref::IndexerDims d{b, s, HI, DI};
    auto ds = layout.doc_start.to_vector<int32_t>();
    auto o64 = ref::indexer_kl_ref<double>(d, att, to_f64(q), to_f64(k), to_f64(qI), to_f64(kI), to_f64(w), ds,
                                           to_f64(rw), double(coeff), topk, sparse ? K : 0);
    auto o32 = ref::indexer_kl_ref<float>(d, att, q, k, qI, kI, w, ds, rw, coeff, topk, sparse ? K : 0);
    testing::expect_within_rule("dqI", dqI, o32.dqI, o64.dqI);
    testing::expect_within_rule("dkI", dkI, o32.dkI, o64.dkI);
    testing::expect_within_rule("dw", dw, o32.dw, o64.dw);
    testing::expect_within_rule("kl_sum", {float(kl_sum)}, {float(o32.kl_sum)}, {o64.kl_sum});
    EXPECT_GT(o64.kl_sum, 0.0);
  }
}

TEST(RowSlices, QueryRowsOutsideTheKeysAreAClearError) {
  DocLayout layout = layout_causal(1, 10);
  AttnDenseInputs in;
  in.q = Tensor::zeros({1, 4, 1, 8}, DType::f32);
  in.k = Tensor::zeros({1, 10, 1, 8}, DType::f32);
  in.v = in.k;
  in.layout = &layout;
  in.scale = 1.f;
  in.q_row0 = 7;  // rows [7, 11) of 10
  EXPECT_THROW(attn_dense_fwd(in), ShapeError);
  in.q_row0 = 6;
  EXPECT_NO_THROW(attn_dense_fwd(in));
}

}  // namespace
}  // namespace hmla
