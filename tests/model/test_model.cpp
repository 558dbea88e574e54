// The whole model: parameter table and arena, loading, and gradients against finite differences
// of the LM loss along each tensor's own gradient direction.
#include <gtest/gtest.h>

#include <cmath>

#include "hmla/model/indexer.h"
#include "hmla/model/model.h"
#include "testing.h"

namespace hmla {
namespace {

ModelConfig tiny(const std::vector<std::string>& modes, bool tie = false) {
  nlohmann::json j{{"hidden_size", 32},    {"num_attention_heads", 2}, {"num_hidden_layers", int(modes.size())},
                   {"q_lora_rank", 16},    {"kv_lora_rank", 16},       {"qk_nope_head_dim", 8},
                   {"qk_rope_head_dim", 4}, {"v_head_dim", 8},         {"vocab_size", 40},
                   {"intermediate_size", 48}, {"index_n_heads", 2},    {"index_head_dim", 8},
                   {"index_topk", 4},      {"hmla_layer_modes", modes}, {"tie_word_embeddings", tie},
                   {"initializer_range", 0.2}, {"max_position_embeddings", 64}};
  return parse_model_config(j, "tiny");
}

Batch batch(int64_t b, int64_t s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids(b * s);
  for (auto& x : ids) x = int32_t(1 + rng() % 39);
  ids[5] = 0;  // a pad token inside a document
  return {Tensor::from_vector<int32_t>({b, s}, ids), layout_from_cu_seqlens(s, std::vector<std::vector<int64_t>>(b, {0, 9, 10, s - 2}))};
}

TEST(Model, TableArenaAndMoeRefusal) {
  ModelConfig c = tiny({"mha", "dsa_warmup"});
  Model m = build_model(c, {false, true});
  EXPECT_EQ(m.arena.numel(), table_numel(m.table));
  EXPECT_EQ(m.params.at("model.layers.1.self_attn.indexer.wk.weight").shape(), Shape({8, 32}));
  EXPECT_FALSE(m.params.count("model.layers.0.self_attn.indexer.wk.weight"));
  EXPECT_THROW(build_model(c, {false, false}), ConfigError);  // dsa layer without indexer
  nlohmann::json j = model_config_to_json(c);
  j["mlp_layer_types"] = {"dense", "sparse"};
  EXPECT_THROW(build_model(parse_model_config(j, "moe"), {false, true}), ConfigError);
}

TEST(Model, GradientsMatchFiniteDifferences) {
  for (bool tie : {false, true}) {
    ModelConfig c = tiny({"mha", "mqa_full_causal"}, tie);
    Model m = build_model(c, {false, false});
    init_model(m, 3);
    Batch bt = batch(2, 24, 4);
    Tensor garena = Tensor::zeros({m.arena.numel()}, DType::f32);
    io::TensorMap grads = arena_views(m.table, garena);
    StepStats st = model_step(m, bt, {}, grads);
    EXPECT_GT(st.lm_loss, 3.0);
    auto loss = [&] {
      Tensor scratch = Tensor::zeros({m.arena.numel()}, DType::f32);
      io::TensorMap g = arena_views(m.table, scratch);
      return model_step(m, bt, {}, g).lm_loss;
    };
    for (const ParamSpec& p : m.table) {
      float* w = m.params.at(p.name).data<float>();
      const float* g = grads.at(p.name).data<float>();
      const int64_t n = shape_numel(p.shape);
      double norm = 0;
      for (int64_t i = 0; i < n; ++i) norm += double(g[i]) * g[i];
      norm = std::sqrt(norm);
      if (norm < 1e-6) continue;
      const double eps = 2e-2;  // along g / |g|: the slope must be |g|
      std::vector<float> w0(w, w + n);
      for (int64_t i = 0; i < n; ++i) w[i] = w0[i] + float(eps * g[i] / norm);
      const double lp = loss();
      for (int64_t i = 0; i < n; ++i) w[i] = w0[i] - float(eps * g[i] / norm);
      const double lm = loss();
      std::copy(w0.begin(), w0.end(), w);
      EXPECT_NEAR((lp - lm) / (2 * eps), norm, 0.02 * norm + 2e-4) << p.name << (tie ? " (tied)" : "");
    }
  }
}

TEST(Model, LoadRoundTripAndErrors) {
  ModelConfig c = tiny({"mha", "dsa_sparse"});
  Model a = build_model(c, {false, true}), b = build_model(c, {false, true});
  init_model(a, 1);
  load_into_model(b, a.params, "a");
  EXPECT_EQ(0, std::memcmp(a.arena.raw_data(), b.arena.raw_data(), a.arena.nbytes()));
  io::TensorMap missing = a.params;
  missing.erase("model.norm.weight");
  EXPECT_THROW(load_into_model(b, missing, "ckpt"), IoError);
  io::TensorMap bad = a.params;
  bad["model.norm.weight"] = Tensor::zeros({3}, DType::f32);
  EXPECT_THROW(load_into_model(b, bad, "ckpt"), IoError);
  // The indexer may be allowed to be missing (entering dsa_warmup from a phase-1 checkpoint).
  io::TensorMap no_idx;
  for (auto& [n, t] : a.params)
    if (n.find("indexer.") == std::string::npos) no_idx[n] = t;
  std::vector<std::string> idx_names;
  for (auto& p : b.table)
    if (p.name.find("indexer.") != std::string::npos) idx_names.push_back(p.name);
  EXPECT_NO_THROW(load_into_model(b, no_idx, "ckpt", idx_names));
}

TEST(Model, DsaStepsRunAndIndexerOnlySkipsTheBackbone) {
  ModelConfig c = tiny({"dsa_warmup", "dsa_sparse"});
  Model m = build_model(c, {true, true});
  init_model(m, 5);
  Batch bt = batch(1, 30, 6);
  Tensor ga = Tensor::zeros({m.arena.numel()}, DType::f32), gb = Tensor::zeros({m.arena.numel()}, DType::f32);
  io::TensorMap full = arena_views(m.table, ga), only = arena_views(m.table, gb);
  StepStats a = model_step(m, bt, {}, full);
  StepOptions o;
  o.backbone = false;
  StepStats b = model_step(m, bt, o, only);
  EXPECT_GT(a.indexer_kl, 0.0);
  EXPECT_EQ(a.indexer_kl, b.indexer_kl);
  for (const ParamSpec& p : m.table) {
    const Tensor& x = only.at(p.name);
    double sum = 0;
    for (int64_t i = 0; i < x.numel(); ++i) sum += std::abs(x.data<float>()[i]);
    if (p.name.find("indexer.") != std::string::npos)
      EXPECT_EQ(0, std::memcmp(x.raw_data(), full.at(p.name).raw_data(), x.nbytes())) << p.name;
    else
      EXPECT_EQ(sum, 0.0) << p.name;
  }
}

// Recomputing the attention core changes no bit of any gradient, the indexers' included.
TEST(Model, RecomputationIsBitIdentical) {
  ModelConfig c = tiny({"dsa_warmup", "dsa_sparse"});
  Model m = build_model(c, {true, true});
  init_model(m, 8);
  Batch bt = batch(2, 20, 9);
  Tensor ga = Tensor::zeros({m.arena.numel()}, DType::f32), gb = Tensor::zeros({m.arena.numel()}, DType::f32);
  io::TensorMap a = arena_views(m.table, ga), b = arena_views(m.table, gb);
  StepOptions o;
  StepStats sa = model_step(m, bt, o, a);
  o.recompute_attention = true;
  StepStats sb = model_step(m, bt, o, b);
  EXPECT_EQ(sa.lm_loss, sb.lm_loss);
  EXPECT_EQ(sa.indexer_kl, sb.indexer_kl);
  EXPECT_EQ(0, std::memcmp(ga.raw_data(), gb.raw_data(), ga.nbytes()));
}

}  // namespace
}  // namespace hmla
