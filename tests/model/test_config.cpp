// config.json parsing and validation, hmla's YAML settings, RoPE/YaRN tables and scale.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "hmla/core/error.h"
#include "hmla/io/json_strict.h"
#include "hmla/model/config.h"
#include "hmla/model/model.h"

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
  j["index_head_dim"] = 6;  // the largest even width below qk_rope_head_dim = 8
  expect_config_error(j, "index_head_dim = 6 is smaller than qk_rope_head_dim");
  j["index_head_dim"] = 8;  // equal: the indexer ropes all of its channels
  EXPECT_NO_THROW(parse_model_config(j, "t"));
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

// Values no config can mean are refused at load, naming the field (issue 24).
TEST(ModelConfig, YarnValuesThatCannotBeMeantAreErrors) {
  auto yarn = [](json extra) {
    json j = tiny();
    j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 16}};
    for (auto it = extra.begin(); it != extra.end(); ++it) j["rope_scaling"][it.key()] = *it;
    return j;
  };
  EXPECT_NO_THROW(parse_model_config(yarn({}), "cfg"));
  EXPECT_NO_THROW(parse_model_config(yarn({{"factor", 65536.0}, {"beta_fast", 1}, {"beta_slow", 1}}), "cfg"));
  expect_config_error(yarn({{"original_max_position_embeddings", 0}}),
                      "rope_scaling.original_max_position_embeddings = 0: it must be >= 1");
  expect_config_error(yarn({{"original_max_position_embeddings", -4}}), "original_max_position_embeddings = -4");
  expect_config_error(yarn({{"beta_fast", 1}, {"beta_slow", 32}}),
                      "rope_scaling: beta_fast = 1 is smaller than beta_slow = 32");
  expect_config_error(yarn({{"beta_slow", 0}}), "beta_slow = 0: both must be finite and positive");
  expect_config_error(yarn({{"mscale", -50}}), "rope_scaling.mscale = -50: it must be finite and >= 0");
  expect_config_error(yarn({{"mscale_all_dim", -1}}), "rope_scaling.mscale_all_dim = -1");
  expect_config_error(yarn({{"factor", 1e308}}), "rope_scaling.factor = 1e+308: it must be in [1, 65536]");
  expect_config_error(yarn({{"factor", 0.5}}), "rope_scaling.factor = 0.5: it must be in [1, 65536]");
  expect_config_error(yarn({{"attention_factor", 0}}), "rope_scaling.attention_factor = 0");
  json j = tiny();
  j["rope_theta"] = std::nan("");  // NaN never reaches a table
  expect_config_error(j, "rope_theta");
  // Not YaRN: its fields are not read, so they are not checked either.
  j = tiny();
  j["rope_scaling"] = {{"type", "default"}, {"original_max_position_embeddings", 0}};
  EXPECT_NO_THROW(parse_model_config(j, "cfg"));
}

TEST(ModelConfig, InitializerRangePadTokenAndLayerCountMustBeMeaningful) {
  json j = tiny();
  j["initializer_range"] = -0.02;
  expect_config_error(j, "initializer_range = -0.02: it must be finite and >= 0");
  j["initializer_range"] = 0;
  EXPECT_NO_THROW(parse_model_config(j, "cfg"));
  j = tiny();
  j["vocab_size"] = 100;
  j["pad_token_id"] = 100;
  expect_config_error(j, "pad_token_id = 100 is not a token of the vocabulary [0, 100)");
  j["pad_token_id"] = 99;
  EXPECT_NO_THROW(parse_model_config(j, "cfg"));
  j = tiny();  // vocab_size 0: a layer-only config, no vocabulary to check against
  j["pad_token_id"] = 100;
  EXPECT_NO_THROW(parse_model_config(j, "cfg"));
  // 10^6 layers took 3.9 GB before the refusal; 2^31 ended in "out of memory" while loading.
  for (int64_t layers : {int64_t(1000000), int64_t(1) << 31, kMaxLayers + 1}) {
    j = tiny();
    j["num_hidden_layers"] = layers;
    expect_config_error(j, "num_hidden_layers = " + std::to_string(layers) + ": hmla builds at most 65536 layers");
  }
}

// The parameter plan comes from one layer of each kind, never the whole table: it must count
// exactly what the table (and so the arena) holds, for every mix of layers with and without an
// indexer.
TEST(ModelConfig, TheParameterPlanCountsTheTableWithoutBuildingIt) {
  json j = tiny();
  j["vocab_size"] = 300;
  j["intermediate_size"] = 96;
  j["num_hidden_layers"] = 4;
  j["n_group"] = 2, j["topk_group"] = 1, j["moe_intermediate_size"] = 12, j["n_shared_experts"] = 2;
  // All dense (first_k_dense_replace 4), and MoE from layer 2 (8 experts per MoE layer counted
  // from one, beside the dense layers and each indexer kind).
  for (auto [tie, dense] : {std::pair{false, 4}, std::pair{true, 4}, std::pair{false, 2}, std::pair{true, 2}}) {
    j["tie_word_embeddings"] = tie;
    j["first_k_dense_replace"] = dense;
    const ModelConfig c = parse_model_config(j, "cfg");
    for (std::vector<bool> has : {std::vector<bool>{false, false, false, false}, {true, true, true, true},
                                  {true, false, true, false}, {false, false, true, true}})
      for (bool training : {false, true})
        for (DType compute : {DType::f32, DType::bf16}) {  // bf16: the compute copy's 2 bytes more
          MemoryPlan plan;
          plan_parameters(plan, c, has, training, compute);
          EXPECT_EQ(plan.total(), ((training ? 3 : 1) * 4 + (compute == DType::bf16 ? 2 : 0)) *
                                      table_numel(model_param_table(c, has)));
        }
  }
  // The largest tensor the message names is the table's first largest.
  j["tie_word_embeddings"] = false;
  j["first_k_dense_replace"] = 4;
  j["intermediate_size"] = 100000;
  ::setenv("HMLA_MEMORY_BUDGET", "1K", 1);
  MemoryPlan plan;
  plan_parameters(plan, parse_model_config(j, "cfg"), {false, true, false, true}, false, DType::f32);
  try {
    plan.check("cfg");
    ADD_FAILURE() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("the largest: model.layers.0.mlp.gate_proj.weight [100000, 64]"),
              std::string::npos) << e.what();
  }
  ::unsetenv("HMLA_MEMORY_BUDGET");
}

// Every JSON hmla reads is bounded in nesting and size (issue 24: 100,000 nested arrays in an
// unknown key of config.json overflowed the stack after ~4 GB).
TEST(StrictJson, NestingAndSizeAreBounded) {
  auto nested = [](size_t levels) { return std::string(levels, '[') + std::string(levels, ']'); };
  EXPECT_NO_THROW(io::parse_json(nested(io::kMaxJsonDepth), "x"));
  EXPECT_NO_THROW(io::parse_ordered_json(nested(io::kMaxJsonDepth), "x"));
  for (size_t levels : {io::kMaxJsonDepth + 1, size_t(100000)})
    for (bool ordered : {false, true}) {
      try {
        ordered ? (void)io::parse_ordered_json(nested(levels), "x") : (void)io::parse_json(nested(levels), "x");
        ADD_FAILURE() << levels << " levels accepted";
      } catch (const IoError& e) {
        EXPECT_NE(std::string(e.what()).find("x: nests deeper than 64 levels"), std::string::npos) << e.what();
      }
    }
  try {
    io::parse_json("{\"a\": {\"b\": " + nested(70) + "}}", "x");
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("(at 'a.b[][]"), std::string::npos) << e.what();  // says where
  }
  const std::string big(io::kMaxJsonBytes + 1, ' ');
  try {
    io::parse_json(big, "x");
    ADD_FAILURE() << "accepted";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("x: 104857601 bytes of JSON, more than the 100.0 MiB hmla reads"),
              std::string::npos) << e.what();
  }
  const std::string path = ::testing::TempDir() + "/hmla_deep_config.json";
  std::string text = tiny().dump();
  text.insert(text.size() - 1, ",\"unknown\": " + nested(100000));
  std::ofstream(path) << text;
  EXPECT_THROW(load_model_config(path), IoError);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace hmla
