// Optimizers (docs/optim.md): AdamW, and Muon for 2-D weight matrices with AdamW for 1-D
// tensors, embeddings and the head. Two parameter groups with their own learning rates and clip
// norms: the backbone and the indexers (tensors named "...indexer..."). Sharded (ZeRO-1,
// hmla/train/zero.h): each rank of a group keeps the moments of the whole tensors it owns.
// Expert parallelism (Model::ep): a rank's experts are summed and sharded over their own group.
#pragma once
#include <string>

#include "hmla/model/model.h"
#include "hmla/train/zero.h"

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

// The groups a step's gradients are summed over (DESIGN.md section 8, docs/scale_out.md): `all`
// (the whole grid, CP x DP) for the tensors every rank holds; where the model's experts are sharded
// (Model::ep) `experts` (the ranks holding the same block) for the rank's routed experts, the table's
// last entries from Model::first_expert. shard: ZeRO-1, each group's moments sharded over it. Null
// groups: one rank (nothing is summed).
struct GradGroups {
  Comm* all = nullptr;
  Comm* experts = nullptr;
  bool shard = false;
};

class Optimizer {
 public:
  // indexer_only: only the indexers' tensors are updated (dsa_warmup); train_mtp false: the
  // multi-token-prediction layers' (mtp.*, where they are parameters) are not (mtp_loss_coeff 0).
  Optimizer(const Model& m, const OptimSettings& o, bool indexer_only, bool train_mtp = true, GradGroups groups = {});
  // Whether the update moves this table entry (the phase trains it, it is a gradient parameter).
  bool updates(const ParamSpec& p) const;
  // Clips each group to its norm, then updates m's parameters from `grads` (same table); one
  // read-back, and a DivergenceError for a non-finite norm, with no weight or moment moved.
  OptimStats step(Model& m, io::TensorMap& grads, int64_t step);
  // Unsharded: the step's partial gradients (a gradient arena of the model's table) summed in
  // place, each part over its group (GradGroups).
  void allreduce_gradients(const Tensor& garena);
  // The same launched on the step's device stats (hmla/ops/optim.h), reading nothing back: the
  // groups' sums of squares, norms, clip scales and finite flag land in `stats` (f64
  // [kStatCount]); nothing moves when bad (f32 [1], the ranks with a non-finite loss) is not 0
  // or a norm is not finite. Under expert parallelism the experts' squares are summed over the
  // EP group (Model::ep: every block once).
  void launch_step(Model& m, io::TensorMap& grads, int64_t step, const Tensor& stats, const Tensor& bad);
  // The norms and lr of a stats buffer read back after launch_step; DivergenceError (nothing
  // moved) for a non-finite norm.
  OptimStats stats_of(const std::vector<double>& stats, int64_t step) const;
  // Sharded only: the gradient arena's size and views (owner-ordered, zero.h; the backward writes
  // every tensor's partial sum there), and the whole step on it: the sums reduce-scattered to
  // their owners, the norms' squares summed over the group, clip and gate as launch_step, each
  // owner's update, then the updated weights all-gathered through the arena (it holds weights,
  // not gradients, afterwards) and the compute copies refreshed.
  bool sharded() const { return groups_.shard && groups_.all; }
  int64_t grad_arena_numel(const Model& m) const;
  io::TensorMap grad_views(const Tensor& arena) const;
  void launch_sharded_step(Model& m, const Tensor& garena, int64_t step, const Tensor& stats, const Tensor& bad);
  // State for checkpoints and its restore. Unsharded on whole tables: one arena of the model's
  // table each ("optimizer.m", "optimizer.v"). Sharded, or under expert parallelism: what this rank
  // writes, keyed by name ("m.<name>", "v.<name>"): its owned tensors; unsharded, the replicated
  // tensors on the grid's rank 0 and the experts on their group's rank 0, so every tensor is in one
  // rank's file (state_per_rank). load_state takes either layout whatever this optimizer's, so a
  // checkpoint resumes on another rank count, sharding or expert split (a tensor the file lacks must
  // be one this optimizer does not update).
  bool state_per_rank() const { return sharded() || groups_.experts; }
  io::TensorMap state() const;
  void load_state(const io::TensorMap& s, const std::string& what);

 private:
  void update(Model& m, const io::TensorMap& grads, int64_t step, const Tensor& stats);
  // A run of the table summed over one group: the replicated tensors, then (expert parallelism)
  // this rank's experts. Sharded: its placement over the group, its part of the owner-ordered
  // gradient arena from `at`, and this rank's block of the reduced gradients.
  struct Segment {
    Comm* comm = nullptr;
    size_t first = 0, end = 0;  // table entries
    int64_t numel = 0;          // their values (unsharded: the segment's length in the arena)
    ShardPlan plan;
    int64_t at = 0;
    Tensor gshard;
  };
  OptimSettings o_;
  bool indexer_only_, train_mtp_;
  GradGroups groups_;
  Comm* ep_ = nullptr;                 // the model's EP group (Model::ep)
  std::vector<ParamSpec> table_;       // the model's (this rank's)
  std::vector<ParamSpec> full_table_;  // every expert's (what a checkpoint's state names)
  std::vector<Segment> segs_;
  io::TensorMap gowned_;   // sharded: the owned tensors' reduced gradients (views of the segments' gshard)
  Tensor m_arena_, v_arena_;
  io::TensorMap m_, v_;    // the tensors this rank keeps moments for
};

}  // namespace hmla
