// The DeepSeek-V4 side of the training-step bench (issue 46): the model FLOPs of a V4 stack
// (bench/model_flops.cpp) against counts written out here pair by pair, and the device check's
// 2-layer model (configs/bench_v4_flash2.json) against V4-Flash's widths and one GPU's memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "hmla/core/size_check.h"
#include "hmla/io/safetensors.h"
#include "hmla/model/model.h"
#include "hmla/model/v4_tables.h"
#include "train_bench.h"

namespace hmla::bench {
namespace {

// One causal document of s rows: window keys sum_t min(t + 1, W), entries of rate m
// sum_t min(floor((t + 1) / m), cap) (cap 0: all).
double window_keys(int64_t s, int64_t W) {
  double n = 0;
  for (int64_t t = 0; t < s; ++t) n += double(std::min(t + 1, W));
  return n;
}
double entries(int64_t s, int64_t m, int64_t cap) {
  double n = 0;
  for (int64_t t = 0; t < s; ++t) n += double(cap > 0 ? std::min((t + 1) / m, cap) : (t + 1) / m);
  return n;
}

// deepseek_v4_tiny: sliding, CSA (rate 4), HCA (rate 16), CSA; window 16, H 4, d 32, HI x DI 4 x 32,
// K 8, 8 experts of which 2 a token. Each mode's count minus its parameter part is the attention
// cores (3.5 x 2 (d + d) per pair and head; the forward alone in dsa_warmup) plus the CSA layers'
// indexers: the top-k's scores over every visible entry (dsa_sparse) and the KL over the candidates.
TEST(V4ModelFlops, CountTheWindowTheEntriesAndTheIndexerPairByPair) {
  ModelConfig c = load_model_config(HMLA_SOURCE_DIR "/configs/deepseek_v4_tiny.json");
  const int64_t s = 64, P = 100000, E = 1000, I = 300;
  const DocLayout one = layout_from_cu_seqlens(s, {{0, s}});
  const V4Config& v = c.v4;
  ASSERT_EQ(c.num_hidden_layers, 4);
  ASSERT_EQ(v.kind(1), V4Kind::csa);
  ASSERT_EQ(v.kind(2), V4Kind::hca);
  const double H = double(c.num_attention_heads), d = double(v.head_dim), T = double(s);
  const double HIDI = double(c.index_n_heads * c.index_head_dim);
  const double idle = double(c.num_hidden_layers) * double(c.moe.n_routed_experts - c.moe.num_experts_per_tok) * 3.0 *
                      double(c.moe.moe_intermediate_size) * double(c.hidden_size);
  const double backbone = double(P - E - I) - idle, per_pair = 2.0 * (d + d) * H;
  const double Wk = window_keys(s, v.sliding_window), e4 = entries(s, v.csa_rate, 0),
               e4k = entries(s, v.csa_rate, c.index_topk), e16 = entries(s, v.hca_rate, 0);
  ASSERT_LT(e4k, e4);  // the top-k binds
  auto flops = [&](LayerMode m) {
    set_all_modes(c, m);
    return model_flops(c, m, one, P, E, I);
  };
  EXPECT_DOUBLE_EQ(flops(LayerMode::mha) - 6.0 * backbone * T, 3.5 * per_pair * (4 * Wk + 2 * e4 + e16));
  EXPECT_DOUBLE_EQ(flops(LayerMode::dsa_sparse) - 6.0 * (backbone + double(I)) * T,
                   3.5 * per_pair * (4 * Wk + 2 * e4k + e16) + 2 * (2 * HIDI * e4 + (6 * HIDI + 2 * H * d) * e4k));
  EXPECT_DOUBLE_EQ(flops(LayerMode::dsa_warmup) - (2.0 * backbone + 6.0 * double(I)) * T,
                   per_pair * (4 * Wk + 2 * e4 + e16) + 2 * (6 * HIDI + 2 * H * d) * e4);
}

// The device check's V4 step (scripts/device-check, cuda_train_v4): V4-Flash's widths in two layers,
// one of each compressed kind, and fewer experts and a smaller vocabulary so that the training
// state (f32 weights, gradients and two moments, the bf16 compute copy) and the step's activations
// at s = 4096 fit an 80 GB H100.
TEST(V4BenchConfig, IsV4FlashWideAndFitsOneGpu) {
  auto read = [](const char* f) { return nlohmann::json::parse(io::read_file(std::string(HMLA_SOURCE_DIR) + f)); };
  const nlohmann::json flash = read("/configs/deepseek_v4_flash.json"), j = read("/configs/bench_v4_flash2.json");
  for (const char* k : {"hidden_size", "moe_intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                        "qk_rope_head_dim", "q_lora_rank", "o_groups", "o_lora_rank", "n_shared_experts",
                        "num_experts_per_tok", "scoring_func", "routed_scaling_factor", "swiglu_limit", "sliding_window",
                        "compress_rates", "index_n_heads", "index_head_dim", "index_topk", "hc_mult",
                        "hc_sinkhorn_iters", "hc_eps", "rope_theta", "compress_rope_theta", "rope_scaling"})
    EXPECT_EQ(j.at(k), flash.at(k)) << k;
  const ModelConfig c = parse_model_config(j, "bench_v4_flash2.json");
  ASSERT_EQ(c.num_hidden_layers, 2);
  EXPECT_EQ(c.v4.kind(0), V4Kind::csa);
  EXPECT_EQ(c.v4.kind(1), V4Kind::hca);
  EXPECT_EQ(c.form.num_nextn_predict_layers, 0);
  MemoryPlan plan;
  plan_parameters(plan, c, v4_indexer_layers(c), true, DType::bf16);
  plan_activations(plan, c, {"batch", 1}, {"seq_len", 4096}, true, DType::bf16);
  EXPECT_LT(double(plan.total()), 64.0 * (1 << 30)) << format_bytes(double(plan.total()));
  const int64_t n = table_numel(model_param_table(c, v4_indexer_layers(c)));
  EXPECT_GT(n, int64_t(1'500'000'000));
  EXPECT_LT(n, int64_t(3'000'000'000));
}

}  // namespace
}  // namespace hmla::bench
