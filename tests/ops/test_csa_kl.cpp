// The CSA indexer's KL ops (compressed_index_kl_dense / _sparse, hmla/ops/compressed_index.h) beyond
// their case rows (cases_csa_kl.h, run against the float64 oracle by test_case_rows.cpp): Megatron-LM's
// loss materialised in f32 gives the same numbers; extreme logits (every candidate's exp(z - lse)
// below f32's range) keep the target; the sparse table is a set (order, repeats, invisible and
// out-of-range picks change no bit) and K past every row's visible count is the dense KL; rows without
// a target give exact zeros; the bits do not depend on the thread count; kl_acc; the memory property
// (nothing [s, n_e]); the entry points' refusals. CPU; the row shards also on CUDA where there is one
// (the GPU, or the SIMT emulator: test_csa_kl_emu runs those).
#include <gtest/gtest.h>

#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cases_csa_kl.h"
#include "hmla/core/allocator.h"
#include "hmla/core/cuda.h"
#include "hmla/core/error.h"

namespace hmla {
namespace {

using op_cases::CsaKlCase;
using op_cases::CsaKlGot;
using op_cases::CsaKlRow;
using op_cases::CsaKlRowData;
using op_cases::CsaSink;

const Device kCpu = Device::cpu;

// Row 0: documents [0,3), [3,11), [11,24), padding; row 1: [0,25), padding (cases_csa_kl.h's `small`).
CsaKlRow small_row(int64_t K, CsaSink sink = CsaSink::given, uint32_t seed = 21) {
  return {"small", op_cases::Oracle::csa_kl_ref, {2, 28, 3, 4, 2, 3, 3, 2, K, {{0, 3, 11, 24}, {0, 25}}, true, seed}, sink};
}

CsaKlRow row_named(const std::string& name) {
  for (const CsaKlRow& r : op_cases::csa_kl_rows())
    if (r.name == name) return r;
  ADD_FAILURE() << "no row " << name;
  return {};
}

double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i) e = std::max(e, std::abs(double(a[i]) - b[i]));
  return e;
}
double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i) e = std::max(e, std::abs(double(a[i]) - double(b[i])));
  return e;
}

void expect_same_bits(const CsaKlGot& a, const CsaKlGot& b, const std::string& what) {
  EXPECT_EQ(std::memcmp(&a.kl_sum, &b.kl_sum, sizeof(double)), 0) << what << ": kl_sum " << a.kl_sum << " vs " << b.kl_sum;
  EXPECT_EQ(a.dqI, b.dqI) << what;
  EXPECT_EQ(a.dkI, b.dkI) << what;
  EXPECT_EQ(a.dw, b.dw) << what;
}

TEST(CsaKl, TheCpuRunsEveryRow) {
  EXPECT_EQ(op_cases::rows_not_run(cpu_backend(), DType::f32, op_cases::csa_kl_rows()), "");
}

// Megatron-LM's loss written the naive way in f32 (csa_kl_megatron_f32: the [H, s, n_e] logits, p =
// exp(z - lse) with attn_compressed_fwd's lse, the head sum, L1 normalisation, a masked softmax, dI =
// Q - P) and the fused op give the same numbers to f32 accuracy: both are within the rule of the
// float64 oracle (the op within 2 n + rounding, Megatron's within n, its own error), so they differ by
// at most 3 n + rounding. kl_sum with rw = 1 / valid_rows is Megatron's mean over the non-padding rows.
TEST(CsaKl, MatchesMegatronMaterialisedInF32) {
  for (int64_t K : {0, 3}) {
    const CsaKlRowData rd = op_cases::csa_kl_row_data(small_row(K));
    const op_cases::CsaKlRef r = op_cases::csa_kl_ref(rd.d.x, rd.d.layout);
    const std::vector<float> lse = op_cases::csa_kl_lse(rd, kCpu);
    const CsaKlGot g = op_cases::csa_kl_run(rd, kCpu, false, lse);
    const op_cases::CsaKlNaive mt = op_cases::csa_kl_megatron_f32(rd.d.x, lse, r.cand);
    const op_cases::CsaKlMags mg = op_cases::csa_kl_mags(rd.d.x, r);
    const double f = 8 * 0x1p-24 * (1 + mg.zmax);
    const double nk = std::abs(mt.kl_sum - r.kl_sum);
    EXPECT_LE(std::abs(g.kl_sum - mt.kl_sum), 3 * nk + f * mg.kl) << "K = " << K;
    EXPECT_LE(max_abs_diff(g.dqI, mt.dqI), 3 * max_abs_diff(mt.dqI, r.dqI) + f * mg.dqI) << "K = " << K;
    EXPECT_LE(max_abs_diff(g.dkI, mt.dkI), 3 * max_abs_diff(mt.dkI, r.dkI) + f * mg.dkI) << "K = " << K;
    EXPECT_LE(max_abs_diff(g.dw, mt.dw), 3 * max_abs_diff(mt.dw, r.dw) + f * mg.dw) << "K = " << K;
    EXPECT_GT(r.kl_sum, 1e-3) << "a loss worth comparing";
    std::printf("K = %lld: kl_sum op %.9g, Megatron f32 %.9g, float64 %.9g; max |op - Megatron|: dqI %.3g dkI %.3g dw %.3g\n",
                (long long)K, g.kl_sum, mt.kl_sum, r.kl_sum, max_abs_diff(g.dqI, mt.dqI), max_abs_diff(g.dkI, mt.dkI),
                max_abs_diff(g.dw, mt.dw));
  }
}

// Every lse_h raised by 110 (as if the window and the sink held e^110 more mass: P is unchanged, every
// head's candidate mass c_h scales by e^-110). Megatron's f32 exp(z - lse) is then below f32's
// smallest subnormal (e^-103.3) for every candidate: its target is lost. The log Z form keeps it: the
// op stays within the rule's bound of the unshifted problem plus the rounding of exponent arguments
// 220 larger (lse + 110 and log Z - 110 each round on their own scale).
TEST(CsaKl, ExtremeLogitsKeepTheTarget) {
  const float shift = 110.f;
  for (int64_t K : {0, 3}) {
    const CsaKlRowData rd = op_cases::csa_kl_row_data(small_row(K));
    const op_cases::CsaKlRef r = op_cases::csa_kl_ref(rd.d.x, rd.d.layout);
    const std::vector<float> lse = op_cases::csa_kl_lse(rd, kCpu);
    std::vector<float> big = lse;
    for (float& v : big) v = std::isinf(v) ? v : v + shift;
    const CsaKlGot g = op_cases::csa_kl_run(rd, kCpu, false, big);
    const op_cases::CsaKlNaive n0 = op_cases::csa_kl_megatron_f32(rd.d.x, lse, r.cand);
    const op_cases::CsaKlNaive n1 = op_cases::csa_kl_megatron_f32(rd.d.x, big, r.cand);
    const op_cases::CsaKlMags mg = op_cases::csa_kl_mags(rd.d.x, r);
    const double f = 8 * 0x1p-24 * (1 + mg.zmax + 2 * double(shift));
    EXPECT_LE(std::abs(g.kl_sum - r.kl_sum), 2 * std::abs(n0.kl_sum - r.kl_sum) + f * mg.kl) << "K = " << K;
    EXPECT_LE(max_abs_diff(g.dqI, r.dqI), 2 * max_abs_diff(n0.dqI, r.dqI) + f * mg.dqI) << "K = " << K;
    EXPECT_LE(max_abs_diff(g.dkI, r.dkI), 2 * max_abs_diff(n0.dkI, r.dkI) + f * mg.dkI) << "K = " << K;
    EXPECT_LE(max_abs_diff(g.dw, r.dw), 2 * max_abs_diff(n0.dw, r.dw) + f * mg.dw) << "K = " << K;
    EXPECT_GT(std::abs(n1.kl_sum - r.kl_sum), 0.01 * r.kl_sum) << "Megatron's f32 target should be lost here";
    std::printf("K = %lld: kl_sum float64 %.9g, op %.9g, Megatron f32 %.9g (unshifted %.9g)\n", (long long)K, r.kl_sum,
                g.kl_sum, n1.kl_sum, n0.kl_sum);
  }
}

// A row's table is a set: its slots shuffled, a repeat, an invisible entry and an index past n_e added
// change no bit (the op sorts each row's visible picks and keeps each once).
TEST(CsaKl, SparseTableIsASet) {
  const CsaKlRowData rd = op_cases::csa_kl_row_data(small_row(3));
  const std::vector<float> lse = op_cases::csa_kl_lse(rd, kCpu);
  const CsaKlGot g = op_cases::csa_kl_run(rd, kCpu, false, lse);
  CsaKlRowData y = rd;
  const op_cases::CsaKlDims& m = rd.d.x.dm;
  const int64_t K = m.K, K2 = K + 3;
  y.d.x.dm.K = K2;
  y.d.x.topk.assign(size_t(m.b * m.s * K2), -1);
  op_cases::CsaKlInputs dense = rd.d.x;
  dense.dm.K = 0;
  std::mt19937 gen(3);
  int64_t invisible = 0;
  for (int64_t row = 0; row < m.b * m.s; ++row) {
    int32_t* o = &y.d.x.topk[size_t(row * K2)];
    std::copy_n(&rd.d.x.topk[size_t(row * K)], K, o);
    o[K] = o[0];                    // a repeat (or -1)
    o[K + 1] = int32_t(m.n_e + 2);  // out of range
    const std::vector<char> vis = op_cases::csa_kl_candidates(dense, rd.d.layout, row / m.s, row % m.s);
    for (int64_t e = 0; e < m.n_e; ++e)
      if (!vis[size_t(e)]) o[K + 2] = int32_t(e);  // an entry the row does not see
    invisible += o[K + 2] >= 0;
    std::shuffle(o, o + K2, gen);
  }
  EXPECT_GT(invisible, m.b * m.s / 2);
  expect_same_bits(g, op_cases::csa_kl_run(y, kCpu, false, lse), "shuffled table");
}

// K past every row's visible count lists every visible entry: the sparse KL is the dense one. Both are
// within the rule of the same oracle, so they differ by at most twice the rule's bound.
TEST(CsaKl, SparseWithEveryVisibleEntryIsTheDenseKl) {
  const CsaKlRowData rs = op_cases::csa_kl_row_data(small_row(32));
  CsaKlRowData rdense = rs;
  rdense.d.x.dm.K = 0;
  rdense.d.x.topk.clear();
  const op_cases::CsaKlRef r = op_cases::csa_kl_ref(rdense.d.x, rdense.d.layout);
  const std::vector<float> lse = op_cases::csa_kl_lse(rdense, kCpu);
  const CsaKlGot gs = op_cases::csa_kl_run(rs, kCpu, false, lse), gd = op_cases::csa_kl_run(rdense, kCpu, false, lse);
  const op_cases::CsaKlNaive nv = op_cases::csa_kl_megatron_f32(rdense.d.x, lse, r.cand);
  const op_cases::CsaKlMags mg = op_cases::csa_kl_mags(rdense.d.x, r);
  const double f = 8 * 0x1p-24 * (1 + mg.zmax);
  EXPECT_LE(std::abs(gs.kl_sum - gd.kl_sum), 2 * (2 * std::abs(nv.kl_sum - r.kl_sum) + f * mg.kl));
  EXPECT_LE(max_abs_diff(gs.dqI, gd.dqI), 2 * (2 * max_abs_diff(nv.dqI, r.dqI) + f * mg.dqI));
  EXPECT_LE(max_abs_diff(gs.dkI, gd.dkI), 2 * (2 * max_abs_diff(nv.dkI, r.dkI) + f * mg.dkI));
  EXPECT_LE(max_abs_diff(gs.dw, gd.dw), 2 * (2 * max_abs_diff(nv.dw, r.dw) + f * mg.dw));
}

// No target: an infinite sink on every head (every lse_h = +inf) gives kl 0 and zero gradients
// exactly, no NaN; rows without a candidate (the first m - 1 rows of each document, padding rows)
// and a real row of weight 0 get exactly zero dqI and dw.
TEST(CsaKl, RowsWithoutATargetGiveExactZeros) {
  for (int64_t K : {0, 3}) {
    const CsaKlRowData rd = op_cases::csa_kl_row_data(small_row(K, CsaSink::inf_all));
    const CsaKlGot g = op_cases::csa_kl_run(rd, kCpu, false, op_cases::csa_kl_lse(rd, kCpu));
    EXPECT_EQ(g.kl_sum, 0.0);
    for (const std::vector<float>* v : {&g.dqI, &g.dkI, &g.dw})
      for (float x : *v) ASSERT_EQ(x, 0.f) << "K = " << K;
  }
  CsaKlRow zr = small_row(0);
  zr.zero_weight = true;
  const CsaKlRowData rd = op_cases::csa_kl_row_data(zr);
  const op_cases::CsaKlRef r = op_cases::csa_kl_ref(rd.d.x, rd.d.layout);
  const CsaKlGot g = op_cases::csa_kl_run(rd, kCpu, false, op_cases::csa_kl_lse(rd, kCpu));
  const op_cases::CsaKlDims& m = rd.d.x.dm;
  int64_t rows = 0;
  for (int64_t row = 0; row < m.b * m.s; ++row) {
    const bool none = std::count(r.cand.begin() + row * m.n_e, r.cand.begin() + (row + 1) * m.n_e, 1) == 0;
    if (!none && rd.d.x.row_weight[size_t(row)] != 0) continue;
    ++rows;
    for (int64_t i = 0; i < m.nI * m.dI; ++i) ASSERT_EQ(g.dqI[size_t(row * m.nI * m.dI + i)], 0.f) << "row " << row;
    for (int64_t i = 0; i < m.nI; ++i) ASSERT_EQ(g.dw[size_t(row * m.nI + i)], 0.f) << "row " << row;
  }
  EXPECT_EQ(rows, 1 + 1 + 1 + 4 + 1 + 3 + 1);  // row 0 of each document (rate 2), the padding, the weight-0 row
}

// The same bits on 1, 2, 3 and 7 threads, on rows with several tiles of rows and entries.
TEST(CsaKl, BitsDoNotDependOnTheThreadCount) {
  const int was = omp_get_max_threads();
  for (const char* name : {"dense_tiles", "sparse_tiles", "dense_packed", "sparse_k3"}) {
    const CsaKlRowData rd = op_cases::csa_kl_row_data(row_named(name));
    const std::vector<float> lse = op_cases::csa_kl_lse(rd, kCpu);
    omp_set_num_threads(1);
    const CsaKlGot g1 = op_cases::csa_kl_run(rd, kCpu, false, lse);
    for (int n : {2, 3, 7}) {
      omp_set_num_threads(n);
      expect_same_bits(g1, op_cases::csa_kl_run(rd, kCpu, false, lse), std::string(name) + ", threads " + std::to_string(n));
    }
    omp_set_num_threads(was);
  }
}

// kl_acc: the sum is added into it and the result's kl_sum and loss are NaN.
TEST(CsaKl, KlAccumulatorIsAddedInto) {
  for (int64_t K : {0, 3}) {
    const CsaKlRowData rd = op_cases::csa_kl_row_data(small_row(K));
    const std::vector<float> lse = op_cases::csa_kl_lse(rd, kCpu);
    const CsaKlGot g = op_cases::csa_kl_run(rd, kCpu, false, lse);
    CompressedIndexKlInputs in = op_cases::csa_kl_inputs(rd, kCpu, false, lse);
    in.kl_acc = Tensor::from_vector<double>({1}, {0.25});
    const CompressedIndexKlResult r = K > 0 ? compressed_index_kl_sparse(in) : compressed_index_kl_dense(in);
    EXPECT_TRUE(std::isnan(r.kl_sum) && std::isnan(r.loss));
    EXPECT_EQ(in.kl_acc.to_vector<double>()[0], 0.25 + g.kl_sum);
    EXPECT_EQ(r.dqI.to_vector<float>(), g.dqI);
  }
}

// The op's allocations beyond its outputs at s = 4096, n_e = 1024 (rate 4): the row statistics (16 B a
// row), per-thread tiles and, sparse, the rows' candidate sets and their inverse index (O(s K)), far
// under one f32 [s, n_e] tensor. The per-thread tiles as src/cpu/compressed_index_kl.cpp carves them
// (IndexerCpuTraits: 32 rows, 128 entries).
TEST(CsaKlMemory, NothingProportionalToSTimesEntries) {
  const int64_t s = 4096, H = 2, d = 16, nI = 2, dI = 16, K = 64, Bq = 32, Bk = 128;
  CsaKlRow row{"mem", op_cases::Oracle::csa_kl_ref, {1, s, H, d, nI, dI, 16, 4, 0, {{0, s}}, true, 31}};
  const CsaKlRowData rd = op_cases::csa_kl_row_data(row);
  const int64_t n_e = rd.d.x.dm.n_e;
  ASSERT_EQ(n_e, s / 4);
  const std::vector<float> lse = op_cases::csa_kl_lse(rd, kCpu);
  CompressedIndexKlInputs in = op_cases::csa_kl_inputs(rd, kCpu, false, lse);
  in.topk = compressed_index_topk(in.sc, K);
  const int64_t nth = omp_get_max_threads();
  const int64_t outputs = (s * nI * dI + n_e * dI + s * nI) * 4, stats = s * 16, acc = 8;
  const int64_t tile = (2 * Bq * nI * Bk + 4 * Bq * Bk + 3 * H * Bq + 6 * Bq + Bq * nI) * 4;
  const int64_t sp_row = (2 * nI * K + H * K + 3 * K + K * dI + K * d + 2 * H) * 4;
  const int64_t sp_entry = (Bq * nI * dI + Bq * H * d + 4 * Bq * nI + 2 * Bq * H + 6 * Bq) * 4;
  const int64_t sp_tables = s * K * 4 + s * 4 + (n_e + 1) * 8 + s * K * 4 + n_e * 8;
  Allocator& a = allocator(kCpu);
  for (bool sparse : {false, true}) {
    const int64_t before = int64_t(a.live_bytes());
    a.reset_peak();
    const CompressedIndexKlResult r = sparse ? compressed_index_kl_sparse(in) : compressed_index_kl_dense(in);
    const int64_t extra = int64_t(a.peak_bytes()) - before - outputs;
    const int64_t bound = stats + acc + (sparse ? sp_tables + nth * std::max(sp_row, sp_entry) : nth * tile);
    EXPECT_LE(extra, bound) << (sparse ? "sparse" : "dense");
    EXPECT_LT(extra, s * n_e * 4 / 4) << "under a quarter of one f32 [s, n_e] tensor";
    EXPECT_GT(r.kl_sum, 0);
    std::printf("compressed_index_kl_%s memory, s = %lld, n_e = %lld, %lld threads: %lld B beyond the outputs "
                "(bound %lld); one f32 [s, n_e] = %lld B\n",
                sparse ? "sparse" : "dense", (long long)s, (long long)n_e, (long long)nth, (long long)extra,
                (long long)bound, (long long)(s * n_e * 4));
  }
}

// The entry points' refusals, each one line naming the op and what is wrong.
TEST(CsaKlInputs, RefusesBadShapesDtypesAndTables) {
  const CsaKlRowData rd = op_cases::csa_kl_row_data(small_row(3));
  const std::vector<float> lse = op_cases::csa_kl_lse(rd, kCpu);
  const CompressedIndexKlInputs good = op_cases::csa_kl_inputs(rd, kCpu, false, lse);
  const op_cases::CsaKlDims& m = rd.d.x.dm;
  auto refusal = [&](const CompressedIndexKlInputs& in, bool sparse) -> std::string {
    try {
      sparse ? compressed_index_kl_sparse(in) : compressed_index_kl_dense(in);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(refusal(good, true), "");
  EXPECT_EQ(refusal(good, false), "");  // the dense KL ignores the table
  struct Bad {
    const char* what;
    bool sparse;
    std::function<void(CompressedIndexKlInputs&)> edit;
  };
  const Bad bads[] = {
      {"compressed_index_kl_dense: q must be", false, [&](CompressedIndexKlInputs& in) { in.q = Tensor::zeros({m.b, m.s - 1, m.H, m.d}, DType::f32); }},
      {"compressed_index_kl_dense: ent must be a contiguous bf16", false,  // q and ent share a dtype
       [&](CompressedIndexKlInputs& in) { in.q = Tensor::zeros({m.b, m.s, m.H, m.d}, DType::bf16); }},
      {"compressed_index_kl_dense: q has strides", false,
       [&](CompressedIndexKlInputs& in) { in.q = Tensor::zeros({m.b, m.s, m.d, m.H}, DType::f32).transpose(2, 3); }},
      {"compressed_index_kl_dense: ent must be", false, [&](CompressedIndexKlInputs& in) { in.ent = Tensor::zeros({m.b, m.n_e, m.d + 1}, DType::f32); }},
      {"compressed_index_kl_dense: lse must be", false, [&](CompressedIndexKlInputs& in) { in.lse = Tensor::zeros({m.b, m.H, m.s + 1}, DType::f32); }},
      {"compressed_index_kl_dense: row_weight must be", false, [&](CompressedIndexKlInputs& in) { in.row_weight = Tensor::zeros({m.b, m.s}, DType::f64); }},
      {"compressed_index_kl_dense: scale must be", false, [&](CompressedIndexKlInputs& in) { in.scale = 0.f; }},
      {"compressed_index_kl_dense: scale must be", false, [&](CompressedIndexKlInputs& in) { in.coeff = -1.f; }},
      {"compressed_index_kl_dense: kl_acc must be", false, [&](CompressedIndexKlInputs& in) { in.kl_acc = Tensor::zeros({1}, DType::f32); }},
      {"compressed_index_kl_dense: kI must be", false, [&](CompressedIndexKlInputs& in) { in.sc.kI = Tensor::zeros({m.b, m.n_e, m.dI + 1}, DType::f32); }},
      {"compressed_index_kl_sparse: topk must be", true, [&](CompressedIndexKlInputs& in) { in.topk = Tensor(); }},
      {"compressed_index_kl_sparse: topk must be", true, [&](CompressedIndexKlInputs& in) { in.topk = Tensor::zeros({m.b, m.s + 1, 3}, DType::i32); }},
      {"compressed_index_kl_sparse: topk must be", true, [&](CompressedIndexKlInputs& in) { in.topk = Tensor::zeros({m.b, m.s, 0}, DType::i32); }},
      {"compressed_index_kl_sparse: topk must be", true, [&](CompressedIndexKlInputs& in) { in.topk = Tensor::zeros({m.b, m.s, 3}, DType::f32); }},
      {"compressed_index_kl_sparse: entry", true, [&](CompressedIndexKlInputs& in) {
         std::vector<int32_t> last = in.sc.ent_last.to_vector<int32_t>();
         std::swap(last[0], last[1]);
         in.sc.ent_last = Tensor::from_vector<int32_t>({m.b, m.n_e}, last);
       }},
  };
  for (const Bad& b : bads) {
    CompressedIndexKlInputs in = good;
    b.edit(in);
    const std::string e = refusal(in, b.sparse);
    EXPECT_NE(e.find(b.what), std::string::npos) << "expected '" << b.what << "', got '" << e << "'";
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
}

// Context parallelism's row shards (DESIGN.md section 8): every case row's query rows in 2 and 3
// calls at q_row0 = k s / shards (q, lse, row weights, table and indexer queries sliced; entries
// whole), put together, meet the float64 oracle by the rule; dkI is the shards' sum. The CPU and, where
// there is one (the GPU or test_csa_kl_emu's emulator), CUDA in 3 shards only (the middle one at an
// offset on both ends; 2 as well doubles the emulator's ~25 s).
TEST(CsaKlShards, QueryRowsAtAnOffsetMeetTheOracle) {
  for (const CsaKlRow& r : op_cases::csa_kl_rows())
    for (int64_t shards : {2, 3}) EXPECT_EQ(op_cases::check(r, kCpu, shards), "") << r.name << " in " << shards;
  if (cuda_backend() && cuda_device_count() > 0) {
    for (const CsaKlRow& r : op_cases::csa_kl_rows()) EXPECT_EQ(op_cases::check(r, Device::cuda, 3), "") << r.name << " on CUDA";
  }
}

}  // namespace
}  // namespace hmla
