// Sparse latent MQA attention against the float64 oracle (STYLE.md rule), finite differences of
// the oracle, empty rows, the table contract, determinism, and agreement with dense MQA when the
// table lists every allowed key.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>

#include "attn_sparse_ref.h"
#include "case_support.h"
#include "hmla/ops/attention.h"
#include "hmla/ops/index_table.h"
#include "hmla/ops/sparse_attention.h"
#include "testing.h"

namespace hmla {
namespace {

using testing::randn;
using testing::to_f64;

using SparseCase = op_cases::AttnSparseCase;

class AttnSparseCases : public ::testing::TestWithParam<SparseCase> {};

TEST_P(AttnSparseCases, MatchesFloat64OracleByTheRule) {
  const SparseCase& c = GetParam();
  auto q = randn(c.b * c.s * c.H * c.Dqk, 1), kv = randn(c.b * c.s * c.Dqk, 2), dout = randn(c.b * c.s * c.H * c.Dv, 3);
  auto sink = c.sink ? randn(c.H, 4) : std::vector<float>{};
  auto idx = op_cases::sparse_table(c, 5);
  const float scale = 0.15f;
  AttnSparseInputs in{Tensor::from_vector<float>({c.b, c.s, c.H, c.Dqk}, q), Tensor::from_vector<float>({c.b, c.s, c.Dqk}, kv),
                      c.Dv, Tensor::from_vector<int32_t>({c.b, c.s, c.K + c.W}, idx), c.K,
                      c.sink ? Tensor::from_vector<float>({c.H}, sink) : Tensor(), scale};
  AttnSparseSaved sv = attn_sparse_fwd(in);
  AttnSparseGrads g = attn_sparse_bwd(in, sv, Tensor::from_vector<float>({c.b, c.s, c.H, c.Dv}, dout));
  ref::SparseDims d{c.b, c.s, c.H, c.Dqk, c.Dv, c.K + c.W, c.K};
  auto o64 = ref::attn_sparse_ref<double>(d, to_f64(q), to_f64(kv), idx, to_f64(sink), double(scale), to_f64(dout));
  auto o32 = ref::attn_sparse_ref<float>(d, q, kv, idx, sink, scale, dout);
  testing::expect_within_rule("out", sv.out.to_vector<float>(), o32.out, o64.out);
  testing::expect_within_rule("lse", sv.lse.to_vector<float>(), o32.lse, o64.lse);
  if (c.K > 0) testing::expect_within_rule("lse_c", sv.lse_c.to_vector<float>(), o32.lse_c, o64.lse_c);
  testing::expect_within_rule("dq", g.dq.to_vector<float>(), o32.dq, o64.dq);
  testing::expect_within_rule("dkv", g.dkv.to_vector<float>(), o32.dkv, o64.dkv);
  if (c.sink) testing::expect_within_rule("dsink", g.dsink.to_vector<float>(), o32.dsink, o64.dsink);
  if (c.empty_rows) {  // rows without keys: exactly 0, lse = +inf, zero dq
    auto out = sv.out.to_vector<float>(), dq = g.dq.to_vector<float>(), lse = sv.lse.to_vector<float>();
    for (int64_t t = 3; t < c.s; t += 7) {
      for (int64_t i = 0; i < c.H * c.Dv; ++i) EXPECT_EQ(out[t * c.H * c.Dv + i], 0.f);
      for (int64_t i = 0; i < c.H * c.Dqk; ++i) EXPECT_EQ(dq[t * c.H * c.Dqk + i], 0.f);
      EXPECT_EQ(lse[t], INFINITY);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Table, AttnSparseCases,
                         ::testing::ValuesIn(op_cases::run_by(&cpu_backend(), DType::f32, op_cases::attn_sparse())),
                         op_cases::RowName());

// The CPU runs every row of the table: its supports() drops none of them from the suite above.
TEST(AttnSparseCases, TheCpuRunsEveryRow) {
  EXPECT_EQ(op_cases::rows_not_run(cpu_backend(), DType::f32, op_cases::attn_sparse()), "");
}

TEST(AttnSparseOracle, GradientsMatchFiniteDifferences) {
  ref::SparseDims d{1, 6, 2, 5, 3, 4, 3};
  auto q = to_f64(randn(6 * 2 * 5, 11)), kv = to_f64(randn(6 * 5, 12)), sink = to_f64(randn(2, 13));
  auto dout = to_f64(randn(6 * 2 * 3, 14));
  std::vector<int32_t> idx = op_cases::sparse_table({"fd", op_cases::Oracle::attn_sparse_ref, 1, 6, 2, 5, 3, 3, 1}, 15);
  auto base = ref::attn_sparse_ref<double>(d, q, kv, idx, sink, 0.6, dout);
  auto loss = [&] {
    auto r = ref::attn_sparse_ref<double>(d, q, kv, idx, sink, 0.6, {});
    double L = 0;
    for (size_t i = 0; i < r.out.size(); ++i) L += r.out[i] * dout[i];
    return L;
  };
  testing::expect_fd_gradient(q, base.dq, loss, "dq");
  testing::expect_fd_gradient(kv, base.dkv, loss, "dkv");
  testing::expect_fd_gradient(sink, base.dsink, loss, "dsink");
}

TEST(AttnSparse, TableContractAndDeterminism) {
  auto q = randn(1 * 8 * 2 * 8, 1), kv = randn(8 * 8, 2);
  std::vector<int32_t> idx(8 * 3, -1);
  idx[5 * 3] = 2;
  idx[5 * 3 + 1] = 4;
  AttnSparseInputs in{Tensor::from_vector<float>({1, 8, 2, 8}, q), Tensor::from_vector<float>({1, 8, 8}, kv), 4,
                      Tensor::from_vector<int32_t>({1, 8, 3}, idx), 2, {}, 0.3f};
  EXPECT_NO_THROW(attn_sparse_fwd(in));
  idx[5 * 3 + 2] = 2;  // duplicate
  in.idx = Tensor::from_vector<int32_t>({1, 8, 3}, idx);
  EXPECT_THROW(attn_sparse_fwd(in), ShapeError);
  idx[5 * 3 + 2] = 8;  // out of range
  in.idx = Tensor::from_vector<int32_t>({1, 8, 3}, idx);
  EXPECT_THROW(attn_sparse_fwd(in), ShapeError);
  idx[5 * 3 + 2] = -2;
  in.idx = Tensor::from_vector<int32_t>({1, 8, 3}, idx);
  EXPECT_THROW(attn_sparse_fwd(in), ShapeError);

  // Same inputs, same bits, run to run.
  auto big = op_cases::sparse_table({"det", op_cases::Oracle::attn_sparse_ref, 2, 80, 4, 24, 16, 12, 3, false, true}, 9);
  AttnSparseInputs r{Tensor::from_vector<float>({2, 80, 4, 24}, randn(2 * 80 * 4 * 24, 3)),
                     Tensor::from_vector<float>({2, 80, 24}, randn(2 * 80 * 24, 4)), 16,
                     Tensor::from_vector<int32_t>({2, 80, 15}, big), 12, {}, 0.2f};
  Tensor dout = Tensor::from_vector<float>({2, 80, 4, 16}, randn(2 * 80 * 4 * 16, 5));
  AttnSparseSaved s1 = attn_sparse_fwd(r), s2 = attn_sparse_fwd(r);
  AttnSparseGrads g1 = attn_sparse_bwd(r, s1, dout), g2 = attn_sparse_bwd(r, s2, dout);
  EXPECT_EQ(0, std::memcmp(s1.out.raw_data(), s2.out.raw_data(), s1.out.nbytes()));
  EXPECT_EQ(0, std::memcmp(g1.dkv.raw_data(), g2.dkv.raw_data(), g1.dkv.nbytes()));
  EXPECT_EQ(0, std::memcmp(g1.dq.raw_data(), g2.dq.raw_data(), g1.dq.nbytes()));
}

// DESIGN.md section 4's one contract (check_index_table): -1 is no key; -5, a later position, a key
// >= s or one of another document is an error, or with skip no key; a duplicate is an error in
// both modes; a valid table comes back as it is (no copy).
TEST(IndexTable, OneContractInBothModes) {
  const DocLayout docs = layout_from_cu_seqlens(8, {{0, 4, 8}});
  std::vector<int32_t> ok(8 * 2, -1);
  for (int t = 0; t < 8; ++t) ok[size_t(t * 2)] = t;
  const Tensor good = Tensor::from_vector<int32_t>({1, 8, 2}, ok);
  EXPECT_TRUE(check_index_table(good, docs, 0, InvalidIndex::error, "t").same_data(good));
  // Row 5 of the document [4, 8) allows exactly [4, 5]: negative, one past the row (the next row's
  // key), later, past s, the previous document's last key (one before doc_start), another document.
  for (int32_t bad : {-5, 6, 7, 8, 3, 1}) {
    std::vector<int32_t> v = ok;
    v[5 * 2 + 1] = bad;
    const Tensor t = Tensor::from_vector<int32_t>({1, 8, 2}, v);
    EXPECT_THROW(check_index_table(t, docs, 0, InvalidIndex::error, "t"), ShapeError) << bad;
    EXPECT_EQ(check_index_table(t, docs, 0, InvalidIndex::skip, "t").to_vector<int32_t>(), ok) << bad;
  }
  std::vector<int32_t> dup = ok;
  dup[5 * 2 + 1] = 5;
  for (InvalidIndex m : {InvalidIndex::error, InvalidIndex::skip})
    EXPECT_THROW(check_index_table(Tensor::from_vector<int32_t>({1, 8, 2}, dup), docs, 0, m, "t"), ShapeError);
  // A row slice (context parallelism): rows 4..7 at global positions; key 6 is later than row 4.
  std::vector<int32_t> slice = {6, -1, 4, -1, 4, 6, 7, -1};
  const Tensor sl = Tensor::from_vector<int32_t>({1, 4, 2}, slice);
  EXPECT_THROW(check_index_table(sl, docs, 4, InvalidIndex::error, "t"), ShapeError);
  EXPECT_EQ(check_index_table(sl, docs, 4, InvalidIndex::skip, "t").to_vector<int32_t>(),
            (std::vector<int32_t>{-1, -1, 4, -1, 4, 6, 7, -1}));
}

// The message an entry gives for row 5 of a table, or "" when it runs.
template <class F>
std::string refusal(F&& entry) {
  try {
    entry();
  } catch (const ShapeError& e) {
    return e.what();
  }
  return "";
}

// An external table is checked at both entries of the sparse attention, forward and backward,
// and refused with the row named; an own table (index_table.h) is not checked, unless the debug
// option is on, which gives the external table's refusal.
TEST(IndexTable, ExternalTablesAreCheckedAtEveryEntryOwnOnesUnderTheDebugOption) {
  const int64_t s = 8, H = 2, D = 8;
  std::vector<int32_t> ok(s * 2, -1);
  for (int t = 0; t < s; ++t) ok[size_t(t * 2)] = t, ok[size_t(t * 2 + 1)] = t > 0 ? t - 1 : -1;
  AttnSparseInputs in{Tensor::from_vector<float>({1, s, H, D}, randn(s * H * D, 5)),
                      Tensor::from_vector<float>({1, s, D}, randn(s * D, 6)), 4,
                      Tensor::from_vector<int32_t>({1, s, 2}, ok), 2, {}, 0.3f};
  const AttnSparseSaved sv = attn_sparse_fwd(in);
  const Tensor dout = Tensor::from_vector<float>({1, s, H, 4}, randn(s * H * 4, 7));
  for (int32_t bad : {5, 8, -2}) {  // a duplicate, a key past s, a negative key other than -1
    std::vector<int32_t> v = ok;
    v[5 * 2 + 1] = bad;
    in.idx = Tensor::from_vector<int32_t>({1, s, 2}, v);
    in.idx_origin = TableOrigin::external;
    const std::string fwd = refusal([&] { attn_sparse_fwd(in); }), bwd = refusal([&] { attn_sparse_bwd(in, sv, dout); });
    EXPECT_NE(fwd.find("sparse attention: "), std::string::npos) << bad;
    EXPECT_NE(fwd.find(bad == 5 ? "row 5 of batch 0 lists key 5 twice" : "idx[0, 5, 1]"), std::string::npos) << fwd;
    EXPECT_EQ(bwd, fwd);
    if (bad != 5) continue;  // an own table out of range would read out of bounds: only the duplicate
    in.idx_origin = TableOrigin::own;
    EXPECT_EQ(refusal([&] { attn_sparse_fwd(in); }), "");
    EXPECT_EQ(refusal([&] { attn_sparse_bwd(in, sv, dout); }), "");
    const bool was = set_check_all_tables(true);
    EXPECT_EQ(refusal([&] { attn_sparse_fwd(in); }), fwd);
    EXPECT_EQ(refusal([&] { attn_sparse_bwd(in, sv, dout); }), fwd);
    set_check_all_tables(was);
  }
}

// HMLA_CHECK_TABLES=1 in the environment turns the debug option on (registered a second time by
// tests/CMakeLists.txt with the variable set; skipped without it).
TEST(IndexTable, TheDebugOptionFromTheEnvironment) {
  const char* v = std::getenv("HMLA_CHECK_TABLES");
  if (!v || v[0] != '1') GTEST_SKIP() << "HMLA_CHECK_TABLES is not 1";
  EXPECT_TRUE(table_checked(TableOrigin::own));
  EXPECT_TRUE(table_checked(TableOrigin::external));
}

// A stride no kernel takes is refused at the entry point, never handed to BLAS: a stride-0
// (expanded) head of q, a row stride below the width.
TEST(AttnSparse, RefusesStridesNoKernelTakes) {
  auto kv = randn(8 * 8, 2);
  std::vector<int32_t> idx(8 * 2, -1);
  for (int t = 0; t < 8; ++t) idx[size_t(t * 2)] = t;
  const Tensor q0 = Tensor::from_vector<float>({1, 8, 1, 8}, randn(8 * 8, 1));
  const Tensor expanded = Tensor::wrap(q0.raw_data(), {1, 8, 2, 8}, {64, 8, 0, 1}, DType::f32, Device::cpu,
                                       std::make_shared<Tensor>(q0));
  AttnSparseInputs in{expanded, Tensor::from_vector<float>({1, 8, 8}, kv), 4, Tensor::from_vector<int32_t>({1, 8, 2}, idx),
                      2, {}, 0.3f};
  EXPECT_FALSE(kernel_strides_ok(expanded));
  EXPECT_THROW(attn_sparse_fwd(in), ShapeError);
  const Tensor ones = Tensor::wrap(q0.raw_data(), {1, 8, 1, 8}, {int64_t(1) << 40, 8, int64_t(1) << 33, 1},
                                   DType::f32, Device::cpu, std::make_shared<Tensor>(q0));
  EXPECT_TRUE(kernel_strides_ok(ones));  // one-element dimensions take any stride
  EXPECT_EQ(kernel_strides(ones), (Shape{64, 8, 8, 1}));
  in.q = ones;
  EXPECT_NO_THROW(attn_sparse_fwd(in));
}

// The sink's gradient is a parameter's: both attention backwards ADD it into a given tensor (the
// one gradient convention of hmla/ops/nn.h), to the bits of the sum added once.
TEST(AttnSparse, BothBackwardsAddTheSinksGradient) {
  const int64_t s = 8, H = 2, D = 8;
  std::vector<int32_t> idx(s * 2, -1);
  for (int t = 0; t < s; ++t) idx[size_t(t * 2)] = t, idx[size_t(t * 2 + 1)] = t > 0 ? t - 1 : -1;
  const Tensor sink = Tensor::from_vector<float>({H}, {0.3f, -0.4f}), dout = Tensor::from_vector<float>({1, s, H, 4}, randn(s * H * 4, 7));
  const std::vector<float> init = {1.25f, -3.5f};
  AttnSparseInputs sp{Tensor::from_vector<float>({1, s, H, D}, randn(s * H * D, 5)), Tensor::from_vector<float>({1, s, D}, randn(s * D, 6)),
                      4, Tensor::from_vector<int32_t>({1, s, 2}, idx), 2, sink, 0.3f};
  const AttnSparseSaved ss = attn_sparse_fwd(sp);
  const std::vector<float> fresh = attn_sparse_bwd(sp, ss, dout).dsink.to_vector<float>();
  Tensor acc = Tensor::from_vector<float>({H}, init);
  attn_sparse_bwd(sp, ss, dout, acc);
  const DocLayout layout = layout_causal(1, s);
  AttnDenseInputs de;
  de.q = sp.q, de.k = sp.kv.view({1, s, 1, D}), de.v = de.k.slice(3, 0, 4), de.layout = &layout, de.sink = sink, de.scale = 0.3f;
  const AttnDenseSaved ds = attn_dense_fwd(de);
  const std::vector<float> dfresh = attn_dense_bwd(de, ds, dout).dsink.to_vector<float>();
  Tensor dacc = Tensor::from_vector<float>({H}, init);
  attn_dense_bwd(de, ds, dout, dacc);
  for (int64_t h = 0; h < H; ++h) {
    EXPECT_NE(fresh[size_t(h)], 0.f);
    EXPECT_EQ(acc.to_vector<float>()[size_t(h)], init[size_t(h)] + fresh[size_t(h)]) << "sparse, head " << h;
    EXPECT_EQ(dacc.to_vector<float>()[size_t(h)], init[size_t(h)] + dfresh[size_t(h)]) << "dense, head " << h;
  }
}

// A table listing all of A(t) makes sparse attention the dense MQA core (up to reassociation).
TEST(AttnSparse, FullTableEqualsDenseMqa) {
  const int64_t s = 50, H = 3, Dqk = 20, Dv = 12;
  DocLayout layout = layout_from_cu_seqlens(s, {{0, 17, 18, 44}});
  auto ds = layout.doc_start.to_vector<int32_t>();
  std::vector<int32_t> idx(s * s, -1);
  for (int64_t t = 0; t < s; ++t)
    for (int64_t j = ds[t], n = 0; j <= t; ++j) idx[t * s + n++] = int32_t(t - (j - ds[t]));  // any order
  Tensor q = Tensor::from_vector<float>({1, s, H, Dqk}, randn(s * H * Dqk, 1));
  Tensor kv = Tensor::from_vector<float>({1, s, Dqk}, randn(s * Dqk, 2));
  Tensor sink = Tensor::from_vector<float>({H}, randn(H, 3));
  Tensor dout = Tensor::from_vector<float>({1, s, H, Dv}, randn(s * H * Dv, 4));
  AttnSparseInputs sp{q, kv, Dv, Tensor::from_vector<int32_t>({1, s, s}, idx), 0, sink, 0.25f};
  AttnSparseSaved a = attn_sparse_fwd(sp);
  AttnSparseGrads ga = attn_sparse_bwd(sp, a, dout);
  Tensor k4 = kv.view({1, s, 1, Dqk});
  AttnDenseInputs de{q, k4, k4.slice(3, 0, Dv), &layout, sink, 0.25f};
  AttnDenseSaved b = attn_dense_fwd(de);
  AttnDenseGrads gb = attn_dense_bwd(de, b, dout);
  auto close = [](const Tensor& x, const Tensor& y, double tol) {
    auto u = x.to_vector<float>(), v = y.to_vector<float>();
    double m = 0, e = 0;
    for (size_t i = 0; i < u.size(); ++i) {
      if (std::isinf(v[i])) {
        EXPECT_EQ(u[i], v[i]);
        continue;
      }
      e = std::max(e, std::abs(double(u[i]) - v[i]));
      m = std::max(m, std::abs(double(v[i])));
    }
    EXPECT_LE(e, tol * m);
  };
  // Both sum the same terms in other orders: reductions of at most max(Dqk, s) = 50 terms move by
  // at most 50 * eps (6e-6) of their magnitudes, which for these O(1) inputs are within 1.5x of
  // each tensor's largest entry: 1e-5.
  close(a.out, b.out, 1e-5);
  close(a.lse, b.lse, 1e-5);
  close(ga.dq, gb.dq, 1e-5);
  auto dk = gb.dk.to_vector<float>(), dv = gb.dv.to_vector<float>();
  for (int64_t t = 0; t < s; ++t)
    for (int64_t c = 0; c < Dv; ++c) dk[t * Dqk + c] += dv[t * Dv + c];
  close(ga.dkv, Tensor::from_vector<float>({1, s, Dqk}, dk), 1e-5);
  close(ga.dsink, gb.dsink, 1e-5);
}

}  // namespace
}  // namespace hmla
