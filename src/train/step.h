// One optimizer step of a phase over the rank grid, and its metrics row.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "hmla/core/cuda.h"

#include "hmla/data/loader.h"
#include "hmla/train/metrics.h"
#include "hmla/train/optim.h"
#include "hmla/train/programme.h"
#include "rank_grid.h"

namespace hmla::train {

struct StepResult {
  double lm = 0, kl = 0;  // the step's global LM loss and indexer KL
  double kl_csa = NAN, kl_hybrid = NAN;  // a V4 stack's KL per layer kind (NaN: the kind ran none)
  double mtp = NAN;       // the step's global MTP loss (mean over depths, without coeff); NaN: none
  AttnMass attn_mass = no_attn_mass();  // a V4 stack's logging step: the global attention mass per kind
  int64_t tokens = 0;
  OptimStats os;
  double seconds = 0;
  CudaCounters cuda;  // what the step cost the host in device work (zero on the CPU)
  // MoE models (docs/moe.md "Load balancing"): per MoE layer, the imbalance of the step's global
  // load and, where the balance loss ran, its global value (alpha included).
  std::vector<int64_t> moe_layers;
  std::vector<double> moe_imbalance, moe_aux_loss;
  int64_t ep_bytes = -1;  // expert parallelism: the bytes this rank sent its EP group in the step (-1: no EP)
};

// The step's micro-batches dealt round-robin to the data-parallel ranks, gradients (into
// `garena`, whose views are `grads`: optim.grad_views) and losses summed over the whole grid (a
// sharded optimizer's gradients over the grid to each tensor's owner), then the update. A
// non-finite loss or gradient norm stops the run (DivergenceError naming the phase, the step and
// the quantity) before the optimizer moves a weight. A logging step (log_step) of a DeepSeek-V4
// stack also measures its attention mass (StepOptions::attn_mass) over the whole grid's loss rows.
StepResult train_step(RankGrid& grid, const PhaseSettings& ph, int64_t step, Model& model, Optimizer& optim,
                      PackedLoader& loader, Tensor& garena, io::TensorMap& grads, bool log_step);

// The step's row of metrics.jsonl (indexer_kl in dsa phases only; peak_bytes: the device's
// allocator peak over the step).
MetricsRow step_row(const PhaseSettings& ph, int64_t step, const StepResult& r, Device dev);

}  // namespace hmla::train
