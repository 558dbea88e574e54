// Checkpoint save (atomic: a temporary directory renamed into place) and load, with the resume's
// checks of the data, the programme and metrics.jsonl against what the checkpoint recorded.
#include "checkpoint.h"

#include <cstdio>

#include "hmla/data/loader.h"
#include "hmla/io/safetensors.h"
#include "hmla/model/indexer.h"
#include "hmla/train/metrics.h"
#include "hmla/train/run_dir.h"

namespace hmla::train {

namespace fs = std::filesystem;

namespace {

// Removes a checkpoint's temporary directory unless the save got as far as renaming it into
// place, so a failed save (disk full, a bad tensor) leaves no .tmp directory behind.
struct RemoveUnlessKept {
  fs::path path;
  bool kept = false;
  ~RemoveUnlessKept() {
    std::error_code ec;
    if (!kept) fs::remove_all(path, ec);
  }
};

void check_finite_weights(const io::TensorMap& params) {
  for (const auto& [name, t] : params)
    if (const int64_t i = first_non_finite(t); i >= 0)
      throw DivergenceError("parameter '" + name + "' became non-finite (" + std::to_string(t.data<float>()[i]) +
                            " at flat index " + std::to_string(i) + ")");
}

io::TensorMap host_tensors(const io::TensorMap& m) {
  io::TensorMap h;
  for (const auto& [name, t] : m) h[name] = t.on(Device::cpu);
  return h;
}

// The programme of a resumed run must be the one that wrote it (programme.json), but for the keys
// --allow-safe-changes admits.
void check_same_programme(const Programme& pr, const fs::path& saved, int64_t from_phase, bool allow_safe) {
  if (!fs::exists(saved)) return;  // a run from before hmla kept it
  const std::vector<std::string> changed =
      programme_changes(io::read_file(saved.string()), programme_json(pr), from_phase, allow_safe, saved.string());
  if (changed.empty()) return;
  std::string list;
  for (const std::string& c : changed) list += (list.empty() ? "" : "; ") + c;
  throw ConfigError(pr.path + ": the programme differs from the one this run started with (" + saved.string() +
                    "): " + list + (allow_safe ? "" : " (--allow-safe-changes admits steps, log_every, "
                                                        "checkpoint_every and eval_rows of the current and later phases)"));
}

}  // namespace

std::string checkpoint_name(int64_t phase, const PhaseSettings& ph, const std::string& what) {
  return std::to_string(phase) + "-" + ph.name + "-" + what;
}

std::string optimizer_shard_name(int rank, int ranks) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "optimizer-%05d-of-%05d.safetensors", rank + 1, ranks);
  return buf;
}

void save_checkpoint(const fs::path& ckroot, const std::string& name, const Model& m, const Optimizer& o,
                     const RunState& st, Comm& comm) {
  const bool root = comm.is_root();
  const io::TensorMap params = root || m.ep ? host_params(m) : io::TensorMap{};  // under EP every rank sends its experts
  const fs::path dir = ckroot / name, tmp = ckroot / ("." + name + ".tmp"), old = ckroot / ("." + name + ".old");
  RemoveUnlessKept cleanup{root ? tmp : fs::path()};
  cleanup.kept = !root;  // the other ranks only add their files
  if (root) {
    check_finite_weights(params);
    fs::remove_all(tmp);
    fs::create_directories(tmp);  // the first checkpoint also creates checkpoints/
    save_model_config((tmp / "config.json").string(), m.cfg);
    save_model_weights(tmp.string(), m, params);  // parameters, integer tables (I64), the kept MTP tensors
    if (!o.state_per_rank()) io::save_safetensors((tmp / "optimizer.safetensors").string(), host_tensors(o.state()));
    io::write_file_atomic((tmp / "state.json").string(), run_state_json(st));
  }
  if (o.state_per_rank()) {  // each rank its own moments, keyed by name, once the root made the directory
    comm.barrier();
    io::save_safetensors((tmp / optimizer_shard_name(comm.rank(), comm.size())).string(), host_tensors(o.state()));
    comm.barrier();
  }
  if (!root) return;
  if (fs::exists(dir)) fs::rename(dir, old);
  fs::rename(tmp, dir);
  cleanup.kept = true;
  fs::remove_all(old);
  io::write_file_atomic((ckroot / "latest").string(), name + "\n");
}

io::TensorMap load_optimizer_state(const fs::path& dir) {
  if (fs::exists(dir / "optimizer.safetensors")) return io::load_safetensors((dir / "optimizer.safetensors").string());
  // A sharded run's files: optimizer-R-of-N for every R of one N, each tensor's moments in one.
  int ranks = -1;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    int r = 0, n = 0;
    char tail[32] = {};
    if (std::sscanf(e.path().filename().string().c_str(), "optimizer-%d-of-%d.%31s", &r, &n, tail) != 3) continue;
    HMLA_CHECK(ranks < 0 || ranks == n, IoError, dir.string(), ": optimizer shards of ", ranks, " and of ", n,
               " ranks; a checkpoint holds one run's");
    ranks = n;
  }
  HMLA_CHECK(ranks > 0, IoError, dir.string(), ": no optimizer state (optimizer.safetensors or optimizer-*-of-*.safetensors)");
  io::TensorMap all;
  for (int r = 0; r < ranks; ++r) {
    const fs::path f = dir / optimizer_shard_name(r, ranks);
    HMLA_CHECK(fs::exists(f), IoError, f.string(), " is missing: the checkpoint's optimizer state is incomplete");
    for (auto& [key, t] : io::load_safetensors(f.string()))
      HMLA_CHECK(all.emplace(key, std::move(t)).second, IoError, f.string(), ": '", key,
                 "' is also in another shard; a checkpoint holds each tensor's state once");
  }
  return all;
}

void save_final_model(const fs::path& out, const Model& model, const io::TensorMap& params) {
  check_finite_weights(params);
  save_model_config((out / "config.json").string(), model.cfg);
  save_model_weights(out.string(), model, params);
}

RunStart start_fresh(const Programme& pr, const ModelConfig& cfg, Device dev, Comm* ep) {
  RunStart s;
  if (!pr.init_checkpoint.empty()) {
    CheckpointTensors ck = read_checkpoint(pr.init_checkpoint, cfg);
    s.model = build_model(cfg, checkpoint_indexers(cfg, ck.tensors), dev, ep);
    s.initialised = load_checkpoint_into_model(s.model, std::move(ck), pr.init_checkpoint, pr.seed).size();
  } else {
    s.model = build_model(cfg, std::vector<bool>(cfg.num_hidden_layers, false), dev, ep);
    init_model(s.model, pr.seed);
  }
  return s;
}

RunStart resume_from_latest(const Programme& pr, const TrainOptions& opt, const RunInputs& in, Device dev,
                            std::ostream& log, Comm* ep) {
  const fs::path out(opt.out_dir), dir = latest_checkpoint(out / "checkpoints");
  const std::string name = dir.filename().string();
  const ModelConfig saved = load_model_config((dir / "config.json").string());
  RunStart s;
  s.st = parse_run_state(io::read_file((dir / "state.json").string()), (dir / "state.json").string(), pr, in.train);
  HMLA_CHECK(s.st.data_fingerprint.empty() || s.st.data_fingerprint == in.fingerprint, ConfigError, pr.data_dir,
             ": the data differs from what the run read (checkpoint: ", s.st.data_fingerprint, "; now: ",
             in.fingerprint, "); resume with the data the run started on");
  check_same_programme(pr, out / "programme.json", s.st.phase, opt.allow_safe_changes);
  check_metrics_length(out / "metrics.jsonl", s.st.metrics_bytes);
  if (s.st.step > 0)  // the position must lie inside its document before anything is written
    PackedLoader(in.train, pr.phases[s.st.phase].seq_len, loader_seed(pr, s.st.phase)).seek(s.st.data_pos);
  ModelConfig cfg = in.cfg;
  cfg.layer_modes = saved.layer_modes;
  CheckpointTensors ck = read_checkpoint((dir / "model.safetensors").string(), cfg);
  s.model = build_model(cfg, checkpoint_indexers(cfg, ck.tensors), dev, ep);
  s.initialised = load_checkpoint_into_model(s.model, std::move(ck), (dir / "model.safetensors").string(), pr.seed).size();
  s.opt_state = load_optimizer_state(dir);
  log << "resuming " << name << " at phase " << s.st.phase << ", step " << s.st.step << "\n";
  return s;
}

}  // namespace hmla::train
