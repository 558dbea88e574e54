// config.json parsing and validation, hmla's YAML settings, RoPE/YaRN tables and scale.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include "hmla/core/error.h"
#include "hmla/io/json_strict.h"
#include "hmla/model/config.h"

namespace hmla {
namespace {

using nlohmann::json;

json tiny() {
  return json{{"hidden_size", 64},      {"num_attention_heads", 4}, {"num_hidden_layers", 2},
              {"q_lora_rank", 24},      {"kv_lora_rank", 32},       {"qk_nope_head_dim", 16},
              {"qk_rope_head_dim", 8},  {"v_head_dim", 16},         {"max_position_embeddings", 128},
              {"index_n_heads", 2},     {"index_head_dim", 16},     {"index_topk", 8},
              {"n_routed_experts", 8},  {"num_experts_per_tok", 2}, {"routed_scaling_factor", 2.5}};
}

void expect_config_error(const json& j, const std::string& needle) {
  try {
    parse_model_config(j, "cfg");
    ADD_FAILURE() << "accepted: " << j.dump();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(ModelConfig, ParsesDeepSeekFieldsAndIgnoresMoeRouting) {
  ModelConfig c = parse_model_config(tiny(), "cfg");
  EXPECT_EQ(c.qk_head_dim(), 24);
  EXPECT_EQ(c.pad_token_id, 0);
  // index_* present and no hmla_layer_modes: dsa_sparse everywhere, as transformers runs it.
  EXPECT_EQ(c.layer_modes, std::vector<LayerMode>(2, LayerMode::dsa_sparse));
  json j = tiny();
  j.erase("index_n_heads");
  EXPECT_EQ(parse_model_config(j, "cfg").layer_modes, std::vector<LayerMode>(2, LayerMode::mha));
  EXPECT_TRUE(latent_mqa_enabled(c, 0));
}

// Regression: transformers writes "pad_token_id": null; every consumer reads it as 0.
TEST(ModelConfig, PadTokenIdNullMeansZero) {
  json j = tiny();
  j["pad_token_id"] = nullptr;
  EXPECT_EQ(parse_model_config(j, "cfg").pad_token_id, 0);
  j["pad_token_id"] = 7;
  EXPECT_EQ(parse_model_config(j, "cfg").pad_token_id, 7);
}

TEST(ModelConfig, ValidationNamesTheField) {
  json j = tiny();
  j["hmla_layer_modes"] = {"mha", "sparse_mha"};
  expect_config_error(j, "hmla_layer_modes[1]: unknown mode 'sparse_mha'");
  j["hmla_layer_modes"] = {"mha"};
  expect_config_error(j, "hmla_layer_modes has 1 entries");
  j = tiny();
  j["hmla_layer_modes"] = {"mha", "dsa_warmup"};
  j["index_topk"] = 0;
  expect_config_error(j, "index_topk");
  j = tiny();
  j["hmla_layer_modes"] = {"dsa_sparse", "mha"};
  j["q_lora_rank"] = nullptr;
  expect_config_error(j, "q_lora_rank 0");
  j = tiny();
  j["v_head_dim"] = 0;
  expect_config_error(j, "v_head_dim = 0");
  j = tiny();
  j["kv_lora_rank"] = -3;
  expect_config_error(j, "kv_lora_rank = -3");
  j = tiny();
  j["qk_rope_head_dim"] = 7;
  expect_config_error(j, "qk_rope_head_dim = 7 is odd");
  j = tiny();
  j["index_head_dim"] = 4;
  expect_config_error(j, "index_head_dim = 4 is smaller than qk_rope_head_dim");
  j = tiny();
  j["rope_scaling"] = {{"type", "llama3"}, {"factor", 8}};
  expect_config_error(j, "rope_type = 'llama3'");
  j = tiny();
  j.erase("hidden_size");
  expect_config_error(j, "hidden_size is required");
}

TEST(ModelConfig, WritesBackWhatTransformersReads) {
  json j = tiny();
  j["pad_token_id"] = nullptr;
  j["hmla_layer_modes"] = {"mha", "mqa_full_causal"};
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"mscale_all_dim", 1.0}};
  ModelConfig c = parse_model_config(j, "cfg");
  json w = model_config_to_json(c);
  EXPECT_EQ(w["pad_token_id"], 0);
  EXPECT_EQ(w["first_k_dense_replace"], 2);
  EXPECT_EQ(w["mlp_layer_types"], json({"dense", "dense"}));
  EXPECT_EQ(w["n_routed_experts"], 8);  // unknown fields ride along
  EXPECT_EQ(w["rope_parameters"]["rope_type"], "yarn");
  EXPECT_FALSE(w.contains("rope_scaling"));
  ModelConfig back = parse_model_config(w, "written");
  EXPECT_EQ(back.layer_modes, c.layer_modes);
  EXPECT_EQ(rope_tables(back).inv_freq, rope_tables(c).inv_freq);
  EXPECT_EQ(softmax_scale(back), softmax_scale(c));
}

TEST(Rope, RopeParametersAndRopeScalingAgree) {
  json a = tiny(), b = tiny();
  a["rope_scaling"] = {{"type", "yarn"}, {"factor", 40.0}, {"original_max_position_embeddings", 4096},
                       {"beta_fast", 32}, {"beta_slow", 1}, {"mscale", 1.0}, {"mscale_all_dim", 1.0}};
  a["rope_theta"] = 10000.0;
  b["rope_parameters"] = a["rope_scaling"];
  b["rope_parameters"].erase("type");
  b["rope_parameters"]["rope_type"] = "yarn";
  b["rope_parameters"]["rope_theta"] = 10000.0;
  ModelConfig ca = parse_model_config(a, "a"), cb = parse_model_config(b, "b");
  EXPECT_EQ(rope_tables(ca).inv_freq, rope_tables(cb).inv_freq);
  // DeepSeek-V3's YaRN: mscale = mscale_all_dim = 1 gives attention factor 1, and the softmax
  // scale grows by m^2 with m = 0.1 ln(40) + 1.
  EXPECT_DOUBLE_EQ(rope_tables(ca).attention_factor, 1.0);
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(softmax_scale(ca), m * m / std::sqrt(24.0), 1e-15);
  // Lowest frequency channels are interpolated by the factor, the highest extrapolated.
  RopeTables plain = rope_tables(parse_model_config(tiny(), "p"));
  EXPECT_DOUBLE_EQ(rope_tables(ca).inv_freq[0], plain.inv_freq[0]);
  EXPECT_NEAR(rope_tables(ca).inv_freq[3], plain.inv_freq[3] / 40.0, 1e-18);
  a["rope_scaling"]["attention_factor"] = 0.5;  // explicit wins
  EXPECT_DOUBLE_EQ(rope_tables(parse_model_config(a, "a")).attention_factor, 0.5);
}

// A programme's phases set the modes: a plain HF config (index_* fields, no hmla_layer_modes)
// must load for training, where DESIGN.md's default (dsa_sparse) would demand indexers.
TEST(ModelConfig, AProgrammeSetsTheModesItself) {
  json j = tiny();
  j["q_lora_rank"] = nullptr;  // dsa_sparse by default would need a q latent
  expect_config_error(j, "q_lora_rank 0");
  ModelConfig c = parse_model_config(j, "cfg", LayerModesFrom::programme);
  EXPECT_EQ(c.layer_modes, std::vector<LayerMode>(2, LayerMode::mha));
  j["hmla_layer_modes"] = {"mha", "bogus"};  // the key is still checked
  EXPECT_THROW(parse_model_config(j, "cfg", LayerModesFrom::programme), ConfigError);
  j["hmla_layer_modes"] = {"mha"};
  EXPECT_THROW(parse_model_config(j, "cfg", LayerModesFrom::programme), ConfigError);
}

TEST(ModelConfig, SizesThatOverflowInt64AreErrorsNamingTheFields) {
  json j = tiny();
  j["vocab_size"] = int64_t(1) << 40;
  j["hidden_size"] = int64_t(1) << 30;
  expect_config_error(j, "model.embed_tokens: vocab_size x hidden_size = 1099511627776 x 1073741824 overflows int64");
  j = tiny();
  j["num_attention_heads"] = int64_t(1) << 40;
  j["qk_nope_head_dim"] = int64_t(1) << 30;
  expect_config_error(j, "num_attention_heads x (qk_nope_head_dim + qk_rope_head_dim)");
  j = tiny();
  j["hidden_size"] = json::number_unsigned_t(18446744073709551615ull);  // would read back as -1
  expect_config_error(j, "hidden_size = 18446744073709551615 does not fit int64");
}

TEST(ModelConfig, LibraryTypeErrorsBecomeFieldErrors) {
  json j = tiny();
  j["mlp_layer_types"] = 3;
  expect_config_error(j, "mlp_layer_types must be a list");
  j = tiny();
  j["rope_scaling"] = {{"type", 5}};
  expect_config_error(j, "rope_scaling.type must be a string, got 5");
}

TEST(ModelConfig, ADuplicatedJsonKeyIsAnError) {
  const std::string path = ::testing::TempDir() + "/hmla_dup_config.json";
  std::string text = tiny().dump();
  text.insert(text.size() - 1, ",\"rope_parameters\":{\"rope_type\":\"default\",\"rope_type\":\"yarn\"}");
  std::ofstream(path) << text;
  try {
    load_model_config(path);
    ADD_FAILURE() << "accepted";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("key 'rope_type' appears twice in 'rope_parameters'"), std::string::npos)
        << e.what();
  }
  std::remove(path.c_str());
  EXPECT_THROW(io::parse_json("{\"a\": [{\"b\": 1, \"b\": 2}]}", "x"), IoError);
  EXPECT_NO_THROW(io::parse_json("{\"a\": {\"b\": 1}, \"c\": {\"b\": 2}}", "x"));  // same key, other objects
}

}  // namespace
}  // namespace hmla
