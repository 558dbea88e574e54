// Small model configs for tests, written as the JSON parse_model_config reads. The defaults are
// the model tests' tiny shape (2 heads of 8 + 4 channels, LoRA ranks 16, an indexer of 2 heads x 8
// with top-4); a test sets what it needs differently, and std::nullopt (or no modes) leaves a key
// out, so parse_model_config's own default applies and each test keeps the config it had.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hmla/model/config.h"

namespace hmla::testing {

struct TinyIndexer {
  int heads = 2, dim = 8, topk = 4;
  std::optional<int> window;
};

struct TinyConfig {
  int hidden = 32, heads = 2;
  std::optional<int> layers;  // default: one per mode (one without modes)
  int q_lora = 16, kv_lora = 16, nope = 8, rope = 4, v = 8;
  std::optional<int> vocab = 40, intermediate = 48;
  std::optional<TinyIndexer> indexer = TinyIndexer{};
  std::vector<std::string> modes = {"mha"};  // hmla_layer_modes; empty: the key is left out
  std::optional<double> init_range = 0.2;
  std::optional<int> max_positions = 64;
  std::optional<bool> sink, tie;
  bool yarn = false;  // rope_scaling: YaRN x4 over 16 original positions, mscale 1, mscale_all_dim 0.7
};

inline nlohmann::json tiny_config_json(const TinyConfig& t) {
  nlohmann::json j{{"hidden_size", t.hidden},
                   {"num_attention_heads", t.heads},
                   {"num_hidden_layers", t.layers.value_or(t.modes.empty() ? 1 : int(t.modes.size()))},
                   {"q_lora_rank", t.q_lora},
                   {"kv_lora_rank", t.kv_lora},
                   {"qk_nope_head_dim", t.nope},
                   {"qk_rope_head_dim", t.rope},
                   {"v_head_dim", t.v}};
  auto put = [&j](const char* key, const auto& v) {
    if (v) j[key] = *v;
  };
  put("vocab_size", t.vocab), put("intermediate_size", t.intermediate);
  if (t.indexer) {
    j["index_n_heads"] = t.indexer->heads, j["index_head_dim"] = t.indexer->dim, j["index_topk"] = t.indexer->topk;
    put("index_window", t.indexer->window);
  }
  if (!t.modes.empty()) j["hmla_layer_modes"] = t.modes;
  put("initializer_range", t.init_range), put("max_position_embeddings", t.max_positions);
  put("attention_sink", t.sink), put("tie_word_embeddings", t.tie);
  if (t.yarn)
    j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 16},
                         {"mscale", 1.0}, {"mscale_all_dim", 0.7}};
  return j;
}

inline ModelConfig tiny_config(const TinyConfig& t, const std::string& what = "tiny") {
  return parse_model_config(tiny_config_json(t), what);
}

}  // namespace hmla::testing
