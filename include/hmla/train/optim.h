// Optimizers (docs/optim.md): AdamW, and Muon for 2-D weight matrices with AdamW for 1-D
// tensors, embeddings and the head. Two parameter groups with their own learning rates and clip
// norms: the backbone and the indexers (tensors named "...indexer...").
#pragma once
#include <string>

#include "hmla/model/model.h"

namespace hmla {

struct OptimSettings {
  std::string optimizer = "adamw";  // adamw | muon
  double lr = 1e-3, indexer_lr = 1e-3, min_lr_ratio = 0.1;
  int64_t warmup_steps = 0, total_steps = 1;
  double weight_decay = 0.0, beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double clip_backbone = 1.0, clip_indexer = 1.0;  // <= 0: no clipping
  double muon_momentum = 0.95;
  int muon_ns_steps = 5;
};

bool is_indexer_tensor(const std::string& name);

// Warmup (linear from lr/warmup) then cosine to lr * min_lr_ratio at total_steps.
double lr_at(const OptimSettings& o, double base_lr, int64_t step);

struct OptimStats {
  double grad_norm_backbone = 0, grad_norm_indexer = 0, lr = 0;
};

class Optimizer {
 public:
  // indexer_only: only the indexers' tensors are updated (dsa_warmup); train_mtp false: the
  // multi-token-prediction layers' (mtp.*, where they are parameters) are not (mtp_loss_coeff 0).
  Optimizer(const Model& m, const OptimSettings& o, bool indexer_only, bool train_mtp = true);
  // Clips each group to its norm, then updates m's parameters from `grads` (same table); one
  // read-back, and a DivergenceError for a non-finite norm, with no weight or moment moved.
  OptimStats step(Model& m, io::TensorMap& grads, int64_t step);
  // The same launched on the step's device stats (hmla/ops/optim.h), reading nothing back: the
  // groups' sums of squares, norms, clip scales and finite flag land in `stats` (f64
  // [kStatCount]); nothing moves when bad (f32 [1], the ranks with a non-finite loss) is not 0
  // or a norm is not finite.
  void launch_step(Model& m, io::TensorMap& grads, int64_t step, const Tensor& stats, const Tensor& bad);
  // The norms and lr of a stats buffer read back after launch_step; DivergenceError (nothing
  // moved) for a non-finite norm.
  OptimStats stats_of(const std::vector<double>& stats, int64_t step) const;
  // State for checkpoints (one arena of the model's table each) and its restore.
  io::TensorMap state() const;
  void load_state(const io::TensorMap& s, const std::string& what);

 private:
  OptimSettings o_;
  bool indexer_only_, train_mtp_;
  std::vector<ParamSpec> table_;
  Tensor m_arena_, v_arena_;
  io::TensorMap m_, v_;
};

}  // namespace hmla
