// The op case tables (ggml's test-backend-ops, one table per op family), one mechanism for all:
// a row is data (a name, the shapes and flags, the oracle it is checked against), every backend
// of the build runs its rows of the same table through one runner per backend, and which rows a
// backend runs is what its supports() answers for the row's real params (case_support.h), never a
// filter in a harness. Counts come from the tables (::testing::ValuesIn). The CPU runners check
// with the f32 rule; the CUDA runners (the SIMT emulator's, label emu, the device's, label gpu,
// and hmla_cuda_check) with the bf16 rule. Header-only and free of test-framework dependencies:
// hmla_cuda_check builds on the GPU machine from it.
//
// A new row is one line in its family's table, e.g. {"gqa", Oracle::attn_dense_ref, 2, 70, 4, 2,
// 16, 16, {{0, 30, 70}, {0, 1, 65}}}; a new family is a row struct here, its params in
// case_support.h and a runner per backend. The nn and optimizer ops' table lives in
// tests/ops/test_nn_ops.cpp with its cases (rows, params and case functions together: an op of
// that family is one enumerator, one row, its params and its case there, one file).
#pragma once
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

namespace hmla::op_cases {

// The oracle a row is checked against: the float64 references of tests/oracles (ref::, the same
// code instantiated in f32 is the rule's naive arm), the nn oracles of tests/ops/test_nn_ops.cpp,
// or, for the CUDA selection, the CPU backend's selection on the same scores (bit for bit).
enum class Oracle {
  attn_dense_ref,      // ref::attn_dense_ref
  compress_ref,        // the compressor pooling's definition in float64 (cases_compress.h)
  attn_sparse_ref,     // ref::attn_sparse_ref
  indexer_select_cpu,  // the CPU backend's indexer_select on the same scores, exactly
  indexer_topk_ref,    // ref::indexer_scores_ref + ref::indexer_topk_ref (sets where gaps allow)
  indexer_kl_ref,      // ref::indexer_kl_ref
  gemm_ref,            // test_nn_ops.cpp: C = alpha op(A) op(B) + beta C0
  norm_ref,            // RMSNorm / LayerNorm forward and backward
  add_rmsnorm_ref,     // xs = x + x2, y = RMSNorm(xs) w; and the bits of add then rmsnorm_fwd
  rope_ref,            // the rotation, and the transposed map's round trip
  swiglu_ref,
  embedding_ref,       // rows gathered exactly, the backward's sums
  cross_entropy_ref,
  axpy_ref,            // out = a + alpha b; scale exact
  optim_ref,           // sum of squares, AdamW, Muon momentum and update
  bf16_rounding,       // round to nearest even, once, exactly
  moe_ref,             // the routing, dispatch and gathers exactly; route backward, combine, rowdot and the
                       // grouped products against float64 (test_moe_ops.cpp)
  moe_balance_ref,     // the loads and bias exactly, the balance loss against float64 (test_moe_balance.cpp)
  attn_compressed_ref, // op_cases::attn_compressed_ref (cases_attn_compressed.h): V4's window + entries + sink
  mhc_ref,             // tests/common/mhc_oracle.h: mHC's pre, post and head and their gradients in float64
  compressed_index_ref, // op_cases::compressed_index_ref (cases_compressed_index.h): the CSA indexer's scores and top-k
  csa_kl_ref,           // op_cases::csa_kl_ref (csa_kl_oracle.h): the CSA indexer's KL, full CSA denominator
};

inline const char* oracle_name(Oracle o) {
  switch (o) {
    case Oracle::attn_dense_ref: return "attn_dense_ref";
    case Oracle::compress_ref: return "compress_ref";
    case Oracle::attn_sparse_ref: return "attn_sparse_ref";
    case Oracle::indexer_select_cpu: return "indexer_select_cpu";
    case Oracle::indexer_topk_ref: return "indexer_topk_ref";
    case Oracle::indexer_kl_ref: return "indexer_kl_ref";
    case Oracle::gemm_ref: return "gemm_ref";
    case Oracle::norm_ref: return "norm_ref";
    case Oracle::add_rmsnorm_ref: return "add_rmsnorm_ref";
    case Oracle::rope_ref: return "rope_ref";
    case Oracle::swiglu_ref: return "swiglu_ref";
    case Oracle::embedding_ref: return "embedding_ref";
    case Oracle::cross_entropy_ref: return "cross_entropy_ref";
    case Oracle::axpy_ref: return "axpy_ref";
    case Oracle::optim_ref: return "optim_ref";
    case Oracle::bf16_rounding: return "bf16_rounding";
    case Oracle::moe_ref: return "moe_ref";
    case Oracle::moe_balance_ref: return "moe_balance_ref";
    case Oracle::attn_compressed_ref: return "attn_compressed_ref";
    case Oracle::mhc_ref: return "mhc_ref";
    case Oracle::compressed_index_ref: return "compressed_index_ref";
    case Oracle::csa_kl_ref: return "csa_kl_ref";
  }
  return "?";
}

// How gtest shows a row (--gtest_list_tests, failures): its name and its oracle.
template <class Row>
void print_row(const Row& c, std::ostream* os) {
  *os << c.name << " (oracle " << oracle_name(c.oracle) << ")";
}
// The test name of a row: its name (gtest's name generator for ValuesIn(table)).
struct RowName {
  template <class Info>
  std::string operator()(const Info& info) const {
    return info.param.name;
  }
};

// Dense attention. Layout: end_rows when given, else cu_seqlens per row, else one causal document
// per row. q_row0 >= 0: the queries are rows [q_row0, s) only (a context-parallel shard).
struct AttnDenseCase {
  std::string name;
  Oracle oracle;
  int64_t b, s, H, Hkv, Dqk, Dv;
  std::vector<std::vector<int64_t>> cu = {};
  std::vector<int64_t> end_rows = {};  // [b * s]
  bool sink = false;
  bool v_from_k = false;  // v = the first Dv channels of k (latent MQA)
  int64_t q_row0 = -1;
};
inline void PrintTo(const AttnDenseCase& c, std::ostream* os) { print_row(c, os); }

inline std::vector<AttnDenseCase> attn_dense() {
  std::vector<int64_t> mid_pad(40);  // docs [0,10), pad 10..14, [15,40)
  for (int64_t t = 0; t < 40; ++t) mid_pad[t] = t < 10 ? 10 : t < 15 ? 0 : 40;
  std::vector<int64_t> ones;
  for (int64_t i = 0; i <= 20; ++i) ones.push_back(i);
  return {
      {"one_doc", Oracle::attn_dense_ref, 1, 37, 2, 2, 16, 8},
      {"many_docs_tail_pad", Oracle::attn_dense_ref, 1, 300, 2, 2, 24, 16, {{0, 50, 51, 180, 260}}},
      {"one_token_docs", Oracle::attn_dense_ref, 1, 20, 2, 2, 16, 16, {ones}},
      {"padding_rows", Oracle::attn_dense_ref, 1, 40, 2, 2, 16, 16, {}, mid_pad},
      {"s_not_tile_multiple", Oracle::attn_dense_ref, 1, 333, 2, 2, 16, 16},
      // Two rows past a 128-row tile: the last query tile's only key tile ends one past its first
      // row's diagonal, so it is partial (masked), not full.
      {"two_rows_past_a_tile", Oracle::attn_dense_ref, 1, 130, 2, 2, 16, 8},
      {"long_docs_across_tiles", Oracle::attn_dense_ref, 1, 1100, 2, 2, 16, 8, {{0, 300, 301, 900, 1090}}},
      {"h1", Oracle::attn_dense_ref, 1, 50, 1, 1, 12, 12},
      {"gqa", Oracle::attn_dense_ref, 2, 70, 4, 2, 16, 16, {{0, 30, 70}, {0, 1, 65}}},
      {"mqa", Oracle::attn_dense_ref, 1, 90, 4, 1, 16, 8, {{0, 45, 80}}},
      {"dqk192_dv128", Oracle::attn_dense_ref, 1, 80, 2, 2, 192, 128, {{0, 33, 80}}},
      {"latent_576_512", Oracle::attn_dense_ref, 1, 70, 2, 1, 576, 512, {{0, 40, 64}}, {}, false, true},
      {"sink_one_doc", Oracle::attn_dense_ref, 1, 37, 2, 2, 16, 8, {}, {}, true},
      {"sink_docs_pad", Oracle::attn_dense_ref, 1, 300, 3, 1, 24, 16, {{0, 1, 100, 260}}, {}, true},
      {"sink_latent", Oracle::attn_dense_ref, 1, 70, 2, 1, 576, 512, {{0, 40, 64}}, {}, true, true},
      {"mha_128_one_doc", Oracle::attn_dense_ref, 1, 300, 2, 2, 128, 128},
      {"mha_192_128_docs_pad", Oracle::attn_dense_ref, 1, 333, 2, 2, 192, 128, {{0, 50, 51, 180, 300}}},
      {"gqa_128_b2", Oracle::attn_dense_ref, 2, 200, 4, 2, 128, 128, {{0, 70, 200}, {0, 1, 150}}},
      {"mqa_256_sink", Oracle::attn_dense_ref, 1, 260, 4, 1, 256, 256, {{0, 100, 230}}, {}, true},
      {"latent_576_512_sink", Oracle::attn_dense_ref, 1, 150, 2, 1, 576, 512, {{0, 64, 140}}, {}, true, true},
      {"mha_192_128_row_slice", Oracle::attn_dense_ref, 1, 256, 2, 2, 192, 128, {{0, 90, 256}}, {}, false, false, 100},
      {"gqa_row_slice_end_rows", Oracle::attn_dense_ref, 1, 40, 4, 2, 16, 16, {}, mid_pad, true, false, 12},
  };
}

// Sparse latent MQA: row t lists up to K distinct keys of [0, t] (-1 holes), then up to W window
// keys not already listed (sparse_table). empty_rows: rows t % 7 == 3 list nothing and rows
// t % 13 == 7 list window keys only (no candidate: lse_c = +inf).
struct AttnSparseCase {
  std::string name;
  Oracle oracle;
  int64_t b, s, H, Dqk, Dv, K, W;
  bool sink = false, empty_rows = false;
};
inline void PrintTo(const AttnSparseCase& c, std::ostream* os) { print_row(c, os); }

inline std::vector<AttnSparseCase> attn_sparse() {
  return {
      {"topk_only", Oracle::attn_sparse_ref, 1, 60, 4, 24, 16, 8, 0},
      {"window_sink_empty_rows", Oracle::attn_sparse_ref, 2, 70, 4, 24, 16, 6, 3, true, true},
      {"latent_576_512", Oracle::attn_sparse_ref, 1, 40, 2, 576, 512, 16, 4, true},
      {"h1_long_rows", Oracle::attn_sparse_ref, 1, 90, 1, 16, 8, 64, 8, false, true},
      {"latent_h16", Oracle::attn_sparse_ref, 1, 96, 16, 576, 512, 24, 4, false, true},
      {"latent_h64_b2_sink", Oracle::attn_sparse_ref, 2, 48, 64, 576, 512, 16, 0, true, true},
      {"h128_sink", Oracle::attn_sparse_ref, 1, 48, 128, 128, 128, 40, 8, true, true},
      // compaction over 2 rounds
      {"h32_kw140_empty_rows", Oracle::attn_sparse_ref, 1, 140, 32, 192, 160, 100, 40, true, true},
      {"k0_window_only", Oracle::attn_sparse_ref, 1, 64, 16, 128, 128, 0, 12, false, true},
  };
}

// The indexer's selection on kSelectBatch rows of s (two documents and tail padding, then one
// document). select: the CUDA and CPU selections on the same given scores (exact ties planted)
// from query row q_row0 on; topk: scores + selection from qI, kI, w end to end, against the
// float64 reference.
inline constexpr int64_t kSelectBatch = 2;
struct IndexerSelectCase {
  std::string name;
  Oracle oracle;
  int64_t s, K, W, q_row0;
};
inline void PrintTo(const IndexerSelectCase& c, std::ostream* os) { print_row(c, os); }
inline std::vector<IndexerSelectCase> indexer_select() {
  return {{"k64", Oracle::indexer_select_cpu, 300, 64, 0, 0},
          {"k16_window_slice", Oracle::indexer_select_cpu, 300, 16, 5, 100},
          {"k2048", Oracle::indexer_select_cpu, 3000, 2048, 0, 0},
          {"k2048_window_slice", Oracle::indexer_select_cpu, 3000, 2048, 64, 1000}};
}

struct IndexerTopkCase {
  std::string name;
  Oracle oracle;
  int64_t s, HI, DI, K, W;
};
inline void PrintTo(const IndexerTopkCase& c, std::ostream* os) { print_row(c, os); }
inline std::vector<IndexerTopkCase> indexer_topk() {
  return {{"hi64_di128_k32_w4", Oracle::indexer_topk_ref, 300, 64, 128, 32, 4},
          {"hi16_di32_k256", Oracle::indexer_topk_ref, 600, 16, 32, 256, 0}};
}

// The indexer's KL on the problem b x s with HI index heads of width DI against H attention heads
// (Hkv kv heads, width Dqk); sparse: over the top-K + W selection, else over every key. give_lse:
// the attention's lse_c handed in, else computed.
struct IndexerKlCase {
  std::string name;
  Oracle oracle;
  int64_t b, s, HI, DI, H, Hkv, Dqk;
  bool sparse, give_lse;
  int64_t K = 0, W = 0;     // sparse only
  bool bf16_inputs = false;  // qI, kI, q, k in bf16 (CUDA's tensor-core KLs), else f32
};
inline void PrintTo(const IndexerKlCase& c, std::ostream* os) { print_row(c, os); }
inline std::vector<IndexerKlCase> indexer_kl() {
  return {{"dense_lse_given", Oracle::indexer_kl_ref, 2, 150, 4, 16, 4, 4, 12, false, true},
          {"dense_lse_computed_gqa", Oracle::indexer_kl_ref, 2, 150, 4, 16, 4, 2, 12, false, false},
          {"sparse_mqa", Oracle::indexer_kl_ref, 2, 150, 4, 16, 4, 1, 12, true, false, 20, 4},
          {"sparse_mha", Oracle::indexer_kl_ref, 2, 150, 4, 16, 4, 4, 12, true, false, 20, 4}};
}

// The case's [b, s, K + W] index table, the same on every backend for a seed.
inline std::vector<int32_t> sparse_table(const AttnSparseCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t KW = c.K + c.W;
  std::vector<int32_t> idx(c.b * c.s * KW, -1);
  for (int64_t r = 0; r < c.b * c.s; ++r) {
    const int64_t t = r % c.s;
    if (c.empty_rows && t % 7 == 3) continue;
    const bool window_only = c.empty_rows && t % 13 == 7;
    std::vector<int32_t> keys(t + 1);
    std::iota(keys.begin(), keys.end(), 0);
    std::shuffle(keys.begin(), keys.end(), rng);
    int64_t n = 0;
    for (int64_t i = 0; i < c.K && n < int64_t(keys.size()) && !window_only; ++i)
      if (rng() % 5) idx[r * KW + i] = keys[n++];
    for (int64_t i = 0; i < c.W && n < int64_t(keys.size()); ++i) idx[r * KW + c.K + i] = keys[n++];
  }
  return idx;
}

}  // namespace hmla::op_cases
