// The emulator's work counter on the attention, sparse attention, compressed attention and indexer-KL kernels: for each
// row of their case tables (op_cases.h) the CUDA backend runs, the tensor-core FLOPs the kernels'
// mma.sync instructions issued (emulate.h, ScopedWorkLog) against the op's FLOPs by the
// FlashAttention convention:
//   attention forward: 2 (Dqk + Dv) per valid (query row, key) pair and head;
//   (compressed attention, DeepSeek-V4's core: d + d per pair, K = V, window keys and entries alike)
//   attention backward: 2.5 x the forward (S again, dP, dV, dQ, dK: 2 (3 Dqk + 2 Dv) >= 2.5 x
//     2 (Dqk + Dv) whenever Dqk >= Dv, true of every row);
//   the indexer KL (forward and backward in one op): per valid pair, the attention target's scores
//     once (2 H Dqk), the index scores once (2 HI DI) and the two gradient products dqI and dkI
//     (2 x 2 HI DI): 2 H Dqk + 6 HI DI.
// Every row must issue at least its op's count (below it the counter misses work or the kernel is
// not on the tensor cores); each table's total must stay within what its kernels issue today
// (ceiling), and is printed against the issue's bound of its minimum (target: met or not yet).
// The forwards also print their m16n8 tile floor, the least any kernel on mma.sync's 16 x 8 tiles
// issues for the row, and the dense backward that of any two-kernel backward on such tiles
// (asserted as lower bounds of what the kernels issue): where a table's floor is above the
// issue's bound, no such kernel meets it on that table.
// The bound is on a table's totals (issued over minimal, summed over its rows): the small rows,
// whose one mma tile of 16 rows and 8 keys is much of their work, weigh what they cost. The
// printed per-row ratios say where the work goes (docs/cuda.md keeps the figures).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attn_cuda_check.h"
#include "case_support.h"
#include "check_util.h"
#include "hmla/ops/attention.h"
#include "hmla/ops/compressed_attention.h"
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
  // floor_flops > 0: the least any kernel of the kind on m16n8 tiles issues for the row
  // (dense_tile_floor, dense_bwd_tile_floor); the kernels must issue at least it too, and the
  // total's floor says how much of the ratio is tiles.
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

// The least tensor-core work of a deterministic two-kernel backward (the dq kernel walking keys
// per query rows, the dK/dV kernel walking queries per keys, each computing S and dP) on m16n8
// tiles, per head: dq's 16-query groups cover their keys with 8-key tiles (S: Dqk in 16s, dP: Dv
// in 16s, dQ: Dqk in 8s), dK/dV's 16-key groups (keys from 0) cover the local queries that see
// them, [j, doc_end[j] - 1], with 8-query tiles (S^T, dP^T, dK, dV). What a kernel issues above it
// is recompute or coarser skipping; only a single backward kernel (dQ without a second S and dP)
// goes below it.
double dense_bwd_tile_floor(const DocLayout& layout, int64_t b, int64_t s, int64_t r0, int64_t Dqk, int64_t Dv) {
  const auto ds = layout.doc_start.to_vector<int32_t>(), de = layout.doc_end.to_vector<int32_t>();
  const double k16 = double((Dqk + 15) / 16 * 16), v16 = double((Dv + 15) / 16 * 16);
  const double k8 = double((Dqk + 7) / 8 * 8), v8 = double((Dv + 7) / 8 * 8);
  double dq_tiles = 0, dkdv_tiles = 0;
  for (int64_t bb = 0; bb < b; ++bb) {
    for (int64_t g0 = r0; g0 < s; g0 += 16) {
      int64_t lo = INT64_MAX, hi = -1;
      for (int64_t t = g0; t < std::min(s, g0 + 16); ++t)
        if (ds[bb * s + t] <= t) lo = std::min<int64_t>(lo, ds[bb * s + t]), hi = t;
      if (hi >= 0) dq_tiles += double((hi - lo + 8) / 8);
    }
    for (int64_t g0 = 0; g0 < s; g0 += 16) {
      int64_t lo = INT64_MAX, hi = -1;
      for (int64_t j = g0; j < std::min(s, g0 + 16); ++j) {
        const int64_t t0 = std::max(j, r0), t1 = de[bb * s + j] - 1;
        if (ds[bb * s + j] <= j && t0 <= t1) lo = std::min(lo, t0), hi = std::max(hi, t1);
      }
      if (hi >= 0) dkdv_tiles += double((hi - lo + 8) / 8);
    }
  }
  return 2.0 * 16 * 8 * (dq_tiles * (k16 + v16 + k8) + dkdv_tiles * (k16 + v16 + k8 + v8));
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
    bwd.add(c.name, log, 2.5 * f, double(c.H) * dense_bwd_tile_floor(layout, c.b, c.s, r0, c.Dqk, c.Dv));
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
    if (!cuda_backend()->supports(Op::attn_sparse_bwd, op_cases::params(c, DType::bf16, true))) continue;
    emu::ScopedWorkLog log;
    attn_sparse_bwd(in, sv, put({c.b, c.s, c.H, c.Dv}, randn_bf16(c.b * c.s * c.H * c.Dv, 4)));
    bwd.add(c.name, log, 2.5 * f);
  }
  fwd.finish();
  bwd.finish();
}

// DeepSeek-V4's attention core (attn_compressed) on one document of s rows: the window W and, at
// the compressor's rate m, dense mode (k = 0: every visible entry, HCA) or a top-k table of k
// slots per row (CSA: k distinct visible entries drawn at random, -1 past the visible count, as
// the indexer's own tables are). Attended pairs per row: its window keys and its entries.
struct CompressedWorkRow {
  std::string name;
  int64_t s, H, d, W, m, k;
};

void compressed_work(const std::vector<CompressedWorkRow>& rows, Tally& fwd, Tally& bwd) {
  for (const CompressedWorkRow& c : rows) {
    const DocLayout layout = layout_causal(1, c.s);
    const int64_t n_e = c.s / c.m;
    std::vector<int32_t> last(static_cast<size_t>(n_e)), doc(static_cast<size_t>(n_e), 0), idx;
    for (int64_t e = 0; e < n_e; ++e) last[size_t(e)] = int32_t((e + 1) * c.m - 1);
    std::vector<int64_t> keys(static_cast<size_t>(c.s));  // attended keys per row
    std::mt19937_64 rng(11);
    for (int64_t t = 0; t < c.s; ++t) {
      const int64_t vis = (t + 1) / c.m, win = std::min(c.W, t + 1);
      if (c.k == 0) {
        keys[size_t(t)] = win + vis;
        continue;
      }
      std::vector<int32_t> pick(static_cast<size_t>(vis));
      std::iota(pick.begin(), pick.end(), 0);
      std::shuffle(pick.begin(), pick.end(), rng);
      pick.resize(size_t(std::min(vis, c.k)), 0);
      keys[size_t(t)] = win + int64_t(pick.size());
      pick.resize(size_t(c.k), -1);
      idx.insert(idx.end(), pick.begin(), pick.end());
    }
    AttnCompressedInputs in;
    in.q = put({1, c.s, c.H, c.d}, randn_bf16(size_t(c.s * c.H * c.d), 1));
    in.kv = put({1, c.s, c.d}, randn_bf16(size_t(c.s * c.d), 2));
    in.ent = put({1, n_e, c.d}, randn_bf16(size_t(n_e * c.d), 3));
    in.ent_last = Tensor::from_vector<int32_t>({1, n_e}, last).to(Device::cuda);
    in.ent_doc = Tensor::from_vector<int32_t>({1, n_e}, doc).to(Device::cuda);
    if (c.k > 0) in.idx = Tensor::from_vector<int32_t>({1, c.s, c.k}, idx).to(Device::cuda);
    in.sink = Tensor::from_vector<float>({c.H}, randn_bf16(size_t(c.H), 4)).to(Device::cuda);
    in.layout = &layout;
    in.scale = 1.f / std::sqrt(float(c.d));
    in.window = c.W;
    ASSERT_EQ(cuda_backend()->plan(Op::attn_compressed_bwd, AttnCompressedParams{DType::bf16, 1, c.s, c.H, c.d, c.s, 0,
                                                                                  n_e, c.k})
                  .variant,
              Variant::mma)
        << c.name;
    int64_t pairs = 0;
    double tiles8 = 0;  // a row's keys in 8-key tiles: the m16n8 floor (heads in 16s, d in 16s)
    for (int64_t n : keys) pairs += n, tiles8 += double((n + 7) / 8);
    const double f = double(pairs) * double(c.H) * 2 * double(2 * c.d);
    const double h16 = double((c.H + 15) / 16 * 16), d16 = double((c.d + 15) / 16 * 16);
    AttnCompressedSaved sv;
    {
      emu::ScopedWorkLog log;
      sv = attn_compressed_fwd(in);
      fwd.add(c.name, log, f, tiles8 * 8 * h16 * 2 * (2 * d16));  // S and P V
    }
    emu::ScopedWorkLog log;
    attn_compressed_bwd(in, sv, put({1, c.s, c.H, c.d}, randn_bf16(size_t(c.s * c.H * c.d), 5)));
    bwd.add(c.name, log, 2.5 * f, tiles8 * 8 * h16 * 2 * (5 * d16));  // S, dP, dq, dS^T q, P^T dout
  }
}

// A small geometry in the default suite: 16 heads of 64, W 32, s 128, CSA's top-k and HCA's dense
// entries at rates 4 and 32.
TEST(WorkCounter, CompressedAttentionIssuesAtMostItsBoundOfTensorCoreWork) {
  Tally fwd{"compressed forward", 1.2, 1.11}, bwd{"compressed backward", 1.5, 1.18};
  compressed_work({{"csa_h16_d64_k16", 128, 16, 64, 32, 4, 16}, {"hca_h16_d64", 128, 16, 64, 32, 32, 0}}, fwd, bwd);
  fwd.finish();
  bwd.finish();
}

// DeepSeek-V4-Flash's geometry (H 64, d 512 of which 64 roped, W 128; CSA at rate 4 with a top-k
// table, HCA at rate 128 dense) at s = 256 and 512. index_topk is 512 there, more than the
// entries visible at these lengths (every one would be picked), so the table keeps 64 of them.
// Heavy (ctest -L heavy): minutes under the emulator on 2 cores.
TEST(WorkCounter, CompressedAttentionAtV4FlashGeometry) {
  Tally fwd{"compressed fwd V4-Flash", 1.2, 1.035}, bwd{"compressed bwd V4-Flash", 1.5, 1.055};
  compressed_work({{"csa_s256_k64", 256, 64, 512, 128, 4, 64},
                   {"hca_s256", 256, 64, 512, 128, 128, 0},
                   {"csa_s512_k64", 512, 64, 512, 128, 4, 64},
                   {"hca_s512", 512, 64, 512, 128, 128, 0}},
                  fwd, bwd);
  fwd.finish();
  bwd.finish();
}

// A table of K candidate slots (then W window slots, unused by the KL) per row of one document:
// min(K, t + 1) distinct keys of [0, t], a few slots left -1.
std::vector<int32_t> random_table(int64_t b, int64_t s, int64_t K, int64_t W, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> idx(b * s * (K + W), -1);
  for (int64_t r = 0; r < b * s; ++r) {
    std::vector<int32_t> keys(r % s + 1);
    std::iota(keys.begin(), keys.end(), 0);
    std::shuffle(keys.begin(), keys.end(), rng);
    for (int64_t i = 0; i < K && i < int64_t(keys.size()); ++i)
      if (rng() % 8) idx[r * (K + W) + i] = keys[i];
  }
  return idx;
}

// The KLs on bf16 inputs (the training step's) run on the tensor cores. The table's rows (Dqk 12
// padded to 16, HI 4 and H 4 padded to 16 heads in the sparse KL) and one row each of a real
// model's proportions, where tile padding no longer dominates: the dense KL's on one document
// (DeepSeek-V3.2's MHA warmup, H 128 x 192 against HI 64 x 128: a sixteenth of the heads, a third
// of the widths), the sparse KL's in the latent form dsa_sparse passes (H 128 x 576 against
// HI 64 x 128, so H Dqk = 9 HI DI: here H 32 x 288 against HI 16 x 64, top-k 64 of 256 rows) with
// lseC given, as the sparse forward saves it.
TEST(WorkCounter, TheIndexerKlsIssueAtMostTwiceTheirMinimalTensorCoreWork) {
  Tally dense{"dense indexer KL", 2.0, 1.92}, sparse{"sparse indexer KL", 2.0, 1.35};
  std::vector<op_cases::IndexerKlCase> rows = op_cases::indexer_kl();
  rows.push_back({"model_proportions", op_cases::Oracle::indexer_kl_ref, 1, 512, 4, 48, 8, 8, 64, false, true});
  rows.push_back({"latent_proportions", op_cases::Oracle::indexer_kl_ref, 1, 256, 16, 64, 32, 1, 288, true, true, 64, 0});
  for (const op_cases::IndexerKlCase& c : rows) {
    // The layout of the KL's emulated table (test_mixed_dtype_emu.cpp): documents, a one-token
    // one, a second batch row of one document; the models' rows are one document.
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
    const Tensor q = Tensor::from_vector<float>({b, s, c.H, c.Dqk}, cuda_check::host(in.q));
    const Tensor k = Tensor::from_vector<float>({b, s, c.Hkv, c.Dqk}, cuda_check::host(in.k));
    int64_t pairs = 0;
    if (c.sparse) {  // the table's rows: the indexer's own selection (CPU, same values); the model's: random
      std::vector<int32_t> idx;
      if (c.b == 1) {
        idx = random_table(b, s, c.K, c.W, 6);
      } else {
        idx = indexer_topk({Tensor::from_vector<float>({b, s, c.HI, c.DI}, cuda_check::host(in.sc.qI)),
                            Tensor::from_vector<float>({b, s, c.DI}, cuda_check::host(in.sc.kI)), in.sc.w.to(Device::cpu),
                            &layout},
                           c.K, c.W)
                  .to_vector<int32_t>();
      }
      for (int64_t r = 0; r < b * s; ++r)
        for (int64_t i = 0; i < c.K; ++i) pairs += idx[r * (c.K + c.W) + i] >= 0;
      in.topk = Tensor::from_vector<int32_t>({b, s, c.K + c.W}, idx).to(Device::cuda);
      in.K = c.K;
      // lseC as the sparse forward saves it; its values do not change the work (zeros: the
      // logits are O(1) here, so P stays finite).
      if (c.give_lse) in.lse_c = Tensor::zeros({b, c.H, s}, DType::f32, Device::cuda);
    } else {
      pairs = dense_pairs(layout, b, s, 0);
      // the attention's lse, from the CPU kernel on the same values (Dqk 12: CPU only)
      if (c.give_lse) in.lse_c = attn_dense_fwd(AttnDenseInputs{q, k, k, &layout, {}, 0.3f}).lse.to(Device::cuda);
    }
    const double f = double(pairs) * (2.0 * c.H * c.Dqk + 6.0 * c.HI * c.DI);
    emu::ScopedWorkLog log;
    if (c.sparse) {
      indexer_kl_sparse(in);
      sparse.add(c.name, log, f);
    } else {
      indexer_kl_dense(in);
      dense.add(c.name, log, f);
    }
  }
  dense.finish();
  sparse.finish();
}

}  // namespace
}  // namespace hmla
