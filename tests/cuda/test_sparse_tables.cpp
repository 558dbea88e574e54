// Index tables on the CUDA backend (DESIGN.md section 4): what checking a table costs the host,
// external against own tables (cuda_counters), and the sparse backward's inverse index built on
// the device, against the host walk it replaced. Built against the device (label gpu) and the
// SIMT emulator (label emu).
#include <gtest/gtest.h>

#include <cstdint>
#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attn_cuda_check.h"
#include "check_util.h"
#include "cuda_kernels.h"
#include "sparse_cuda_check.h"
#include "hmla/core/cuda.h"
#include "hmla/core/error.h"
#include "hmla/ops/index_table.h"
#include "hmla/ops/sparse_attention.h"

namespace hmla {
namespace {

// A backward-capable shape (H a multiple of 16, Dqk and Dv of 16) small enough for the emulator.
struct Shape5 {
  int64_t b = 2, s = 40, H = 16, Dqk = 64, Dv = 32, K = 8, W = 4;
};

// A causal table whose rows share keys, with -1 slots scattered among the listed ones (so a
// key's position in compact()'s order differs from its slot): row t lists keys 0..min(t, 2) (the
// keys every row reads), random distinct keys of [0, t] among its candidate slots, its last W
// positions in the window slots when not already listed, and -1 in about a quarter of the slots.
std::vector<int32_t> shared_key_table(const Shape5& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t KW = c.K + c.W;
  std::vector<int32_t> idx(c.b * c.s * KW, -1);
  for (int64_t r = 0; r < c.b * c.s; ++r) {
    const int64_t t = r % c.s;
    std::vector<int32_t> keys(t + 1);
    std::iota(keys.begin(), keys.end(), 0);
    std::shuffle(keys.begin() + std::min<int64_t>(t + 1, 3), keys.end(), rng);
    std::vector<bool> used(t + 1, false);
    int64_t next = 0;
    for (int64_t i = 0; i < c.K && next <= t; ++i) {
      if (rng() % 4 == 0) continue;
      idx[r * KW + i] = keys[next], used[keys[next]] = true, ++next;
    }
    for (int64_t i = 0; i < c.W; ++i) {
      const int64_t j = t - c.W + 1 + i;
      if (j >= 0 && !used[j] && rng() % 4 != 0) idx[r * KW + c.K + i] = int32_t(j);
    }
  }
  return idx;
}

struct SparseRun {
  AttnSparseInputs in;
  AttnSparseSaved sv;
  Tensor dout;
};

SparseRun make_run(const Shape5& c, const std::vector<int32_t>& idx, uint64_t seed) {
  using cuda_check::put;
  using cuda_check::randn_bf16;
  SparseRun r;
  r.in.q = put({c.b, c.s, c.H, c.Dqk}, randn_bf16(c.b * c.s * c.H * c.Dqk, seed));
  r.in.kv = put({c.b, c.s, c.Dqk}, randn_bf16(c.b * c.s * c.Dqk, seed + 1));
  r.in.Dv = c.Dv;
  r.in.idx = Tensor::from_vector<int32_t>({c.b, c.s, c.K + c.W}, idx).to(Device::cuda);
  r.in.K = c.K;
  r.in.scale = 0.125f;
  r.sv = attn_sparse_fwd(r.in);
  r.dout = put({c.b, c.s, c.H, c.Dv}, randn_bf16(c.b * c.s * c.H * c.Dv, seed + 2));
  return r;
}

std::vector<unsigned char> bytes(const Tensor& t) {
  const Tensor h = t.to(Device::cpu);
  const auto* p = static_cast<const unsigned char*>(h.raw_data());
  return {p, p + h.nbytes()};
}

// The inverse index as the host walk of earlier versions built it (the reference): per key, in
// (row, position) order, positions numbered over the listed candidates, then the listed window.
cuda::SparseInverseIndex host_walk(const std::vector<int32_t>& idx, int64_t b, int64_t sq, int64_t skv, int64_t KW,
                                   int64_t K, int64_t r0, int64_t nr) {
  cuda::SparseInverseIndex r{std::vector<int64_t>(b * skv + 1, 0), {}};
  auto walk = [&](auto&& visit) {
    for (int64_t row = r0; row < r0 + nr; ++row) {
      int64_t pos = 0;
      for (int pass = 0; pass < 2; ++pass)
        for (int64_t i = pass ? K : 0; i < (pass ? KW : K); ++i) {
          const int32_t j = idx[row * KW + i];
          if (j >= 0) visit((row / sq) * skv + j, (row - r0) * KW + pos++);
        }
    }
  };
  walk([&](int64_t key, int64_t) { ++r.offsets[key + 1]; });
  for (size_t k = 1; k < r.offsets.size(); ++k) r.offsets[k] += r.offsets[k - 1];
  r.entries.resize(r.offsets.back());
  std::vector<int64_t> fill(r.offsets.begin(), r.offsets.end() - 1);
  walk([&](int64_t key, int64_t e) { r.entries[fill[key]++] = e; });
  return r;
}

// The device-built inverse index is the host walk's, entry for entry (so the backward's dkv sums
// in the same order and its bits are those of the host-built index): whole tables, chunks of one
// row and chunks of 7 rows that straddle two batch elements, on rows sharing keys with -1 slots
// among the listed ones, and on rows of 300 slots (compact() over two rounds of 256 threads).
TEST(SparseTables, TheDeviceInverseIndexIsTheHostWalksOrder) {
  if (!cuda_check::device_available()) GTEST_SKIP() << "no CUDA device";
  Shape5 wide;
  wide.b = 1, wide.s = 320, wide.K = 280, wide.W = 20;
  for (const Shape5& c : {Shape5{}, wide}) {
    const std::vector<int32_t> idx = shared_key_table(c, 7);
    const Tensor table = Tensor::from_vector<int32_t>({c.b, c.s, c.K + c.W}, idx).to(Device::cuda);
    AttnSparseParams p;
    p.b = c.b, p.sq = c.s, p.skv = c.s, p.KW = c.K + c.W, p.K = c.K;
    p.idx = table.data<int32_t>();
    const int64_t rows = c.b * c.s;
    for (int64_t chunk : {rows, int64_t(1), int64_t(7)})
      for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        if (chunk == 1 && r0 % 17 != 3 && r0 != rows - 1) continue;  // a sample of the single rows
        const int64_t nr = std::min(chunk, rows - r0);
        const cuda::SparseInverseIndex got = cuda::sparse_inverse_index(p, r0, nr);
        const cuda::SparseInverseIndex want = host_walk(idx, c.b, c.s, c.s, p.KW, c.K, r0, nr);
        ASSERT_EQ(got.offsets, want.offsets) << "KW " << p.KW << ", rows [" << r0 << ", " << r0 + nr << ")";
        ASSERT_EQ(got.entries, want.entries) << "KW " << p.KW << ", rows [" << r0 << ", " << r0 + nr << ")";
      }
  }
}

// An own table (the model's) costs the sparse backward nothing on the host: no copy either way,
// no synchronisation (the inverse index is built on the device). An external one costs its
// check's verdict: 4 bytes read back, the table itself never. Forward alike. Both give the same
// bits, chunked or not.
TEST(SparseTables, AnOwnTableCostsTheBackwardNoHostTraffic) {
  if (!cuda_check::device_available()) GTEST_SKIP() << "no CUDA device";
  const Shape5 c;
  SparseRun r = make_run(c, shared_key_table(c, 7), 11);
  const AttnSparseGrads ext = attn_sparse_bwd(r.in, r.sv, r.dout);
  r.in.idx_origin = TableOrigin::own;
  CudaCounters before = cuda_counters();
  const AttnSparseSaved sv = attn_sparse_fwd(r.in);
  const CudaCounters fwd = cuda_counters() - before;
  before = cuda_counters();
  const AttnSparseGrads own = attn_sparse_bwd(r.in, sv, r.dout);
  const CudaCounters bwd = cuda_counters() - before;
  for (const CudaCounters& k : {fwd, bwd}) {
    EXPECT_EQ(k.syncs, 0);
    EXPECT_EQ(k.d2h_bytes, 0);
    EXPECT_EQ(k.h2d_bytes, 0);
  }
  r.in.idx_origin = TableOrigin::external;
  before = cuda_counters();
  const AttnSparseGrads ext2 = attn_sparse_bwd(r.in, r.sv, r.dout);
  const CudaCounters checked = cuda_counters() - before;
  EXPECT_EQ(checked.d2h_bytes, int64_t(sizeof(int32_t))) << "only the check's verdict comes back";
  EXPECT_EQ(checked.syncs, 1);
  const cuda_check::ScopedSparseBwdWorkspace seven_rows(7 * (c.K + c.W) * c.Dqk * int64_t(sizeof(float)));
  r.in.idx_origin = TableOrigin::own;
  const AttnSparseGrads chunked = attn_sparse_bwd(r.in, sv, r.dout);
  for (const AttnSparseGrads* g : {&own, &ext2, &chunked}) {
    EXPECT_EQ(bytes(g->dq), bytes(ext.dq));
    EXPECT_EQ(bytes(g->dkv), bytes(ext.dkv));
  }
}

// An external table breaking the contract is refused at both entries with the device check's
// message naming the first bad row (rows 3, 30 and 45 are bad: row 3 is named, whatever order the
// blocks ran in); an own table with a duplicate runs unchecked, and the debug option refuses it
// with the external table's message.
TEST(SparseTables, ExternalTablesAreRefusedAtEveryEntryNamingTheFirstBadRow) {
  if (!cuda_check::device_available()) GTEST_SKIP() << "no CUDA device";
  const Shape5 c;
  const int64_t KW = c.K + c.W;
  const std::vector<int32_t> good = shared_key_table(c, 7);
  SparseRun r = make_run(c, good, 11);
  auto refusal = [&](auto&& entry) -> std::string {
    try {
      entry();
    } catch (const ShapeError& e) {
      return e.what();
    }
    return "";
  };
  std::vector<int32_t> bad = good;
  bad[3 * KW + 0] = bad[3 * KW + 1] = 0;  // a duplicate
  bad[30 * KW + 2] = int32_t(c.s);   // past skv
  bad[45 * KW + 0] = -7;             // batch 1's row 5
  r.in.idx = Tensor::from_vector<int32_t>({c.b, c.s, KW}, bad).to(Device::cuda);
  const std::string fwd = refusal([&] { attn_sparse_fwd(r.in); });
  EXPECT_NE(fwd.find("sparse attention: row 3 of batch 0 lists a key outside [-1, 40) or a key twice"),
            std::string::npos) << fwd;
  EXPECT_EQ(refusal([&] { attn_sparse_bwd(r.in, r.sv, r.dout); }), fwd);
  // Two rows out of range and no duplicate: the range check alone names the first (whichever of
  // the two blocks runs first).
  std::vector<int32_t> range = good;
  range[30 * KW + 2] = int32_t(c.s);
  range[45 * KW + 0] = -7;
  r.in.idx = Tensor::from_vector<int32_t>({c.b, c.s, KW}, range).to(Device::cuda);
  const std::string rfwd = refusal([&] { attn_sparse_fwd(r.in); });
  EXPECT_NE(rfwd.find("sparse attention: row 30 of batch 0 lists a key outside [-1, 40)"), std::string::npos) << rfwd;
  std::vector<int32_t> dup = good;
  dup[3 * KW + 0] = dup[3 * KW + 1] = 0;
  r.in.idx = Tensor::from_vector<int32_t>({c.b, c.s, KW}, dup).to(Device::cuda);
  r.in.idx_origin = TableOrigin::own;
  EXPECT_EQ(refusal([&] { attn_sparse_fwd(r.in); }), "");  // (its backward would sum in no fixed order)
  const bool was = set_check_all_tables(true);
  EXPECT_EQ(refusal([&] { attn_sparse_fwd(r.in); }), fwd);
  EXPECT_EQ(refusal([&] { attn_sparse_bwd(r.in, r.sv, r.dout); }), fwd);
  set_check_all_tables(was);
}

}  // namespace
}  // namespace hmla
