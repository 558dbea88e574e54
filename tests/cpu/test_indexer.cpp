// Indexer ops on the CPU: scores through top-k against brute-force selection (exact ties, short
// rows, windows, padding), dense and sparse KL against the float64 oracle by the STYLE.md rule,
// finite differences of the oracle, and cross-document isolation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>

#include "attn_dense_ref.h"
#include "case_support.h"
#include "hmla/core/cuda.h"
#include "hmla/ops/attention.h"
#include "hmla/ops/backend.h"
#include "hmla/ops/index_table.h"
#include "hmla/ops/indexer.h"
#include "indexer_ref.h"
#include "testing.h"

namespace hmla {
namespace {

using testing::randn;
using testing::to_f64;

struct Problem {
  int64_t b, s, HI, DI, H, Hkv, Dqk;
  DocLayout layout;
  std::vector<float> qI, kI, w, q, k, rw;
  IndexerScores scores() const {
    return {Tensor::from_vector<float>({b, s, HI, DI}, qI), Tensor::from_vector<float>({b, s, DI}, kI),
            Tensor::from_vector<float>({b, s, HI}, w), &layout};
  }
  ref::IndexerDims dims() const { return {b, s, HI, DI}; }
  std::vector<int32_t> ds() const { return layout.doc_start.to_vector<int32_t>(); }
};

Problem make(int64_t b, int64_t s, int64_t HI, int64_t DI, int64_t H, int64_t Hkv, int64_t Dqk, DocLayout layout,
             uint64_t seed) {
  Problem p{b, s, HI, DI, H, Hkv, Dqk, std::move(layout), {}, {}, {}, {}, {}, {}};
  p.qI = randn(b * s * HI * DI, seed, 0.5f);
  p.kI = randn(b * s * DI, seed + 1, 0.5f);
  p.w = randn(b * s * HI, seed + 2);
  p.q = randn(b * s * H * Dqk, seed + 3);
  p.k = randn(b * s * Hkv * Dqk, seed + 4);
  p.rw.assign(b * s, 0.f);
  const int64_t valid = std::max<int64_t>(p.layout.valid_rows(), 1);
  for (int64_t r = 0; r < b; ++r)
    for (int64_t t = 0; t < s; ++t)
      p.rw[r * s + t] = p.layout.is_padding(r, t) ? 0.f : 1.f / float(valid);
  return p;
}

DocLayout docs_layout() { return layout_from_cu_seqlens(150, {{0, 40, 41, 42, 130}, {0, 150}}); }

// ---- top-k ---------------------------------------------------------------------------------

std::vector<int32_t> kernel_topk(const Problem& p, int64_t K, int64_t W) {
  return indexer_topk(p.scores(), K, W).to_vector<int32_t>();
}

TEST(IndexerTopk, ExactTiesGoToTheSmallerKey) {
  // qI . kI < 0 everywhere: every relu is 0, so I = 0 exactly and the tie rule alone decides.
  Problem p = make(2, 150, 4, 8, 1, 1, 4, docs_layout(), 1);
  for (auto& x : p.qI) x = -std::abs(x) - 0.1f;
  for (auto& x : p.kI) x = std::abs(x) + 0.1f;
  for (int64_t W : {0, 3}) {
    std::vector<double> zeros = ref::indexer_scores_ref<double>(p.dims(), to_f64(p.qI), to_f64(p.kI), to_f64(p.w), p.ds());
    for (double v : zeros) ASSERT_TRUE(v == 0.0 || std::isinf(v));
    EXPECT_EQ(kernel_topk(p, 16, W), ref::indexer_topk_ref(p.dims(), zeros, p.ds(), 16, W)) << "W = " << W;
  }
}

TEST(IndexerTopk, MatchesBruteForceWhereGapsExceedRounding) {
  Problem p = make(2, 150, 4, 16, 1, 1, 4, docs_layout(), 2);
  const auto I = ref::indexer_scores_ref<double>(p.dims(), to_f64(p.qI), to_f64(p.kI), to_f64(p.w), p.ds());
  for (int64_t K : {1, 8, 60, 200})
    for (int64_t W : {0, 5}) {
      auto got = kernel_topk(p, K, W), want = ref::indexer_topk_ref(p.dims(), I, p.ds(), K, W);
      int compared = 0;
      for (int64_t row = 0; row < p.b * p.s; ++row) {
        const int32_t* g = &got[row * (K + W)];
        const int32_t* e = &want[row * (K + W)];
        // The window part and the -1 padding are exact.
        EXPECT_TRUE(std::equal(g + K, g + K + W, e + K)) << "row " << row;
        const int64_t n = std::count_if(e, e + K, [](int32_t x) { return x >= 0; });
        ASSERT_EQ(std::count_if(g, g + K, [](int32_t x) { return x >= 0; }), n) << "row " << row;
        if (n == 0) continue;
        // Sets agree where the K-th and (K+1)-th scores are apart by more than f32 rounding.
        const double* Ir = &I[row * p.s];
        std::vector<double> sorted;
        for (int64_t j = 0; j < p.s; ++j)
          if (!std::isinf(Ir[j])) sorted.push_back(Ir[j]);
        const int64_t t = row % p.s, r_len = int64_t(sorted.size()) - std::min<int64_t>(W, sorted.size());
        if (n < r_len) {
          std::vector<double> r_scores;
          for (int64_t j = t - int64_t(sorted.size()) + 1; j <= t - W; ++j) r_scores.push_back(Ir[j]);
          std::sort(r_scores.rbegin(), r_scores.rend());
          if (r_scores[n - 1] - r_scores[n] < 1e-4) continue;
        }
        std::vector<int32_t> a(g, g + n), b(e, e + n);
        for (int64_t i = 1; i < n; ++i) EXPECT_GE(Ir[a[i - 1]] + 1e-5, Ir[a[i]]) << "row " << row << ": not descending";
        std::sort(a.begin(), a.end());
        std::sort(b.begin(), b.end());
        EXPECT_EQ(a, b) << "row " << row << " K " << K << " W " << W;
        ++compared;
      }
      EXPECT_GT(compared, p.b * p.s / 2);
    }
}

TEST(IndexerTopk, ShortRowsWindowsAndPadding) {
  DocLayout l = layout_from_cu_seqlens(12, {{0, 5, 6, 10}});  // rows 10, 11 padding
  Problem p = make(1, 12, 2, 8, 1, 1, 4, std::move(l), 3);
  auto got = kernel_topk(p, 4, 2);
  auto row = [&](int t) { return std::vector<int32_t>(got.begin() + t * 6, got.begin() + t * 6 + 6); };
  EXPECT_EQ(row(0), (std::vector<int32_t>{-1, -1, -1, -1, 0, -1}));  // |R| = 0: only the window
  EXPECT_EQ(row(5), (std::vector<int32_t>{-1, -1, -1, -1, 5, -1}));  // 1-token document
  EXPECT_EQ(row(10), std::vector<int32_t>(6, -1));                   // padding
  auto r3 = row(3);  // R = {0, 1}: both kept, then window {2, 3}
  EXPECT_EQ(std::vector<int32_t>(r3.begin() + 4, r3.end()), (std::vector<int32_t>{2, 3}));
  std::vector<int32_t> kept(r3.begin(), r3.begin() + 2);
  std::sort(kept.begin(), kept.end());
  EXPECT_EQ(kept, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(r3[2], -1);
  EXPECT_THROW(indexer_topk(p.scores(), 0, 0), ShapeError);
}

// Selection from given scores: the reference's rule exactly, with exact ties (a few score values
// only), -0.0 next to +0.0, windows, padding and a query-row slice.
TEST(IndexerSelect, GivenScoresMatchTheReferenceExactly) {
  const int64_t b = 2, s = 150;
  DocLayout layout = docs_layout();
  std::mt19937_64 rng(5);
  std::vector<float> I(b * s * s);
  for (float& x : I) {
    const int v = int(rng() % 7) - 3;  // values in {-3..3} / 4: ties everywhere
    x = v == 0 ? ((rng() & 1) ? 0.f : -0.f) : float(v) / 4.f;
  }
  std::vector<double> Id(I.begin(), I.end());
  const ref::IndexerDims d{b, s, 1, 1};
  for (int64_t K : {1, 5, 40, 200})
    for (int64_t W : {0, 3}) {
      const auto want = ref::indexer_topk_ref(d, Id, layout.doc_start.to_vector<int32_t>(), K, W);
      EXPECT_EQ(indexer_select(Tensor::from_vector<float>({b, s, s}, I), layout, 0, K, W).to_vector<int32_t>(), want)
          << "K " << K << " W " << W;
      // Rows [60, 150) only: the same rows of the table.
      std::vector<float> part;
      for (int64_t r = 0; r < b; ++r) part.insert(part.end(), I.begin() + (r * s + 60) * s, I.begin() + (r + 1) * s * s);
      std::vector<int32_t> want_part;
      for (int64_t r = 0; r < b; ++r)
        want_part.insert(want_part.end(), want.begin() + (r * s + 60) * (K + W), want.begin() + (r + 1) * s * (K + W));
      EXPECT_EQ(indexer_select(Tensor::from_vector<float>({b, s - 60, s}, part), layout, 60, K, W).to_vector<int32_t>(),
                want_part);
    }
}

// ---- KL --------------------------------------------------------------------------------------

using op_cases::IndexerKlCase;

class IndexerKl : public ::testing::TestWithParam<IndexerKlCase> {};

// The case on `dev`: the inputs (and the selection table, the attention's lse) made on the CPU,
// then moved, so both backends see the same problem. The KL kernels are f32 on both: the f32 rule.
void run_kl_case(const IndexerKlCase& c, Device dev) {
  ASSERT_TRUE(c.b == 2 && c.s == 150) << c.name << ": docs_layout() covers b = 2, s = 150";
  Problem p = make(c.b, c.s, c.HI, c.DI, c.H, c.Hkv, c.Dqk, docs_layout(), 11);
  const float scale = 0.3f, coeff = 0.5f;
  IndexerKlInputs in;
  in.sc = p.scores();
  in.q = Tensor::from_vector<float>({p.b, p.s, p.H, p.Dqk}, p.q);
  in.k = Tensor::from_vector<float>({p.b, p.s, p.Hkv, p.Dqk}, p.k);
  in.scale = scale;
  in.coeff = coeff;
  p.rw[7] = 0.f;  // a masked row (pad token) inside a document
  in.row_weight = Tensor::from_vector<float>({p.b, p.s}, p.rw);
  if (c.give_lse) {
    AttnDenseInputs a{in.q, in.k, in.k, &p.layout, {}, scale};
    in.lse_c = attn_dense_fwd(a).lse;
  }
  std::vector<int32_t> topk;
  const int64_t K = c.K;
  if (c.sparse) {
    in.topk = indexer_topk(in.sc, K, c.W);
    in.K = K;
    topk = in.topk.to_vector<int32_t>();
  }
  for (Tensor* t : {&in.sc.qI, &in.sc.kI, &in.sc.w, &in.q, &in.k, &in.row_weight, &in.lse_c, &in.topk})
    if (t->defined()) *t = t->to(dev);
  IndexerKlResult r = c.sparse ? indexer_kl_sparse(in) : indexer_kl_dense(in);
  ASSERT_EQ(r.dqI.device(), dev);
  ref::KlAttn att{p.H, p.Hkv, p.Dqk, scale};
  auto o64 = ref::indexer_kl_ref<double>(p.dims(), att, to_f64(p.q), to_f64(p.k), to_f64(p.qI), to_f64(p.kI),
                                         to_f64(p.w), p.ds(), to_f64(p.rw), double(coeff), topk, K);
  auto o32 = ref::indexer_kl_ref<float>(p.dims(), att, p.q, p.k, p.qI, p.kI, p.w, p.ds(), p.rw, coeff, topk, K);
  testing::expect_within_rule("dqI", r.dqI.to_vector<float>(), o32.dqI, o64.dqI);
  testing::expect_within_rule("dkI", r.dkI.to_vector<float>(), o32.dkI, o64.dkI);
  testing::expect_within_rule("dw", r.dw.to_vector<float>(), o32.dw, o64.dw);
  testing::expect_within_rule("kl_sum", std::vector<float>{float(r.kl_sum)}, std::vector<float>{float(o32.kl_sum)},
                              std::vector<double>{o64.kl_sum});
  EXPECT_NEAR(r.loss, coeff * r.kl_sum, 1e-12);
  EXPECT_GT(o64.kl_sum, 0.0);
}

TEST_P(IndexerKl, MatchesFloat64OracleByTheRule) { run_kl_case(GetParam(), Device::cpu); }
INSTANTIATE_TEST_SUITE_P(Cases, IndexerKl,
                         ::testing::ValuesIn(op_cases::run_by(&cpu_backend(), DType::f32, op_cases::indexer_kl())),
                         op_cases::RowName());

// On CUDA where the build has it and a device (test_cuda_emu builds this file: the emulator); a
// build without CUDA has no rows here.
class IndexerKlOnCuda : public ::testing::TestWithParam<IndexerKlCase> {};
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(IndexerKlOnCuda);
TEST_P(IndexerKlOnCuda, MatchesFloat64OracleByTheRule) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  run_kl_case(GetParam(), Device::cuda);
}
INSTANTIATE_TEST_SUITE_P(Cases, IndexerKlOnCuda,
                         ::testing::ValuesIn(op_cases::run_by(cuda_backend(), DType::f32, op_cases::indexer_kl())),
                         op_cases::RowName());

// The CPU runs every row of the KL table (its supports() drops none of them from the suite above)
// and, on f32 scores, every row of the selection tables the CUDA suites compare it with.
TEST(IndexerKl, TheCpuRunsEveryRow) {
  EXPECT_EQ(op_cases::rows_not_run(cpu_backend(), DType::f32, op_cases::indexer_kl()), "");
  EXPECT_EQ(op_cases::rows_not_run(cpu_backend(), DType::f32, op_cases::indexer_select()), "");
  EXPECT_EQ(op_cases::rows_not_run(cpu_backend(), DType::f32, op_cases::indexer_topk()), "");
}

TEST(IndexerKlOracle, GradientsMatchFiniteDifferences) {
  DocLayout l = layout_from_cu_seqlens(6, {{0, 4, 5}});
  Problem p = make(1, 6, 2, 4, 2, 1, 3, std::move(l), 21);
  ref::KlAttn att{2, 1, 3, 0.8};
  auto qI = to_f64(p.qI), kI = to_f64(p.kI), w = to_f64(p.w), rw = to_f64(p.rw);
  auto loss = [&] {
    return ref::indexer_kl_ref<double>(p.dims(), att, to_f64(p.q), to_f64(p.k), qI, kI, w, p.ds(), rw, 0.7, {}, 0).loss;
  };
  auto base = ref::indexer_kl_ref<double>(p.dims(), att, to_f64(p.q), to_f64(p.k), qI, kI, w, p.ds(), rw, 0.7, {}, 0);
  testing::expect_fd_gradient(qI, base.dqI, loss, "dqI");
  testing::expect_fd_gradient(kI, base.dkI, loss, "dkI");
  testing::expect_fd_gradient(w, base.dw, loss, "dw");
}

// Noise in one document changes nothing in another: selection, gradients and loss, bit for bit.
TEST(IndexerKl, DocumentsAreIsolated) {
  DocLayout l = layout_from_cu_seqlens(100, {{0, 37, 100}});
  Problem a = make(1, 100, 4, 16, 2, 2, 8, layout_from_cu_seqlens(100, {{0, 37, 100}}), 31);
  Problem b = make(1, 100, 4, 16, 2, 2, 8, std::move(l), 31);
  for (int64_t t = 37; t < 100; ++t) {  // perturb the second document; weight only the first
    for (int64_t c = 0; c < b.DI; ++c) b.kI[t * b.DI + c] += 0.3f;
    for (int64_t c = 0; c < b.HI * b.DI; ++c) b.qI[t * b.HI * b.DI + c] -= 0.2f;
    for (int64_t c = 0; c < b.Dqk * b.Hkv; ++c) b.k[t * b.Dqk * b.Hkv + c] *= 1.5f;
    a.rw[t] = b.rw[t] = 0.f;
  }
  auto run = [](const Problem& p, bool sparse) {
    IndexerKlInputs in;
    in.sc = p.scores();
    in.q = Tensor::from_vector<float>({p.b, p.s, p.H, p.Dqk}, p.q);
    in.k = Tensor::from_vector<float>({p.b, p.s, p.Hkv, p.Dqk}, p.k);
    in.scale = 0.4f;
    in.row_weight = Tensor::from_vector<float>({p.b, p.s}, p.rw);
    if (sparse) {
      in.topk = indexer_topk(in.sc, 8, 2);
      in.K = 8;
    }
    return std::make_pair(sparse ? indexer_kl_sparse(in) : indexer_kl_dense(in), indexer_topk(in.sc, 8, 2));
  };
  for (bool sparse : {false, true}) {
    auto [ra, ta] = run(a, sparse);
    auto [rb, tb] = run(b, sparse);
    EXPECT_EQ(ra.kl_sum, rb.kl_sum);
    auto first = [](const Tensor& t, int64_t per_row) {
      auto v = t.to_vector<float>();
      return std::vector<float>(v.begin(), v.begin() + 37 * per_row);
    };
    EXPECT_EQ(first(ra.dqI, a.HI * a.DI), first(rb.dqI, b.HI * b.DI));
    EXPECT_EQ(first(ra.dkI, a.DI), first(rb.dkI, b.DI));
    EXPECT_EQ(first(ra.dw, a.HI), first(rb.dw, b.HI));
    auto ia = ta.to_vector<int32_t>(), ib = tb.to_vector<int32_t>();
    EXPECT_TRUE(std::equal(ia.begin(), ia.begin() + 37 * 10, ib.begin()));
  }
}

// The sparse KL's table contract on every device of the build (the CPU; CUDA with a device or the
// emulator): an external table with a duplicate or a later key is refused, naming the row; an
// own table (index_table.h) is not checked unless the debug option is on. On CUDA the external
// check copies exactly the table to the host, and an own table costs no copy: the same KL, with
// only the table's bytes less read back (cuda_counters), and the same bits.
TEST(IndexerKl, SparseTableContractIsChecked) {
  std::vector<Device> devices{Device::cpu};
  if (cuda_device_count() > 0 && cuda_backend()) devices.push_back(Device::cuda);
  for (Device dev : devices) {
    Problem p = make(1, 10, 2, 8, 2, 1, 4, layout_causal(1, 10), 41);
    IndexerKlInputs in;
    in.sc = p.scores();
    in.q = Tensor::from_vector<float>({1, 10, 2, 4}, p.q);
    in.k = Tensor::from_vector<float>({1, 10, 1, 4}, p.k);
    in.scale = 0.5f;
    in.row_weight = Tensor::from_vector<float>({1, 10}, p.rw);
    in.K = 2;
    for (Tensor* t : {&in.sc.qI, &in.sc.kI, &in.sc.w, &in.q, &in.k, &in.row_weight}) *t = t->to(dev);
    auto refusal = [&](const std::vector<int32_t>& t, TableOrigin origin) -> std::string {
      in.topk = Tensor::from_vector<int32_t>({1, 10, 2}, t).to(dev);
      in.topk_origin = origin;
      try {
        indexer_kl_sparse(in);
      } catch (const ShapeError& e) {
        return e.what();
      }
      return "";
    };
    std::vector<int32_t> t(10 * 2, -1);
    t[5 * 2] = 3;
    t[5 * 2 + 1] = 3;  // duplicate
    const std::string dup = refusal(t, TableOrigin::external);
    EXPECT_NE(dup.find("indexer sparse KL: row 5 of batch 0 lists key 3 twice"), std::string::npos) << dup;
    EXPECT_EQ(refusal(t, TableOrigin::own), "") << device_name(dev);
    const bool was = set_check_all_tables(true);
    EXPECT_EQ(refusal(t, TableOrigin::own), dup);
    set_check_all_tables(was);
    t[5 * 2 + 1] = 7;  // a future key
    EXPECT_NE(refusal(t, TableOrigin::external).find("index table [0, 5, 1] = 7"), std::string::npos);
    t[5 * 2 + 1] = 4;
    EXPECT_EQ(refusal(t, TableOrigin::external), "");
    if (dev != Device::cuda) continue;
    auto cost = [&](TableOrigin origin, IndexerKlResult& r) {
      in.topk = Tensor::from_vector<int32_t>({1, 10, 2}, t).to(dev);
      in.topk_origin = origin;
      const CudaCounters before = cuda_counters();
      r = indexer_kl_sparse(in);
      return cuda_counters() - before;
    };
    IndexerKlResult re, ro;
    const CudaCounters ext = cost(TableOrigin::external, re), own = cost(TableOrigin::own, ro);
    EXPECT_EQ(ext.d2h_bytes - own.d2h_bytes, in.topk.nbytes()) << "the external check copies the table once";
    EXPECT_EQ(ext.syncs - own.syncs, 1) << "and waits for it once";
    EXPECT_EQ(re.kl_sum, ro.kl_sum);
    EXPECT_EQ(re.dqI.to_vector<float>(), ro.dqI.to_vector<float>());
  }
}

}  // namespace
}  // namespace hmla
