// `hmla layer --settings FILE`: reads the YAML of the layer's options (layer_settings.h) key by
// key into its settings, refusing unknown keys and ill-typed values with one-line errors.
#include "layer_settings.h"

#include "hmla/core/error.h"
#include "hmla/io/safetensors.h"
#include "hmla/train/yaml_map.h"

namespace hmla::app {

LayerSettings parse_layer_settings(const std::string& text, const std::string& what) {
  const YAML::Node root = load_yaml(text, what);
  LayerSettings s;
  if (root.IsNull()) return s;
  HMLA_CHECK(root.IsMap(), ConfigError, what, ": settings must be a mapping of key: value");
  for_each_key(root, what, [&](const std::string& key, const YAML::Node& v) {
    if (key == "mqa_split_kv_b_proj") s.mqa_split_kv_b_proj = yaml_get<bool>(v, key, what);
    else if (key == "train_indexer_only") s.train_indexer_only = yaml_get<bool>(v, key, what);
    else
      throw ConfigError(what + ": unknown key '" + key +
                        "' (known: mqa_split_kv_b_proj, train_indexer_only; see docs/config.md)");
  });
  return s;
}

LayerSettings load_layer_settings(const std::string& path) {
  return parse_layer_settings(io::read_file(path), path);
}

void validate_layer_settings(const ModelConfig& c, const LayerSettings& s, const std::string& what) {
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

}  // namespace hmla::app
