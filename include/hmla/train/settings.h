// hmla's own YAML settings for a run (docs/config.md lists every key and its default). Unknown
// keys are errors, so a typo never silently falls back to a default.
#pragma once
#include <cstdint>
#include <string>

#include "hmla/model/config.h"

namespace hmla {

struct TrainSettings {
  bool mqa_split_kv_b_proj = false;  // keep k_b_proj / v_b_proj in memory (latent modes only)
  bool train_indexer_only = false;   // update only the indexers (implied by dsa_warmup)
  uint64_t seed = 0;
};

TrainSettings parse_train_settings(const std::string& yaml_text, const std::string& what);
TrainSettings load_train_settings(const std::string& path);

// Rules that involve both files: mqa_split_kv_b_proj needs latent_mqa_enabled on every layer;
// train_indexer_only cannot go with dsa_sparse.
void validate_settings(const ModelConfig& c, const TrainSettings& s, const std::string& what);

}  // namespace hmla
