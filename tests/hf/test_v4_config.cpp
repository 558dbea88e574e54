// deepseek_v4 config.json against transformers 5.24's DeepseekV4Config (fixture from
// tests/hf/make_v4_config_fixtures.py): what it makes of each input (kinds, hash layers, rates,
// the rotated width, both RoPEs' frequencies and scaling), the config.json it writes read back
// the same, hmla's own write read back the same, and the refusals, each naming its field.
#include <gtest/gtest.h>

#include <cmath>

#include "hmla/core/error.h"
#include "hmla/io/json_strict.h"
#include "hmla/model/config.h"

namespace hmla {
namespace {

using nlohmann::json;

const json& fixture() {
  static const json j = io::load_json(std::string(HMLA_SOURCE_DIR) + "/tests/hf/fixtures/config_v4.json");
  return j;
}

// transformers computes the inverse frequencies in f32 (base ** (2i / dim), then 1 / x, YaRN's
// blend): the exponent's rounding moves base^e by |e ln base| 2^-24 <= ln(base) 2^-24 relative, and
// the pow, the division and the blend's few operations add a few ulps more. hmla computes in
// double, so the difference is bounded by (ln(base) + 8) 2^-24 relative.
void expect_rope(const RopeConfig& r, int64_t dim, int64_t max_pos, const json& want, const std::string& what) {
  const RopeTables t = rope_tables(r, dim, max_pos);
  const std::vector<double> ref = want["inv_freq"].get<std::vector<double>>();
  ASSERT_EQ(t.inv_freq.size(), ref.size()) << what;
  const double rel = (std::log(r.theta) + 8) * std::ldexp(1.0, -24);
  for (size_t i = 0; i < ref.size(); ++i)
    EXPECT_NEAR(t.inv_freq[i], ref[i], rel * std::abs(ref[i])) << what << " inv_freq[" << i << "]";
  // transformers' attention scaling is a Python float (double) of the same formula.
  EXPECT_NEAR(t.attention_factor, want["attention_scaling"].get<double>(), 1e-12) << what;
}

void expect_as_transformers(const ModelConfig& c, const json& want, const std::string& what) {
  ASSERT_TRUE(c.is_v4()) << what;
  const auto kinds = want["layer_types"].get<std::vector<std::string>>();
  const auto mlp = want["mlp_layer_types"].get<std::vector<std::string>>();
  ASSERT_EQ(int64_t(kinds.size()), c.num_hidden_layers) << what;
  for (size_t L = 0; L < kinds.size(); ++L) {
    EXPECT_EQ(v4_kind_name(c.v4.layer_types[L]), kinds[L]) << what << " layer " << L;
    EXPECT_EQ(c.v4.hash[L], mlp[L] == "hash_moe") << what << " layer " << L;
    EXPECT_TRUE(c.is_moe_layer(int64_t(L)));
  }
  for (const auto& [kind, rate] : want["compress_rates"].items())
    EXPECT_EQ(kind == "compressed_sparse_attention" ? c.v4.csa_rate : c.v4.hca_rate, rate.get<int64_t>()) << what;
  EXPECT_EQ(c.v4.qk_rope_head_dim, want["qk_rope_head_dim"].get<int64_t>()) << what;
  expect_rope(c.rope, c.v4.qk_rope_head_dim, c.max_position_embeddings, want["rope"]["main"], what + " main");
  expect_rope(c.v4.compress_rope, c.v4.qk_rope_head_dim, c.max_position_embeddings, want["rope"]["compress"],
              what + " compress");
}

TEST(V4Config, ReadsEachInputAsTransformersDoes) {
  for (const auto& [name, cs] : fixture()["cases"].items()) {
    expect_as_transformers(parse_model_config(cs["config"], name), cs, name);
    // what transformers writes for it (config.json of save_pretrained) reads the same
    expect_as_transformers(parse_model_config(cs["written"], name + " (written)"), cs, name + " (written)");
  }
}

TEST(V4Config, HmlasWriteReadsBackTheSame) {
  for (const auto& [name, cs] : fixture()["cases"].items()) {
    const ModelConfig c = parse_model_config(cs["config"], name);
    const json w = model_config_to_json(c);
    EXPECT_FALSE(w.contains("compress_ratios") || w.contains("num_hash_layers") || w.contains("rope_scaling")) << name;
    expect_as_transformers(parse_model_config(w, name + " (hmla's write)"), cs, name + " (hmla's write)");
    const ModelConfig back = parse_model_config(w, name);
    EXPECT_EQ(model_config_to_json(back), w) << name;  // a fixed point
  }
}

TEST(V4Config, DefaultsAreDeepSeekV4Flash) {
  const ModelConfig c = parse_model_config(json{{"model_type", "deepseek_v4"}}, "cfg");
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_hidden_layers, 43);
  EXPECT_EQ(c.v4.head_dim, 512);
  EXPECT_EQ(c.moe.n_routed_experts, 256);
  EXPECT_EQ(c.moe.num_experts_per_tok, 6);
  EXPECT_EQ(c.moe.routed_scaling_factor, 1.5);
  EXPECT_EQ(c.v4.scoring, ScoringFunc::sqrtsoftplus);
  EXPECT_EQ(c.form.num_nextn_predict_layers, 1);
  EXPECT_EQ(c.v4.hc_mult, 4);
  EXPECT_EQ(c.v4.sliding_window, 128);
}

void expect_error(json j, const std::string& needle) {
  j["model_type"] = "deepseek_v4";
  try {
    parse_model_config(j, "cfg");
    ADD_FAILURE() << "accepted: " << j.dump();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(V4Config, RefusesWhatTransformersCannotBuildNamingTheField) {
  const json small = {{"num_hidden_layers", 3}, {"hidden_size", 32}, {"num_attention_heads", 4}, {"head_dim", 16},
                      {"qk_rope_head_dim", 8}, {"vocab_size", 64}, {"o_groups", 2},
                      {"layer_types", {"sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"}}};
  auto with = [&](const char* k, json v) {
    json j = small;
    j[k] = v;
    return j;
  };
  expect_error(with("compress_rates", {{"compressed_sparse_attention", 1}, {"heavily_compressed_attention", 8}}),
               "compress_rates.compressed_sparse_attention = 1");
  expect_error(with("compress_rate_hca", 0), "compress_rates.heavily_compressed_attention = 0");
  expect_error(with("o_groups", 3), "o_groups = 3 does not divide num_attention_heads = 4");
  expect_error(with("layer_types", {"sliding_attention", "sliding_attention"}), "layer_types has 2 entries");
  expect_error(with("layer_types", {"sliding_attention", "hybrid", "sliding_attention"}), "layer_types[1]");
  json ratios = with("compress_ratios", {0, 2, 0, 0});
  ratios.erase("layer_types");  // which wins over the legacy field, as in transformers
  expect_error(ratios, "compress_ratios[1] = 2");
  expect_error(with("mlp_layer_types", {"moe", "dense", "moe"}), "mlp_layer_types[1]");
  expect_error(with("num_key_value_heads", 2), "num_key_value_heads must be 1");
  expect_error(with("n_shared_experts", 2), "n_shared_experts = 2");
  expect_error(with("scoring_func", "tanh"), "scoring_func = tanh");
  expect_error(with("scoring_func", "softmax"), "scoring_func = softmax");
  expect_error(with("swiglu_limit", -1), "swiglu_limit = -1");
  expect_error(with("partial_rotary_factor", 1.5), "partial_rotary_factor = 1.5");
  expect_error(with("qk_rope_head_dim", 7), "qk_rope_head_dim = int(head_dim * partial_rotary_factor) = 7");
  expect_error(with("num_experts_per_tok", 300), "num_experts_per_tok = 300 exceeds n_routed_experts = 256");
  expect_error(with("hc_mult", 0), "hc_mult = 0");
  expect_error(with("hmla_layer_modes", {"mha", "dsa_sparce", "mha"}), "hmla_layer_modes[1]");  // any mode, but a mode
  json hca_without_rate = with("compress_rates", {{"compressed_sparse_attention", 4}});
  hca_without_rate["layer_types"] = {"sliding_attention", "heavily_compressed_attention", "sliding_attention"};
  expect_error(hca_without_rate, "compress_rates has no heavily_compressed_attention rate, and layer 1 is one");
  json nested = with("rope_parameters", {{"main", {{"rope_type", "default"}, {"partial_rotary_factor", 0.25}}},
                                         {"compress", {{"rope_type", "default"}}}});
  expect_error(nested, "rope_parameters.main.partial_rotary_factor differs");
}

}  // namespace
}  // namespace hmla

namespace hmla {
namespace {

// configs/'s V4-Flash and V4-Pro geometries (memory plans) read as their releases describe them.
TEST(V4Config, ShippedGeometriesRead) {
  const ModelConfig f = load_model_config(std::string(HMLA_SOURCE_DIR) + "/configs/deepseek_v4_flash.json");
  const ModelConfig p = load_model_config(std::string(HMLA_SOURCE_DIR) + "/configs/deepseek_v4_pro.json");
  for (const ModelConfig* c : {&f, &p}) {
    EXPECT_EQ(c->v4.qk_rope_head_dim, 64);
    EXPECT_EQ(c->v4.compress_rope.type, "yarn");
    EXPECT_EQ(*c->v4.compress_rope.attention_factor, 1.0);  // V4's YaRN leaves cos/sin unscaled
    EXPECT_EQ(c->rope.type, "default");
    EXPECT_EQ(c->v4.hash[2], true);
    EXPECT_EQ(c->v4.hash[3], false);
  }
  EXPECT_EQ(f.num_hidden_layers, 43);
  EXPECT_EQ(p.num_hidden_layers, 61);
  EXPECT_EQ(p.moe.n_routed_experts, 384);
  EXPECT_EQ(p.num_attention_heads / p.v4.o_groups, 8);
}

}  // namespace
}  // namespace hmla

#include "hmla/core/size_check.h"
#include "hmla/io/safetensors.h"
#include "hmla/model/model.h"
#include "hmla/model/v4_tables.h"

namespace hmla {
namespace {

// The parameter table names and shapes exactly the tensors transformers 5.24's save_pretrained
// writes for a tiny DeepseekV4ForCausalLM with every layer kind, hash and learned MoE (the v4
// fixture): every f32 tensor a parameter, tid2eid the integer tables, nothing else.
TEST(V4Tables, NameEveryTensorTransformersSaves) {
  const std::string dir = std::string(HMLA_SOURCE_DIR) + "/tests/hf/fixtures/v4";
  const ModelConfig c = load_model_config(dir + "/config.json");
  const io::TensorMap saved = io::load_safetensors(dir + "/model.safetensors");
  std::map<std::string, std::pair<Shape, DType>> want;
  for (const ParamSpec& p : v4_param_table(c, false, v4_indexer_layers(c))) want[p.name] = {p.shape, DType::f32};
  for (const ParamSpec& p : v4_int_tables(c)) want[p.name] = {p.shape, DType::i64};
  EXPECT_EQ(want.size(), v4_param_table(c, false, v4_indexer_layers(c)).size() + v4_int_tables(c).size()) << "a name twice in the table";
  for (const auto& [name, t] : saved) {
    auto it = want.find(name);
    if (it == want.end()) {
      ADD_FAILURE() << "transformers saves " << name << ", which hmla's table lacks";
      continue;
    }
    EXPECT_EQ(t.shape(), it->second.first) << name;
    EXPECT_EQ(t.dtype(), it->second.second) << name;
  }
  for (const auto& [name, spec] : want) EXPECT_TRUE(saved.count(name)) << "hmla's table has " << name << ", transformers saves none";
  EXPECT_EQ(model_param_table(c, v4_indexer_layers(c)).size(), v4_param_table(c, false, v4_indexer_layers(c)).size());
}

int64_t planned_values(const ModelConfig& c) {
  MemoryPlan plan;
  plan_parameters(plan, c, v4_indexer_layers(c), false, DType::f32);
  const int64_t ints = [&] {
    int64_t n = 0;
    for (const ParamSpec& p : v4_int_tables(c)) n += shape_numel(p.shape);
    return n;
  }();
  return (plan.total() - 4 * ints) / 4;
}

// The memory plan counts the table, one layer of each kind repeated: for the fixture's config it
// equals the whole table's count; V4-Flash's and V4-Pro's are their published sizes (284B and
// 1.6T parameters with the MTP layer, which the table leaves out: within 3% below).
TEST(V4Tables, MemoryPlanCountsTheTable) {
  const ModelConfig c = load_model_config(std::string(HMLA_SOURCE_DIR) + "/tests/hf/fixtures/v4/config.json");
  EXPECT_EQ(planned_values(c), table_numel(v4_param_table(c, false, v4_indexer_layers(c))));
  for (auto [file, published] : {std::pair{"deepseek_v4_flash.json", 284e9}, std::pair{"deepseek_v4_pro.json", 1.6e12}}) {
    const ModelConfig g = load_model_config(std::string(HMLA_SOURCE_DIR) + "/configs/" + file);
    const double n = double(planned_values(g)), layer = n / double(g.num_hidden_layers);
    EXPECT_GT(n + layer, 0.97 * published) << file << ": " << n;
    EXPECT_LT(n, 1.03 * published) << file << ": " << n;
  }
}

}  // namespace
}  // namespace hmla
