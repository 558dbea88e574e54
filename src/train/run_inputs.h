// What every phase of a run reads, loaded and checked before anything is created: the model
// config, which layers are hybrid, the data with its fingerprint, and each phase's memory plan.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "hmla/data/token_set.h"
#include "hmla/text/tokenizer.h"
#include "hmla/train/programme.h"

namespace hmla::train {

struct RunInputs {
  ModelConfig cfg;           // its layer modes left to the phases
  std::vector<bool> hybrid;  // the layers that move through the modes
  TokenSet train, held;
  std::string fingerprint;   // data_fingerprint(train, held)
  text::TokenizerRecord tokenizer;  // what made the data's ids (hmla-run.json, hmla report)
  std::string memory_plan;   // one console line per phase
};

// Reads and checks what the run needs: the data's vocabulary fits the model's, the hybrid layers
// exist, every phase's training step and held-out evaluation fit in memory (MemoryPlan; a rank
// under --cp holds seq_len / cp rows, one under --ep its block of the routed experts); then the data.
RunInputs load_run_inputs(const Programme& pr, int cp_ranks, Device dev, int ep_ranks = 1);

// Each phase's model, as the run builds it: the config in the phase's modes (the MTP layers
// parameters where a phase trains them) and the layers that carry indexer tensors.
struct PhaseModel {
  ModelConfig cfg;
  std::vector<bool> indexer;
};
std::vector<PhaseModel> phase_models(const Programme& pr);

// programme_memory_plan's table (trainer.h) for cp ranks per replica on dev.
std::string memory_plan_table(const Programme& pr, int cp, Device dev);

// The hybrid layers in `mode`, the others mha.
void set_modes(ModelConfig& c, const std::vector<bool>& hybrid, LayerMode mode);
// The layers a phase in `mode` needs an indexer on: the hybrid layers with DSA machinery
// (ModelConfig::has_dsa: a V4 stack's CSA layers), in a dsa mode.
std::vector<bool> phase_indexers(const ModelConfig& c, const std::vector<bool>& hybrid, LayerMode mode);

// The seed of phase p's data loader.
inline uint64_t loader_seed(const Programme& pr, int64_t phase) {
  const int64_t q = pr.phases.at(size_t(phase)).data_phase;  // a control arm reads its sparse phase's data
  return pr.seed + 7919ull * uint64_t((q >= 0 ? q : phase) + 1);
}

}  // namespace hmla::train
