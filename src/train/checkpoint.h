// Checkpoints (docs/programme.md, "Run directory"): out/checkpoints/<name>/{config.json,
// model.safetensors, optimizer.safetensors (sharded: optimizer-R-of-N.safetensors), state.json},
// written atomically, and where a run
// starts: fresh (an init_checkpoint or a seeded initialisation) or from the latest checkpoint.
#pragma once
#include <filesystem>
#include <ostream>
#include <string>

#include "hmla/train/optim.h"
#include "hmla/train/run_state.h"
#include "hmla/train/trainer.h"
#include "run_inputs.h"

namespace hmla::train {

// "<phase index>-<phase name>-<what>" (what: "step<k>" or "end").
std::string checkpoint_name(int64_t phase, const PhaseSettings& ph, const std::string& what);

// Built in a temporary directory (from host copies of a device's tensors) and renamed into
// place; then ckroot/latest names it. A diverged model (a non-finite weight) is never saved, and
// a failed save leaves no temporary directory behind. Rank 0 of `comm` writes it; with per-rank
// optimizer state (Optimizer::state_per_rank: sharded, or expert parallel) every rank calls it and
// writes its moments (optimizer_shard_name) into the directory rank 0 made, which must therefore be
// on a filesystem every rank sees; under expert parallelism every rank also sends rank 0 its experts.
void save_checkpoint(const std::filesystem::path& ckroot, const std::string& name, const Model& m, const Optimizer& o,
                     const RunState& st, Comm& comm);
// "optimizer-00002-of-00004.safetensors": rank 1 of 4's moments, keyed by tensor name.
std::string optimizer_shard_name(int rank, int ranks);
// A checkpoint's optimizer state: optimizer.safetensors (one arena per moment), else every
// optimizer-R-of-N file merged (IoError for a missing file or a tensor held twice);
// Optimizer::load_state takes either, whatever the rank count now.
io::TensorMap load_optimizer_state(const std::filesystem::path& dir);
// The run's final config.json and model.safetensors in `out` from host_params (a diverged model is
// never saved).
void save_final_model(const std::filesystem::path& out, const Model& model, const io::TensorMap& params);

// Where the run starts: its state (phase 0, step 0 unless resumed), the model, and a resumed
// phase's optimizer state.
struct RunStart {
  RunState st;
  Model model;
  io::TensorMap opt_state;
  size_t initialised = 0;  // MTP tensors the checkpoint lacked, initialised from the seed (load_checkpoint_into_model)
};

// A new run: the init_checkpoint's weights (with the indexers it holds) or a random
// initialisation from the seed.
// Under expert parallelism (`ep`) each rank builds and loads its own table (build_model).
RunStart start_fresh(const Programme& pr, const ModelConfig& cfg, Device dev, Comm* ep = nullptr);
// --resume: the latest checkpoint of this run, once the data, the programme and metrics.jsonl
// are known to be the ones it was written with and its data position lies inside its document.
RunStart resume_from_latest(const Programme& pr, const TrainOptions& opt, const RunInputs& in, Device dev,
                            std::ostream& log, Comm* ep = nullptr);

}  // namespace hmla::train
