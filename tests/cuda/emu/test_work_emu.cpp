// The emulator's work counter on the attention, sparse attention and indexer-KL kernels: for each
// row of their case tables (op_cases.h) the CUDA backend runs, the tensor-core FLOPs the kernels'
// mma.sync instructions issued (emulate.h, ScopedWorkLog) against the op's FLOPs by the
// FlashAttention convention:
//   attention forward: 2 (Dqk + Dv) per valid (query row, key) pair and head;
//   attention backward: 2.5 x the forward (S again, dP, dV, dQ, dK: 2 (3 Dqk + 2 Dv) >= 2.5 x
//     2 (Dqk + Dv) whenever Dqk >= Dv, true of every row);
//   the indexer KL (forward and backward in one op): per valid pair, the attention target's scores
//     once (2 H Dqk), the index scores once (2 HI DI) and the two gradient products dqI and dkI
//     (2 x 2 HI DI): 2 H Dqk + 6 HI DI.
// Every row must issue at least its op's count (below it the counter misses work or the kernel is
// not on the tensor cores); each table's total must stay within what its kernels issue today
// (ceiling), and is printed against the issue's bound of its minimum (target: met or not yet).
// The forwards also print their m16n8 tile floor, the least any kernel on mma.sync's 16 x 8 tiles
// issues for the row (asserted as a lower bound of what the kernels issue): where a table's floor
// is above the issue's bound, no such kernel meets it on that table.
// The bound is on a table's totals (issued over minimal, summed over its rows): the small rows,
// whose one mma tile of 16 rows and 8 keys is much of their work, weigh what they cost. The
// printed per-row ratios say where the work goes (docs/cuda.md keeps the figures).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "attn_cuda_check.h"
#include "case_support.h"
#include "check_util.h"
#include "hmla/ops/attention.h"
#include "hmla/ops/backend.h"
#include "hmla/ops/indexer.h"
#include "hmla/ops/sparse_attention.h"
#include "sparse_cuda_check.h"

namespace hmla {
namespace {

using cuda_check::put;
using cuda_check::randn_bf16;

// target: the issue's bound on the table's total (printed: met or not yet); ceiling: what the
// kernels issue today, the regression bound (the counts are exact integers of the code and the
// shapes, the same on every machine; lower it with each kernel that does less work).
struct Tally {
  std::string table;
  double target, ceiling;
  double issued = 0, minimal = 0, floor = 0;
  bool every_row_at_least_minimal = true;
  // floor_flops > 0: the least any kernel on m16n8 tiles issues for the row (tile_floor); the
  // kernels must issue at least it too, and the total's floor says how much of the ratio is tiles.
  void add(const std::string& row, const emu::ScopedWorkLog& log, double min_flops, double floor_flops = 0) {
    std::map<std::string, uint64_t> by_kernel;
    for (const emu::LaunchWork& w : log.launches) by_kernel[w.kernel] += w.mma_flops;
    const double got = double(log.mma_flops());
    std::printf("%-22s %-28s issued %12.0f  minimal %12.0f  ratio %6.3f  load %10llu B  (", table.c_str(), row.c_str(),
                got, min_flops, got / min_flops, static_cast<unsigned long long>(log.load_bytes()));
    for (const auto& [k, f] : by_kernel)
      if (f) std::printf(" %s %.0f", k.c_str(), double(f));
    std::printf(" )\n");
    issued += got, minimal += min_flops, floor += floor_flops;
    if (got < floor_flops) ADD_FAILURE() << table << " " << row << ": issued " << got << ", below the m16n8 floor " << floor_flops;
    if (got < min_flops) {
      every_row_at_least_minimal = false;
      ADD_FAILURE() << table << " " << row << ": issued " << got << " tensor-core FLOPs, below the op's " << min_flops;
    }
  }
  void finish() const {
    const double r = issued / minimal;
    std::printf("%-22s total ratio %.3f (target %.2f: %s; ceiling %.2f)", table.c_str(), r, target,
                r <= target ? "met" : "not yet", ceiling);
    if (floor > 0) std::printf("; m16n8 tile floor %.3f", floor / minimal);
    std::printf("\n");
    EXPECT_LE(r, ceiling) << table;  // today's figure: a kernel that does more work fails, met or not
  }
};

// The least tensor-core work of a dense forward on m16n8 tiles, per head: each group of 16 query
// rows (the kernels' groups: local rows from 0) must cover its rows' keys, the union of their
// [doc_start, t], with 8-key tiles (at the best alignment: ceil(length / 8) of them), each 16 x 8 x
// 2 (Dqk + Dv) FLOPs (S and P V; Dqk in steps of 16, Dv of 8). No m16n8 kernel issues less: what is
// left above it is recompute or coarser skipping, what is below it in the ratio is tile
// granularity (the causal diagonal and the document boundaries inside a group).
double dense_tile_floor(const DocLayout& layout, int64_t b, int64_t s, int64_t r0, int64_t Dqk, int64_t Dv) {
  const auto ds = layout.doc_start.to_vector<int32_t>();
  const int64_t dqk = (Dqk + 15) / 16 * 16, dv = (Dv + 7) / 8 * 8;
  double tiles = 0;
  for (int64_t bb = 0; bb < b; ++bb)
    for (int64_t g0 = r0; g0 < s; g0 += 16) {
      int64_t lo = INT64_MAX, hi = -1;
      for (int64_t t = g0; t < std::min(s, g0 + 16); ++t)
        if (ds[bb * s + t] <= t) lo = std::min<int64_t>(lo, ds[bb * s + t]), hi = t;
      if (hi >= 0) tiles += double((hi - lo + 8) / 8);
    }
  return tiles * 16 * 8 * 2 * double(dqk + dv);
}

// Valid (query row, key) pairs of a per-document causal layout from row r0 on, per head.
int64_t dense_pairs(const DocLayout& layout, int64_t b, int64_t s, int64_t r0) {
  const auto ds = layout.doc_start.to_vector<int32_t>();
  int64_t n = 0;
  for (int64_t bb = 0; bb < b; ++bb)
    for (int64_t t = r0; t < s; ++t)
      if (ds[bb * s + t] <= t) n += t - ds[bb * s + t] + 1;
  return n;
}

DocLayout layout_of(const op_cases::AttnDenseCase& c) {
  if (!c.end_rows.empty()) return layout_from_end_rows(c.b, c.s, c.end_rows);
  return c.cu.empty() ? layout_causal(c.b, c.s) : layout_from_cu_seqlens(c.s, c.cu);
}

TEST(WorkCounter, DenseAttentionIssuesAtMostItsBoundOfTensorCoreWork) {
  Tally fwd{"dense forward", 1.15, 1.29}, bwd{"dense backward", 1.45, 1.75};
  for (const op_cases::AttnDenseCase& c : cuda_check::cases()) {
    const DocLayout layout = layout_of(c);
    const int64_t r0 = std::max<int64_t>(c.q_row0, 0), sq = c.s - r0;
    AttnDenseInputs in;
    in.q = put({c.b, sq, c.H, c.Dqk}, randn_bf16(c.b * sq * c.H * c.Dqk, 1));
    in.k = put({c.b, c.s, c.Hkv, c.Dqk}, randn_bf16(c.b * c.s * c.Hkv * c.Dqk, 2));
    in.v = c.v_from_k ? in.k.slice(3, 0, c.Dv) : put({c.b, c.s, c.Hkv, c.Dv}, randn_bf16(c.b * c.s * c.Hkv * c.Dv, 3));
    if (c.sink) in.sink = Tensor::from_vector<float>({c.H}, randn_bf16(c.H, 4)).to(Device::cuda);
    in.layout = &layout;
    in.scale = 1.f / std::sqrt(float(c.Dqk));
    in.q_row0 = r0;
    const Tensor dout = put({c.b, sq, c.H, c.Dv}, randn_bf16(c.b * sq * c.H * c.Dv, 5));
    const double f = double(dense_pairs(layout, c.b, c.s, r0)) * c.H * 2 * (c.Dqk + c.Dv);
    AttnDenseSaved sv;
    {
      emu::ScopedWorkLog log;
      sv = attn_dense_fwd(in);
      fwd.add(c.name, log, f, double(c.H) * dense_tile_floor(layout, c.b, c.s, r0, c.Dqk, c.Dv));
    }
    emu::ScopedWorkLog log;
    attn_dense_bwd(in, sv, dout);
    bwd.add(c.name, log, 2.5 * f);
  }
  fwd.finish();
  bwd.finish();
}

TEST(WorkCounter, SparseAttentionIssuesAtMostItsBoundOfTensorCoreWork) {
  Tally fwd{"sparse forward", 1.15, 1.16};
  Tally bwd{"sparse backward", 1.45, 1.26};
  for (const op_cases::AttnSparseCase& c : cuda_check::sparse_cases()) {
    const auto idx = op_cases::sparse_table(c, 7);
    int64_t listed = 0;
    for (int32_t j : idx) listed += j >= 0;
    AttnSparseInputs in{put({c.b, c.s, c.H, c.Dqk}, randn_bf16(c.b * c.s * c.H * c.Dqk, 1)),
                        put({c.b, c.s, c.Dqk}, randn_bf16(c.b * c.s * c.Dqk, 2)), c.Dv,
                        Tensor::from_vector<int32_t>({c.b, c.s, c.K + c.W}, idx).to(Device::cuda), c.K,
                        c.sink ? Tensor::from_vector<float>({c.H}, randn_bf16(c.H, 3)).to(Device::cuda) : Tensor(),
                        1.f / std::sqrt(float(c.Dqk))};
    const double f = double(listed) * c.H * 2 * (c.Dqk + c.Dv);
    // The m16n8 floor: a row's listed keys in 8-key tiles, its heads in 16s (Dqk in 16s, Dv in 8s).
    double key_tiles = 0;
    for (int64_t r = 0; r < c.b * c.s; ++r) {
      int64_t n = 0;
      for (int64_t i = 0; i < c.K + c.W; ++i) n += idx[r * (c.K + c.W) + i] >= 0;
      key_tiles += double((n + 7) / 8);
    }
    const double floor_f = key_tiles * 8 * double((c.H + 15) / 16 * 16) * 2 *
                           double((c.Dqk + 15) / 16 * 16 + (c.Dv + 7) / 8 * 8);
    AttnSparseSaved sv;
    {
      emu::ScopedWorkLog log;
      sv = attn_sparse_fwd(in);
      fwd.add(c.name, log, f, floor_f);
    }
    if (!cuda_backend()->supports(op_cases::params(c, DType::bf16, true))) continue;
    emu::ScopedWorkLog log;
    attn_sparse_bwd(in, sv, put({c.b, c.s, c.H, c.Dv}, randn_bf16(c.b * c.s * c.H * c.Dv, 4)));
    bwd.add(c.name, log, 2.5 * f);
  }
  fwd.finish();
  bwd.finish();
}

// The dense KL on bf16 inputs (the training step's) runs on the tensor cores; the sparse KL is
// still SIMT f32 (no tensor-core work to count: docs/cuda.md), so only the dense rows are here.
TEST(WorkCounter, TheDenseIndexerKlIssuesAtMostTwiceItsMinimalTensorCoreWork) {
  Tally dense{"dense indexer KL", 2.0, 1.92};
  // The table's rows (Dqk 12 padded to 16, HI 4) and one of the real models' proportions on one
  // document of a length the emulator runs in seconds (DeepSeek-V3.2: H 128 x 192 against HI 64 x 128; here a
  // sixteenth of the heads, a third of the widths), where tile padding no longer dominates.
  std::vector<op_cases::IndexerKlCase> rows = op_cases::indexer_kl();
  rows.push_back({"model_proportions", op_cases::Oracle::indexer_kl_ref, 1, 512, 4, 48, 8, 8, 64, false, true});
  for (const op_cases::IndexerKlCase& c : rows) {
    if (c.sparse) continue;
    // The layout of the KL's emulated table (test_mixed_dtype_emu.cpp): documents, a one-token
    // one, a second batch row of one document; the model-proportions row is one document.
    const DocLayout layout = c.b == 1 ? layout_causal(1, c.s) : layout_from_cu_seqlens(c.s, {{0, 40, 41, 42, 130}, {0, c.s}});
    const int64_t b = c.b, s = c.s;
    IndexerKlInputs in;
    in.sc = {put({b, s, c.HI, c.DI}, randn_bf16(b * s * c.HI * c.DI, 1)), put({b, s, c.DI}, randn_bf16(b * s * c.DI, 2)),
             Tensor::from_vector<float>({b, s, c.HI}, randn_bf16(b * s * c.HI, 3)).to(Device::cuda), &layout};
    in.q = put({b, s, c.H, c.Dqk}, randn_bf16(b * s * c.H * c.Dqk, 4));
    in.k = put({b, s, c.Hkv, c.Dqk}, randn_bf16(b * s * c.Hkv * c.Dqk, 5));
    in.scale = 0.3f;
    in.coeff = 0.5f;
    std::vector<float> rw(b * s);
    for (int64_t r = 0; r < b; ++r)
      for (int64_t t = 0; t < s; ++t) rw[r * s + t] = layout.is_padding(r, t) ? 0.f : 1.f;
    in.row_weight = Tensor::from_vector<float>({b, s}, rw).to(Device::cuda);
    if (c.give_lse) {  // the attention's lse, from the CPU kernel on the same values (Dqk 12: CPU only)
      const Tensor q = Tensor::from_vector<float>({b, s, c.H, c.Dqk}, cuda_check::host(in.q));
      const Tensor k = Tensor::from_vector<float>({b, s, c.Hkv, c.Dqk}, cuda_check::host(in.k));
      in.lse_c = attn_dense_fwd(AttnDenseInputs{q, k, k, &layout, {}, 0.3f}).lse.to(Device::cuda);
    }
    const int64_t pairs = dense_pairs(layout, b, s, 0);
    const double f = double(pairs) * (2.0 * c.H * c.Dqk + 6.0 * c.HI * c.DI);
    emu::ScopedWorkLog log;
    indexer_kl_dense(in);
    dense.add(c.name, log, f);
  }
  dense.finish();
}

}  // namespace
}  // namespace hmla
