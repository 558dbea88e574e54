// GLM-5 (model_type glm_moe_dsa) and IndexShare (DESIGN.md section 9, docs/indexer.md): the
// config's indexer_types as transformers 5.24's GlmMoeDsaConfig reads them, and its errors; a
// "shared" layer has no indexer tensors (table, memory plan, checkpoints); in dsa_sparse it attends
// over its source layer's table; in dsa_warmup it runs the dense core; only full layers' indexers
// train, each from its own single-layer KL (Megatron-LM's definition); decoding shares tables too.
// The logits and tables against transformers: tests/hf (the "glm" fixture).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <random>

#include "hmla/model/decode.h"
#include "hmla/model/indexer.h"
#include "hmla/model/model.h"
#include "testing.h"
#include "tiny_config.h"

namespace hmla {
namespace {

using nlohmann::json;

json glm_json(const std::vector<std::string>& modes, const std::vector<std::string>& types) {
  testing::TinyConfig t;
  t.modes = modes;
  json j = testing::tiny_config_json(t);
  j["model_type"] = "glm_moe_dsa";
  j["indexer_types"] = types;
  j["first_k_dense_replace"] = int(modes.size());  // dense MLPs: the attention is what is tested here
  return j;
}

std::string config_error(const json& j) {
  try {
    parse_model_config(j, "cfg");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "accepted";
}

std::vector<std::string> types_of(json j) { return parse_model_config(j, "cfg").indexer_types; }

// ---- config --------------------------------------------------------------------------------------

TEST(IndexShareConfig, IndexerTypesAsTransformersReadsThem) {
  json j = glm_json(std::vector<std::string>(8, "mha"), {});
  j.erase("indexer_types");
  const std::vector<std::string> F8(8, "full");
  EXPECT_EQ(types_of(j), F8);  // index_topk_freq absent: 1, every layer full
  j["index_topk_freq"] = 4, j["index_skip_topk_offset"] = 3;  // GLM-5.2's layout
  EXPECT_EQ(types_of(j), std::vector<std::string>({"full", "full", "full", "shared", "shared", "shared", "full", "shared"}));
  j.erase("index_skip_topk_offset");  // transformers' default offset is 2 (Megatron-LM's is 0, read as 1)
  j["index_topk_freq"] = 2;
  EXPECT_EQ(types_of(j), std::vector<std::string>({"full", "full", "shared", "full", "shared", "full", "shared", "full"}));
  j["index_topk_freq"] = 0;  // below 1: read as 1
  EXPECT_EQ(types_of(j), F8);
  j["index_topk_pattern"] = "FSSFFSFS";  // wins over the frequency
  EXPECT_EQ(types_of(j), std::vector<std::string>({"full", "shared", "shared", "full", "full", "shared", "full", "shared"}));
  j["indexer_types"] = F8;  // wins over both
  EXPECT_EQ(types_of(j), F8);

  // GlmMoeDsaConfig's own defaults where DeepseekV32Config's differ; the indexer's RoPE layout.
  json m = glm_json({"mha", "mha"}, {"full", "shared"});
  m["first_k_dense_replace"] = 1, m["n_routed_experts"] = 16;
  ModelConfig c = parse_model_config(m, "cfg");
  EXPECT_EQ(c.family, ModelFamily::glm_moe_dsa);
  EXPECT_TRUE(c.indexer_rope_interleaved());
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.moe.n_group, 1);
  EXPECT_EQ(c.moe.topk_group, 1);
  EXPECT_TRUE(c.indexer_shared(1));
  EXPECT_EQ(c.indexer_source(1), 0);
  m["model_type"] = "deepseek_v32";  // DeepseekV32Config has no indexer_types: every layer full
  c = parse_model_config(m, "cfg");
  EXPECT_FALSE(c.indexer_rope_interleaved());
  EXPECT_TRUE(c.indexer_types.empty());
  EXPECT_FALSE(c.indexer_shared(1));
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.moe.n_group, 8);

  // Written back as read (model_type and the per-layer list transformers writes) and read again.
  c = parse_model_config(glm_json({"mha", "mha", "mha"}, {"full", "shared", "full"}), "cfg");
  const json w = model_config_to_json(c);
  EXPECT_EQ(w["model_type"], "glm_moe_dsa");
  EXPECT_EQ(w["indexer_types"], json({"full", "shared", "full"}));
  EXPECT_EQ(parse_model_config(w, "written").indexer_types, c.indexer_types);
  EXPECT_EQ(model_config_to_json(parse_model_config(glm_json({"mha"}, {"full"}), "cfg"))["model_type"], "glm_moe_dsa");
}

TEST(IndexShareConfig, BadIndexerTypesAreOneLineErrorsNamingTheField) {
  const std::vector<std::pair<json, std::string>> cases{
      {glm_json({"mha", "mha"}, {"shared", "full"}), "cfg: indexer_types[0] = 'shared': a shared layer reuses"},
      {glm_json({"mha", "mha"}, {"full", "half"}), "cfg: indexer_types[1] = 'half': use \"full\" or \"shared\""},
      {glm_json({"mha", "mha"}, {"full"}), "cfg: indexer_types has 1 entries for num_hidden_layers = 2"},
      {glm_json({"mha", "mha"}, {"full", "shared", "full"}), "cfg: indexer_types has 3 entries"},
      // a shared layer in dsa_sparse needs its source to select in the same forward
      {glm_json({"mha", "dsa_sparse"}, {"full", "shared"}),
       "cfg: layer 1 is 'shared' in indexer_types and runs dsa_sparse over the top-k of layer 0, which runs mha"},
  };
  for (const auto& [j, needle] : cases) {
    const std::string e = config_error(j);
    EXPECT_NE(e.find(needle), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  json j = glm_json({"mha", "mha"}, {});
  j["indexer_types"] = "full";
  EXPECT_NE(config_error(j).find("cfg: indexer_types must be a list of strings"), std::string::npos) << config_error(j);
  j.erase("indexer_types");
  j["index_topk_freq"] = 2, j["index_skip_topk_offset"] = 0;  // transformers: layer 0 shared
  EXPECT_NE(config_error(j).find("indexer_types[0] = 'shared'"), std::string::npos) << config_error(j);
  j["index_skip_topk_offset"] = -1;
  EXPECT_NE(config_error(j).find("cfg: index_skip_topk_offset = -1"), std::string::npos) << config_error(j);
  j.erase("index_skip_topk_offset");
  j["index_topk_pattern"] = "FX";
  EXPECT_NE(config_error(j).find("index_topk_pattern holds 'X'"), std::string::npos) << config_error(j);
  j = glm_json({"mha"}, {"full"});
  j["model_type"] = "llama";
  EXPECT_NE(config_error(j).find("cfg: model_type = \"llama\": hmla reads"), std::string::npos) << config_error(j);
  // A shared layer in dsa_warmup runs the dense core and needs nothing from its source.
  EXPECT_EQ(config_error(glm_json({"mha", "dsa_warmup"}, {"full", "shared"})), "accepted");
}

// GLM-5's geometry (DESIGN.md section 2: Dn 192, Dv 256, HI 32, Rq 2048) is expressible: its
// config (transformers' GlmMoeDsaConfig defaults, GLM-5.2's IndexShare layout) parses, and the
// parameter plan counts what the layers hold, summed here by hand from the shapes of section 2.
TEST(IndexShareConfig, Glm5GeometryIsExpressible) {
  const int64_t hid = 6144, H = 64, Rq = 2048, Rkv = 512, Dn = 192, Dr = 64, Dv = 256, HI = 32, DI = 128;
  const int64_t V = 154880, I = 12288, Im = 2048, E = 256, layers = 78, dense = 3;
  const json j{{"model_type", "glm_moe_dsa"}, {"hidden_size", hid}, {"num_attention_heads", H},
               {"num_hidden_layers", layers}, {"q_lora_rank", Rq}, {"kv_lora_rank", Rkv}, {"qk_nope_head_dim", Dn},
               {"qk_rope_head_dim", Dr}, {"v_head_dim", Dv}, {"index_n_heads", HI}, {"index_head_dim", DI},
               {"index_topk", 2048}, {"vocab_size", V}, {"intermediate_size", I}, {"moe_intermediate_size", Im},
               {"n_routed_experts", E}, {"n_shared_experts", 1}, {"num_experts_per_tok", 8},
               {"first_k_dense_replace", dense}, {"index_topk_freq", 4}, {"index_skip_topk_offset", 3},
               {"max_position_embeddings", 202752}};
  const ModelConfig c = parse_model_config(j, "glm5");
  int64_t full = 0;
  for (int64_t L = 0; L < layers; ++L) full += !c.indexer_shared(L);
  EXPECT_EQ(full, 3 + 18);  // layers 0-2, then 6, 10, ..., 74
  EXPECT_EQ(c.layer_modes[77], LayerMode::dsa_sparse);
  const int64_t attn = Rq * hid + Rq + H * (Dn + Dr) * Rq + (Rkv + Dr) * hid + Rkv + H * (Dn + Dv) * Rkv + hid * H * Dv;
  const int64_t indexer = HI * DI * Rq + DI * hid + 2 * DI + HI * hid;
  const int64_t moe = E * hid + E + E * 3 * Im * hid + 3 * Im * hid;
  const int64_t want = 2 * V * hid + hid + layers * (attn + 2 * hid) + full * indexer + dense * 3 * I * hid +
                       (layers - dense) * moe;
  MemoryPlan plan;
  plan_parameters(plan, c, std::vector<bool>(layers, true), false, DType::f32);
  EXPECT_EQ(plan.total(), 4 * want);
  std::printf("GLM-5: %.1fB parameters without the MTP layer\n", double(want) / 1e9);
}

// ---- the model -----------------------------------------------------------------------------------

Batch batch(int64_t b, int64_t s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids(b * s);
  for (auto& x : ids) x = int32_t(1 + rng() % 39);
  return {Tensor::from_vector<int32_t>({b, s}, ids), layout_from_cu_seqlens(s, std::vector<std::vector<int64_t>>(b, {0, 9, s}))};
}

const std::vector<std::string> kTypes{"full", "shared", "shared", "full"};

Model glm_model(const std::string& mode, uint64_t seed, std::vector<std::string> types = kTypes) {
  const ModelConfig c = parse_model_config(glm_json(std::vector<std::string>(types.size(), mode), types), "glm");
  Model m = build_model(c, std::vector<bool>(types.size(), true));  // shared layers get none anyway
  init_model(m, seed);
  return m;
}

bool has(const Model& m, const std::string& name) {
  for (const ParamSpec& p : m.table)
    if (p.name == name) return true;
  return false;
}

TEST(IndexShareModel, SharedLayersHaveNoIndexerTensors) {
  const Model m = glm_model("dsa_sparse", 1);
  for (int64_t L = 0; L < 4; ++L)
    EXPECT_EQ(has(m, layer_prefix(L) + "self_attn.indexer.wk.weight"), kTypes[L] == "full") << L;
  EXPECT_EQ(m.has_indexer, std::vector<bool>({true, false, false, true}));
  // The memory plan counts the table (parameters, gradients, moments) ...
  MemoryPlan plan;
  plan_parameters(plan, m.cfg, std::vector<bool>(4, true), true, DType::f32);
  EXPECT_EQ(plan.total(), 3 * 4 * m.arena.numel());
  // ... and a shared layer's activations without an indexer's queries or a table of its own.
  const Model full = glm_model("dsa_sparse", 1, {"full", "full", "full", "full"});
  MemoryPlan shared_act, full_act;
  plan_activations(shared_act, m.cfg, {"b", 2}, {"s", 24}, true, DType::f32);
  plan_activations(full_act, full.cfg, {"b", 2}, {"s", 24}, true, DType::f32);
  const Model dense = glm_model("mqa_full_causal", 1);
  MemoryPlan dense_act;
  plan_activations(dense_act, dense.cfg, {"b", 2}, {"s", 24}, true, DType::f32);
  // Every dsa_sparse layer keeps its core's lse_c [b, H, s] f32 (the KL's lseC); only a full layer
  // its indexer's state and table.
  const int64_t lse_c = 2 * m.cfg.num_attention_heads * 24 * 4;
  const int64_t per_indexer = (full_act.total() - dense_act.total() - 4 * lse_c) / 4;
  EXPECT_GT(per_indexer, 0);
  EXPECT_EQ(shared_act.total(), dense_act.total() + 4 * lse_c + 2 * per_indexer);
}

TEST(IndexShareModel, CheckpointsHoldTheFullLayersIndexersOnly) {
  const Model m = glm_model("dsa_sparse", 2);
  Model into = glm_model("dsa_sparse", 3);
  load_into_model(into, m.params, "ck");  // exactly the table: loads
  EXPECT_EQ(into.arena.to_vector<float>(), m.arena.to_vector<float>());
  // A shared layer's indexer tensor is refused, by name.
  io::TensorMap extra = m.params;
  extra["model.layers.2.self_attn.indexer.wk.weight"] = m.params.at("model.layers.0.self_attn.indexer.wk.weight");
  try {
    load_into_model(into, extra, "ck");
    ADD_FAILURE() << "accepted";
  } catch (const IoError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("ck: tensor 'model.layers.2.self_attn.indexer.wk.weight': layer 2 is 'shared' in "
                       "indexer_types (it reuses layer 0's top-k) and has no indexer"),
              std::string::npos)
        << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos);
  }
  // A full layer without its indexer cannot run a dsa mode (entering dsa_warmup initialises it:
  // the trainer's rule, DESIGN.md section 2) ...
  EXPECT_THROW(build_model(m.cfg, {false, false, false, true}), ConfigError);
  // ... and a checkpoint that lacks one for a model that has it is refused, not re-initialised.
  io::TensorMap lacking = m.params;
  lacking.erase("model.layers.3.self_attn.indexer.wq_b.weight");
  EXPECT_THROW(load_into_model(into, lacking, "ck"), IoError);
}

TEST(IndexShareModel, SharedLayersAttendOverTheirSourcesTable) {
  const Model m = glm_model("dsa_sparse", 4);
  const Batch bt = batch(2, 24, 5);  // s > index_topk: the selection decides the logits
  std::vector<Tensor> topk;
  const Tensor logits = model_logits(m, bt, &topk);
  ASSERT_EQ(topk.size(), 4u);
  EXPECT_EQ(topk[1].to_vector<int32_t>(), topk[0].to_vector<int32_t>());
  EXPECT_EQ(topk[2].to_vector<int32_t>(), topk[0].to_vector<int32_t>());
  EXPECT_NE(topk[3].to_vector<int32_t>(), topk[0].to_vector<int32_t>());  // its own indexer
  // The shared layers' tables matter: with them dense (mqa_full_causal) the logits differ.
  const std::vector<std::string> modes{"dsa_sparse", "mqa_full_causal", "mqa_full_causal", "dsa_sparse"};
  Model dense = build_model(parse_model_config(glm_json(modes, kTypes), "glm"), m.has_indexer);
  load_into_model(dense, m.params, "m");
  const std::vector<float> a = logits.to_vector<float>(), b = model_logits(dense, bt).to_vector<float>();
  double diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::abs(double(a[i]) - b[i]));
  EXPECT_GT(diff, 1e-3);
}

// Each full layer's indexer learns from its own single-layer KL (Megatron-LM: a layer that reuses
// a table computes no indexer loss and adds nothing to its source's), so layer 0's indexer
// gradient in F,S is bit-identical to a one-layer model's (same weights, same inputs), and the
// logged KL is the mean over the layers that compute one: here layer 0's alone.
TEST(IndexShareModel, OnlyFullLayersTrainAndTheirKlIsTheirOwn) {
  for (const std::string mode : {"dsa_sparse", "dsa_warmup"}) {
    const Model two = glm_model(mode, 6, {"full", "shared"});
    Model one = glm_model(mode, 7, {"full"});
    io::TensorMap first;
    for (const ParamSpec& p : one.table) first[p.name] = two.params.at(p.name);
    load_into_model(one, first, "layer 0");
    const Batch bt = batch(2, 24, 8);
    StepOptions opt;
    opt.backbone = mode == "dsa_sparse";  // dsa_warmup: train_indexer_only
    auto step = [&](const Model& m, Tensor& garena) {
      garena = Tensor::zeros({m.arena.numel()}, DType::f32);
      io::TensorMap g = arena_views(m.table, garena);
      const StepStats st = model_step(m, bt, opt, g);
      return std::pair{st, g};
    };
    Tensor ga, gb;
    const auto [s2, g2] = step(two, ga);
    const auto [s1, g1] = step(one, gb);
    EXPECT_GT(s1.indexer_kl, 0) << mode;
    EXPECT_EQ(s2.indexer_kl, s1.indexer_kl) << mode;
    for (const ParamSpec& p : indexer_param_table(two.cfg)) {
      const std::string n = "model.layers.0.self_attn." + p.name;
      EXPECT_EQ(g2.at(n).to_vector<float>(), g1.at(n).to_vector<float>()) << mode << " " << n;
    }
    if (mode == "dsa_warmup") {  // nothing but the indexer moves
      for (const ParamSpec& p : two.table) {
        if (p.name.find(".indexer.") != std::string::npos) continue;
        for (float v : g2.at(p.name).to_vector<float>()) ASSERT_EQ(v, 0.f) << p.name;
      }
    }
  }
}

// dsa_warmup runs phase 1's attention core in every layer, shared ones included: its logits are
// bit-identical to mha's on the same weights.
TEST(IndexShareModel, WarmupIsMhaInSharedLayersToo) {
  const Model warm = glm_model("dsa_warmup", 9);
  Model mha = build_model(parse_model_config(glm_json(std::vector<std::string>(4, "mha"), kTypes), "glm"),
                          std::vector<bool>(4, false));
  io::TensorMap backbone;
  for (const ParamSpec& p : mha.table) backbone[p.name] = warm.params.at(p.name);
  load_into_model(mha, backbone, "backbone");
  const Batch bt = batch(2, 24, 10);
  EXPECT_EQ(model_logits(warm, bt).to_vector<float>(), model_logits(mha, bt).to_vector<float>());
}

// Decoding shares the step's tables as the forward does: the tables of shared layers are their
// source's, and the logits match the forward within decode's rounding bound (test_decode.cpp).
TEST(IndexShareModel, DecodingSharesTheTables) {
  const Model m = glm_model("dsa_sparse", 12);
  const int64_t s = 20;
  std::vector<int32_t> ids(s);
  std::mt19937_64 rng(3);
  for (auto& t : ids) t = int32_t(1 + rng() % 39);
  std::vector<Tensor> want;
  const Tensor full = model_logits(m, {Tensor::from_vector<int32_t>({1, s}, ids), layout_causal(1, s)}, &want);
  const int64_t V = m.cfg.vocab_size, KW = m.cfg.index_topk;
  const ModelConfig& c = m.cfg;
  const double bound = double(8 * c.num_hidden_layers + 1) *
                       double(std::max({c.hidden_size, c.intermediate_size, c.kv_lora_rank + c.qk_rope_head_dim, s})) *
                       FLT_EPSILON;
  KvCache cache = kv_cache(m, s);
  EXPECT_FALSE(cache.kI[1].defined());  // a shared layer caches no indexer key
  EXPECT_TRUE(cache.kI[3].defined());
  for (int64_t P = 0; P < s;) {
    const int64_t n = P == 0 ? 7 : 1;
    std::vector<Tensor> topk;
    const Tensor got = decode_step(m, cache, std::span<const int32_t>(ids).subspan(P, n), &topk);
    double diff = 0, mag = 0;
    for (int64_t v = 0; v < V; ++v) {
      diff = std::max(diff, std::abs(double(got.data<float>()[v]) - full.data<float>()[(P + n - 1) * V + v]));
      mag = std::max(mag, std::abs(double(full.data<float>()[(P + n - 1) * V + v])));
    }
    EXPECT_LE(diff, bound * mag) << "position " << P + n - 1;
    for (int64_t L = 0; L < 4; ++L) {
      const std::vector<int32_t> a = topk[L].to_vector<int32_t>(), b = want[L].to_vector<int32_t>();
      EXPECT_EQ(a, std::vector<int32_t>(b.begin() + P * KW, b.begin() + (P + n) * KW)) << "layer " << L;
    }
    P += n;
  }
}

}  // namespace
}  // namespace hmla
