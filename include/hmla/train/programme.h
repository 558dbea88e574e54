// A run's programme (docs/programme.md): an ordered list of phases over a shared base, read from
// YAML. Unknown keys are errors; every phase key has a default.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "hmla/model/config.h"
#include "hmla/ops/attention.h"
#include "hmla/train/optim.h"

namespace hmla {

struct PhaseSettings {
  std::string name;
  LayerMode mode = LayerMode::mha;
  int64_t steps = 0;
  int64_t batch = 8;           // rows per optimizer step (over all micro-batches)
  int64_t micro_batches = 1;   // divides batch
  int64_t seq_len = 256;
  OptimSettings optim;         // total_steps = steps
  int64_t checkpoint_every = 0;  // 0: at the end of the phase only
  int64_t log_every = 10;
  double equivalence_rtol = 1e-4;
  int64_t eval_rows = 16;
  bool recompute_attention = false;
  bool mqa_split_kv_b_proj = false;  // latent modes only (Model::split_kv_b_proj)
  // MoE load balancing (docs/moe.md): the correction bias's step after each optimizer step, and
  // the sequence-wise balance loss's alpha; 0 turns either off; neither acts in dsa_warmup.
  double moe_bias_update_rate = 1e-3;
  double moe_aux_loss_coeff = 1e-4;
  // Quality parity (docs/programme.md "The control arm"): `control: dense` on a dsa_sparse phase
  // runs a control arm, a phase "<name>-control" in mode mha with the same settings and data, just
  // before it, from the same model; the sparse phase then restarts from the end checkpoint of the
  // phase before the control. Set by the parser on the phases it expands:
  std::string control;        // the key as written ("dense"), on the sparse phase
  int64_t control_of = -1;    // on the control arm: the index of its sparse phase
  int64_t restart_from = -1;  // on the sparse phase: enter from this phase's end checkpoint
  int64_t data_phase = -1;    // the phase index whose data order it reads (-1: its own)
  // DeepSeek-V4 stacks with num_nextn_predict_layers > 0: lambda of the multi-token-prediction loss
  // (docs/deepseek_v4_math.md section 14), added to the LM loss; 0 keeps the MTP layers as stored.
  double mtp_loss_coeff = 0;
};

struct Programme {
  std::string path;          // the YAML file; relative paths below are relative to it
  std::string model_config;  // HF config.json
  std::string data_dir;      // prepared by hmla prepare-data
  std::string init_checkpoint;  // optional: start from these weights
  uint64_t seed = 0;
  std::vector<int64_t> hybrid_layers;  // the layers that move through the modes (empty: all)
  std::string device = "cpu";          // where it trains unless `hmla train --device` says (cpu, cuda)
  AttnBackend attention_backend = AttnBackend::auto_;  // the dense attention's on CUDA (hmla/ops/attention.h)
  std::vector<PhaseSettings> phases;
  // The raw key/value text of the base and of each phase's own entries (for the config-delta test).
  std::map<std::string, std::string> base_raw;
  std::vector<std::map<std::string, std::string>> phase_raw;
};

Programme load_programme(const std::string& path);
Programme parse_programme(const std::string& yaml_text, const std::string& path);

}  // namespace hmla
