// `hmla layer --settings FILE`: the layer's options as YAML (docs/config.md lists every key).
// Unknown keys are errors, so a typo never silently falls back to a default.
#pragma once
#include <string>

#include "hmla/model/config.h"

namespace hmla::app {

struct LayerSettings {
  bool mqa_split_kv_b_proj = false;  // compute with k_b_proj / v_b_proj (latent modes only)
  bool train_indexer_only = false;   // run only the indexer's backward (dsa modes, not dsa_sparse)
};

LayerSettings parse_layer_settings(const std::string& yaml_text, const std::string& what);
LayerSettings load_layer_settings(const std::string& path);

// Rules that involve the config too: mqa_split_kv_b_proj needs latent_mqa_enabled on every layer;
// train_indexer_only cannot go with dsa_sparse.
void validate_layer_settings(const ModelConfig& c, const LayerSettings& s, const std::string& what);

}  // namespace hmla::app
