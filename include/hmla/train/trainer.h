// Runs a programme (DESIGN.md section 7): phases in order, the checkpoint carried over, the
// optimizer fresh per phase, the MHA/MQA equivalence check when a phase enters a latent mode,
// missing indexers initialised when a phase needs them, checkpoints as directories written
// atomically, metrics as JSON lines, a progress line and an end-of-run table.
#pragma once
#include <functional>
#include <ostream>
#include <string>

#include "hmla/train/programme.h"

namespace hmla {

struct TrainOptions {
  std::string out_dir = "runs/latest";
  bool resume = false;  // continue from out_dir/checkpoints/latest
  bool allow_safe_changes = false;  // --resume may change steps/log_every/checkpoint_every/eval_rows ahead
  int cp = 1;           // context-parallel ranks; the rest of the world is data parallel
  std::string cp_split = "contiguous";  // the only split (check_cp_split)
  std::string device;   // cpu or cuda; empty: the programme's `device` (default cpu)
  // ZeRO-1 (docs/scale_out.md): each rank keeps the optimizer moments of its whole tensors only;
  // gradients reduce-scattered to their owners, updated weights all-gathered. One rank: unsharded.
  bool shard_optimizer = false;
  // Expert parallelism (docs/scale_out.md "Expert parallel"): E data-parallel replicas split each
  // MoE layer's routed experts, the rows travelling by all-to-all. CPU only so far.
  int ep = 1;
  // A test seam: called on every rank with its rank once the rank grid stands, before anything
  // is read or written; what it throws ends the run as any error does. `hmla train` sets it from
  // HMLA_TEST_FAIL_RANK (app/cmd_train.cpp) for tests/python/mpi_dp.py.
  std::function<void(int rank)> on_rank_ready;
};

// The device a run computes on: `requested` ("cpu", "cuda"), checked against the build and the
// machine (ConfigError naming what is missing).
Device training_device(const std::string& requested);

// Thrown when SIGINT stopped the run; the last complete checkpoint is intact.
struct Interrupted : Error {
  using Error::Error;
};

// Under MPI every rank runs this with the same arguments: each optimizer step's micro-batches are
// dealt round-robin to the data-parallel ranks (micro_batches must be a multiple of their
// number), gradients are SUM all-reduced, losses use the step's global counts, and rank 0 alone
// writes the console, metrics, checkpoints and the summary.
void run_programme(const Programme& pr, const TrainOptions& opt, std::ostream& log);

// `hmla train --memory-plan`: each phase's memory plan item by item (parameters, gradients, the
// optimizer's moments, a micro-batch's activations by kind; lower bounds), on the run's device,
// without the budget check, the data or any allocation (CUDA's plan needs no visible device), and
// whether it fits the budget. Reads the programme's model config only. seq_lens: one plan per
// sequence length, every phase's seq_len replaced (empty: the programme's own).
std::string programme_memory_plan(const Programme& pr, const TrainOptions& opt, const std::vector<int64_t>& seq_lens = {});

}  // namespace hmla
