#include "hmla/train/settings.h"

#include <yaml-cpp/yaml.h>

#include "hmla/core/error.h"
#include "hmla/io/safetensors.h"

namespace hmla {

namespace {

template <class T>
T scalar(const YAML::Node& n, const std::string& key, const std::string& what, const char* kind) {
  try {
    return n.as<T>();
  } catch (const YAML::Exception&) {
    throw ConfigError(what + ": " + key + " must be " + kind);
  }
}

}  // namespace

TrainSettings parse_train_settings(const std::string& text, const std::string& what) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(what + ": not valid YAML: " + e.what());
  }
  TrainSettings s;
  if (root.IsNull()) return s;
  HMLA_CHECK(root.IsMap(), ConfigError, what, ": settings must be a mapping of key: value");
  for (const auto& kv : root) {
    const std::string key = kv.first.as<std::string>();
    if (key == "mqa_split_kv_b_proj") s.mqa_split_kv_b_proj = scalar<bool>(kv.second, key, what, "true or false");
    else if (key == "train_indexer_only") s.train_indexer_only = scalar<bool>(kv.second, key, what, "true or false");
    else if (key == "seed") s.seed = scalar<uint64_t>(kv.second, key, what, "a non-negative integer");
    else
      throw ConfigError(what + ": unknown key '" + key +
                        "' (known: mqa_split_kv_b_proj, train_indexer_only, seed; see docs/config.md)");
  }
  return s;
}

TrainSettings load_train_settings(const std::string& path) {
  return parse_train_settings(io::read_file(path), path);
}

void validate_settings(const ModelConfig& c, const TrainSettings& s, const std::string& what) {
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) {
    const char* mode = mode_name(c.layer_modes[L]);
    HMLA_CHECK(!s.mqa_split_kv_b_proj || latent_mqa_enabled(c, L), ConfigError, what,
               ": mqa_split_kv_b_proj is set but layer ", L, " runs ", mode,
               ", which does not use latent MQA; unset it or use mqa_full_causal / dsa_sparse");
    HMLA_CHECK(!(s.train_indexer_only && c.layer_modes[L] == LayerMode::dsa_sparse), ConfigError,
               what, ": train_indexer_only with layer ", L,
               " in dsa_sparse; dsa_sparse trains the backbone too (use dsa_warmup)");
  }
}

}  // namespace hmla
