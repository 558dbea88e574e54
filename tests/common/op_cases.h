// The op case tables (ggml's test-backend-ops, one table per op family): every backend in the build
// runs the same rows against the float64 oracles. The CPU suite (tests/cpu) runs every row with the
// f32 rule; the CUDA suites (the SIMT emulator's, label emu, and the device's, label gpu) and
// hmla_cuda_check run the rows the CUDA backend supports with the bf16 rule. Header-only and free
// of test-framework dependencies: hmla_cuda_check builds on the GPU machine from it.
#pragma once
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

namespace hmla::op_cases {

// Dense attention. Layout: end_rows when given, else cu_seqlens per row, else one causal document
// per row. q_row0 >= 0: the queries are rows [q_row0, s) only (a context-parallel shard).
struct AttnDenseCase {
  std::string name;
  int64_t b, s, H, Hkv, Dqk, Dv;
  std::vector<std::vector<int64_t>> cu = {};
  std::vector<int64_t> end_rows = {};  // [b * s]
  bool sink = false;
  bool v_from_k = false;  // v = the first Dv channels of k (latent MQA)
  int64_t q_row0 = -1;
};
inline void PrintTo(const AttnDenseCase& c, std::ostream* os) { *os << c.name; }

inline std::vector<AttnDenseCase> attn_dense() {
  std::vector<int64_t> mid_pad(40);  // docs [0,10), pad 10..14, [15,40)
  for (int64_t t = 0; t < 40; ++t) mid_pad[t] = t < 10 ? 10 : t < 15 ? 0 : 40;
  std::vector<int64_t> ones;
  for (int64_t i = 0; i <= 20; ++i) ones.push_back(i);
  return {
      {"one_doc", 1, 37, 2, 2, 16, 8},
      {"many_docs_tail_pad", 1, 300, 2, 2, 24, 16, {{0, 50, 51, 180, 260}}},
      {"one_token_docs", 1, 20, 2, 2, 16, 16, {ones}},
      {"padding_rows", 1, 40, 2, 2, 16, 16, {}, mid_pad},
      {"s_not_tile_multiple", 1, 333, 2, 2, 16, 16},
      {"long_docs_across_tiles", 1, 1100, 2, 2, 16, 8, {{0, 300, 301, 900, 1090}}},
      {"h1", 1, 50, 1, 1, 12, 12},
      {"gqa", 2, 70, 4, 2, 16, 16, {{0, 30, 70}, {0, 1, 65}}},
      {"mqa", 1, 90, 4, 1, 16, 8, {{0, 45, 80}}},
      {"dqk192_dv128", 1, 80, 2, 2, 192, 128, {{0, 33, 80}}},
      {"latent_576_512", 1, 70, 2, 1, 576, 512, {{0, 40, 64}}, {}, false, true},
      {"sink_one_doc", 1, 37, 2, 2, 16, 8, {}, {}, true},
      {"sink_docs_pad", 1, 300, 3, 1, 24, 16, {{0, 1, 100, 260}}, {}, true},
      {"sink_latent", 1, 70, 2, 1, 576, 512, {{0, 40, 64}}, {}, true, true},
      {"mha_128_one_doc", 1, 300, 2, 2, 128, 128},
      {"mha_192_128_docs_pad", 1, 333, 2, 2, 192, 128, {{0, 50, 51, 180, 300}}},
      {"gqa_128_b2", 2, 200, 4, 2, 128, 128, {{0, 70, 200}, {0, 1, 150}}},
      {"mqa_256_sink", 1, 260, 4, 1, 256, 256, {{0, 100, 230}}, {}, true},
      {"latent_576_512_sink", 1, 150, 2, 1, 576, 512, {{0, 64, 140}}, {}, true, true},
      {"mha_192_128_row_slice", 1, 256, 2, 2, 192, 128, {{0, 90, 256}}, {}, false, false, 100},
      {"gqa_row_slice_end_rows", 1, 40, 4, 2, 16, 16, {}, mid_pad, true, false, 12},
  };
}

// Sparse latent MQA: row t lists up to K distinct keys of [0, t] (-1 holes), then up to W window
// keys not already listed (sparse_table). empty_rows: rows t % 7 == 3 list nothing and rows
// t % 13 == 7 list window keys only (no candidate: lse_c = +inf).
struct AttnSparseCase {
  std::string name;
  int64_t b, s, H, Dqk, Dv, K, W;
  bool sink = false, empty_rows = false;
};
inline void PrintTo(const AttnSparseCase& c, std::ostream* os) { *os << c.name; }

inline std::vector<AttnSparseCase> attn_sparse() {
  return {
      {"topk_only", 1, 60, 4, 24, 16, 8, 0},
      {"window_sink_empty_rows", 2, 70, 4, 24, 16, 6, 3, true, true},
      {"latent_576_512", 1, 40, 2, 576, 512, 16, 4, true},
      {"h1_long_rows", 1, 90, 1, 16, 8, 64, 8, false, true},
      {"latent_h16", 1, 96, 16, 576, 512, 24, 4, false, true},
      {"latent_h64_b2_sink", 2, 48, 64, 576, 512, 16, 0, true, true},
      {"h128_sink", 1, 48, 128, 128, 128, 40, 8, true, true},
      {"h32_kw140_empty_rows", 1, 140, 32, 192, 160, 100, 40, true, true},  // compaction over 2 rounds
      {"k0_window_only", 1, 64, 16, 128, 128, 0, 12, false, true},
  };
}

// The indexer's selection on one causal document. select: the CUDA and CPU selections on the
// same given scores (exact ties planted) from query row q_row0 on; topk: scores + selection from
// qI, kI, w end to end, against the float64 reference.
struct IndexerSelectCase {
  std::string name;
  int64_t s, K, W, q_row0;
};
inline void PrintTo(const IndexerSelectCase& c, std::ostream* os) { *os << c.name; }
inline std::vector<IndexerSelectCase> indexer_select() {
  return {{"k64", 300, 64, 0, 0},
          {"k16_window_slice", 300, 16, 5, 100},
          {"k2048", 3000, 2048, 0, 0},
          {"k2048_window_slice", 3000, 2048, 64, 1000}};
}

struct IndexerTopkCase {
  std::string name;
  int64_t s, HI, DI, K, W;
};
inline void PrintTo(const IndexerTopkCase& c, std::ostream* os) { *os << c.name; }
inline std::vector<IndexerTopkCase> indexer_topk() {
  return {{"hi64_di128_k32_w4", 300, 64, 128, 32, 4}, {"hi16_di32_k256", 600, 16, 32, 256, 0}};
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
