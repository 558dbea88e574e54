// The ranks of a run (docs/scale_out.md, "The rank grid"): consecutive ranks form a
// context-parallel group (CP traffic is the heavier, so it stays between neighbours); the groups
// are the data-parallel replicas. Rank 0 alone owns the run directory.
#pragma once
#include "hmla/dist/comm.h"
#include "hmla/train/programme.h"
#include "hmla/train/run_dir.h"
#include "hmla/train/trainer.h"

namespace hmla::train {

struct RankGrid {
  Comm& world;
  Comm cp;                  // this rank's context-parallel group
  int dp = 1, dp_rank = 0;  // the data-parallel replicas, and this rank's
  // Expert parallelism (--ep E): E consecutive data-parallel replicas of the same context-parallel
  // rank split each MoE layer's routed experts (DESIGN.md section 8); one rank: no EP.
  Comm ep;
  // The ranks holding the same block of experts as this one (the same EP rank in every EP group,
  // at every CP rank): world / E ranks, over which its experts' gradients are summed.
  Comm experts;
  bool root() const { return world.is_root(); }
  // Expert parallelism's group for the model (build_model's `ep`); null without EP.
  Comm* model_ep() { return ep.size() > 1 ? &ep : nullptr; }
};

// Checks that --cp divides the ranks and every phase's seq_len, that the data-parallel replicas
// divide every phase's micro_batches, and that --ep divides the replicas.
RankGrid set_up_rank_grid(const Programme& pr, int cp_ranks, int ep_ranks = 1);

// RunDir::claim and RunDir::begin on rank 0; the other ranks wait in a barrier for its verdict:
// a refusal ends the job with rank 0's message (main's Comm::abort reaches them there), so no
// rank trains on a directory nobody holds.
RunDir claim_on_root(const Programme& pr, const TrainOptions& opt, Comm& comm);
void begin_on_root(RunDir& d, Comm& comm, Device dev, const text::TokenizerRecord& tokenizer);

}  // namespace hmla::train
