// `hmla layer --settings`: unknown, duplicated and mistyped keys are errors; the rules that need
// the config too.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "hmla/core/error.h"
#include "layer_settings.h"

namespace hmla::app {
namespace {

ModelConfig two_layers(const std::vector<std::string>& modes) {
  nlohmann::json j{{"hidden_size", 64},     {"num_attention_heads", 4}, {"num_hidden_layers", 2},
                   {"q_lora_rank", 24},     {"kv_lora_rank", 32},       {"qk_nope_head_dim", 16},
                   {"qk_rope_head_dim", 8}, {"v_head_dim", 16},         {"index_n_heads", 2},
                   {"index_head_dim", 16},  {"index_topk", 8},          {"hmla_layer_modes", modes}};
  return parse_model_config(j, "cfg");
}

std::string error_of(const std::string& yaml) {
  try {
    parse_layer_settings(yaml, "s.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(LayerSettings, UnknownKeysAndCrossFileRules) {
  EXPECT_EQ(error_of("mqa_split_kv_b_proj: true\ntrain_indexer_only: false\n"), "(accepted)");
  EXPECT_EQ(error_of(""), "(accepted)");
  EXPECT_EQ(error_of("mqa_split_kv_b_proj: true\nmqa_split_kvb: 1\n"),
            "s.yaml: unknown key 'mqa_split_kvb' (known: mqa_split_kv_b_proj, train_indexer_only; see docs/config.md)");
  EXPECT_NE(error_of("train_indexer_only: maybe").find("must be true or false"), std::string::npos);
  EXPECT_NE(error_of("- a\n- b\n").find("must be a mapping"), std::string::npos);
  EXPECT_NE(error_of("train_indexer_only: true\ntrain_indexer_only: false\n").find("appears twice"),
            std::string::npos);  // never last-wins
  // A key the layer does not read (seed, a programme's key) is an error, not a silent no-op.
  EXPECT_NE(error_of("seed: 3\n").find("unknown key 'seed'"), std::string::npos);
  const LayerSettings split = parse_layer_settings("mqa_split_kv_b_proj: true", "s");
  EXPECT_THROW(validate_layer_settings(two_layers({"mqa_full_causal", "mha"}), split, "s"), ConfigError);  // layer 1
  EXPECT_NO_THROW(validate_layer_settings(two_layers({"mqa_full_causal", "dsa_sparse"}), split, "s"));
  EXPECT_THROW(validate_layer_settings(two_layers({"dsa_sparse", "dsa_sparse"}),
                                       parse_layer_settings("train_indexer_only: true", "s"), "s"),
               ConfigError);
}

}  // namespace
}  // namespace hmla::app
