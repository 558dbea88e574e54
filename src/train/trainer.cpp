#include "hmla/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <tuple>

#include "hmla/core/cuda.h"
#include "hmla/dist/comm.h"
#include "hmla/io/safetensors.h"
#include "hmla/model/indexer.h"
#include "hmla/ops/cpu_blas.h"
#include "hmla/train/data.h"
#include "hmla/train/run_dir.h"
#include "hmla/train/run_state.h"

namespace hmla {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

volatile std::sig_atomic_t g_stop = 0;
void on_sigint(int) { g_stop = 1; }

// While a run holds it, SIGINT only asks the run to stop after its current step (the step's
// checkpoint, if due, is not written; the last complete one stays intact). The previous handler
// comes back however the run ends.
class SigintCatcher {
 public:
  SigintCatcher() : old_((g_stop = 0, std::signal(SIGINT, on_sigint))) {}
  ~SigintCatcher() { std::signal(SIGINT, old_); }
  SigintCatcher(const SigintCatcher&) = delete;
  SigintCatcher& operator=(const SigintCatcher&) = delete;
  bool stop_requested() const { return g_stop != 0; }

 private:
  void (*old_)(int);
};

// The rank grid: consecutive ranks form a context-parallel group (CP traffic is the heavier, so
// it stays between neighbours); the groups are the data-parallel replicas.
struct RankGrid {
  Comm& world;
  Comm cp;                  // this rank's context-parallel group
  int dp = 1, dp_rank = 0;  // the data-parallel replicas, and this rank's
  bool root() const { return world.is_root(); }
};

// Checks that --cp divides the ranks and every phase's seq_len, and that the data-parallel
// replicas divide every phase's micro_batches.
RankGrid set_up_rank_grid(const Programme& pr, int cp_ranks) {
  Comm& comm = Comm::world();
  HMLA_CHECK(cp_ranks >= 1 && comm.size() % cp_ranks == 0, ConfigError, "--cp ", cp_ranks, " does not divide the ",
             comm.size(), " ranks");
  const int dp = comm.size() / cp_ranks, dp_rank = comm.rank() / cp_ranks;
  RankGrid grid{comm, comm.split(dp_rank, comm.rank() % cp_ranks), dp, dp_rank};
  for (const PhaseSettings& ph : pr.phases) {
    HMLA_CHECK(ph.micro_batches % dp == 0, ConfigError, pr.path, ": phase '", ph.name, "' has micro_batches = ",
               ph.micro_batches, ", which the ", dp, " data-parallel ranks must divide");
    HMLA_CHECK(ph.seq_len % cp_ranks == 0, ConfigError, "--cp ", cp_ranks, " must divide phase '", ph.name,
               "''s seq_len ", ph.seq_len);
  }
  return grid;
}

std::vector<bool> hybrid_mask(const Programme& pr, int64_t layers) {
  std::vector<bool> h(layers, pr.hybrid_layers.empty());
  for (int64_t L : pr.hybrid_layers) {
    HMLA_CHECK(L >= 0 && L < layers, ConfigError, pr.path, ": hybrid layer ", L, " does not exist (", layers, " layers)");
    h[L] = true;
  }
  return h;
}

void set_modes(ModelConfig& c, const std::vector<bool>& hybrid, LayerMode mode) {
  for (size_t L = 0; L < hybrid.size(); ++L) c.layer_modes[L] = hybrid[L] ? mode : LayerMode::mha;
}

// A model for `cfg` carrying over every tensor of `old`; indexers new to it are initialised.
Model rebuild(const Model& old, const ModelConfig& cfg, const std::vector<bool>& has_indexer, uint64_t seed, int& created) {
  Model m = build_model(cfg, has_indexer, old.device());
  created = 0;
  for (const ParamSpec& p : m.table)
    if (old.params.count(p.name)) m.params.at(p.name).copy_from(old.params.at(p.name));
  for (int64_t L = 0; L < cfg.num_hidden_layers; ++L) {
    if (!has_indexer[L] || (L < int64_t(old.has_indexer.size()) && old.has_indexer[L])) continue;
    io::TensorMap w;
    created += indexer_init_missing(w, cfg, seed * 1000003ull + uint64_t(L));
    for (auto& [name, t] : w) m.params.at(layer_prefix(L) + "self_attn." + name).copy_from(t);
  }
  return m;
}

// max |logits_mqa - logits_mha| and max |logits_mha| with the hybrid layers in each form (over
// the context-parallel group's rows).
std::pair<double, double> equivalence(const Model& m, const std::vector<bool>& hybrid, const Batch& batch, Comm& cp) {
  Model a = m, b = m;
  set_modes(a.cfg, hybrid, LayerMode::mha);
  set_modes(b.cfg, hybrid, LayerMode::mqa_full_causal);
  auto la = model_logits(a, batch, nullptr, cp).to_vector<float>(), lb = model_logits(b, batch, nullptr, cp).to_vector<float>();
  double r[2] = {0, 0};  // diff, magnitude
  for (size_t i = 0; i < la.size(); ++i) {
    r[0] = std::max(r[0], std::abs(double(lb[i]) - la[i]));
    r[1] = std::max(r[1], std::abs(double(la[i])));
  }
  cp.allreduce_max(r, 2);
  return {r[0], r[1]};
}

void write_json_atomic(const fs::path& p, const json& j) { io::write_file_atomic(p.string(), j.dump(2) + "\n"); }

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

// Rank 0 alone owns the run directory (RunDir). The other ranks wait in these barriers for its
// verdict: a refusal ends the job with rank 0's message (main's Comm::abort reaches them here),
// so no rank trains on a directory nobody holds.
RunDir claim_on_root(const Programme& pr, const TrainOptions& opt, Comm& comm) {
  RunDir d;
  if (comm.is_root()) d = RunDir::claim(pr, opt.out_dir, opt.resume);
  comm.barrier();
  return d;
}
void begin_on_root(RunDir& d, Comm& comm, Device dev) {
  if (comm.is_root()) d.begin(dev);
  comm.barrier();
}

// The parameters as host tensors (one copy of the arena off a device; the arena itself on the CPU).
io::TensorMap host_params(const Model& m) { return arena_views(m.table, m.arena.on(Device::cpu)); }

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

// out/checkpoints/<name>/{config.json, model.safetensors, optimizer.safetensors, state.json},
// built in a temporary directory (from host copies of a device's tensors) and renamed into
// place; then `latest` names it.
void save_checkpoint(const fs::path& root, const std::string& name, const Model& m, const Optimizer& o,
                     const RunState& st) {
  const io::TensorMap params = host_params(m);
  check_finite_weights(params);  // a diverged model is never saved
  const fs::path dir = root / name, tmp = root / ("." + name + ".tmp"), old = root / ("." + name + ".old");
  fs::remove_all(tmp);
  fs::create_directories(tmp);  // the first checkpoint also creates checkpoints/
  RemoveUnlessKept cleanup{tmp};
  save_model_config((tmp / "config.json").string(), m.cfg);
  io::save_safetensors((tmp / "model.safetensors").string(), params, {{"format", "pt"}});
  io::save_safetensors((tmp / "optimizer.safetensors").string(), host_tensors(o.state()));
  io::write_file_atomic((tmp / "state.json").string(), run_state_json(st));
  if (fs::exists(dir)) fs::rename(dir, old);
  fs::rename(tmp, dir);
  cleanup.kept = true;
  fs::remove_all(old);
  io::write_file_atomic((root / "latest").string(), name + "\n");
}

std::string fmt_time(double sec) {
  std::ostringstream os;
  const int64_t s = int64_t(sec + 0.5);
  os << s / 60 << "m" << std::setw(2) << std::setfill('0') << s % 60 << "s";
  return os.str();
}

struct PhaseSummary {
  std::string name, mode;
  int64_t steps = 0;
  double first_loss = 0, final_loss = 0, final_kl = 0, heldout = 0, seconds = 0;
  size_t peak = 0;
  std::string heldout_unavailable{};  // why there is no held-out loss (heldout is NaN then)
};

// Before anything is created or allocated: each phase's training step and held-out evaluation
// fit in memory (MemoryPlan; a rank under --cp holds seq_len / cp rows).
// Checks every phase's plan against the budget; returns one line per phase for the console:
// parameters with their gradients and moments, and a micro-batch's activations (lower bounds).
std::string check_programme_memory(const Programme& pr, const ModelConfig& cfg, const std::vector<bool>& hybrid,
                                   int cp, Device dev) {
  std::ostringstream lines;
  for (const PhaseSettings& ph : pr.phases) {
    ModelConfig pc = cfg;
    set_modes(pc, hybrid, ph.mode);
    std::vector<bool> indexer(hybrid.size());
    for (size_t L = 0; L < hybrid.size(); ++L) indexer[L] = hybrid[L] && is_dsa(ph.mode);
    const SizeFactor s = cp > 1 ? SizeFactor{"seq_len / cp", ph.seq_len / cp} : SizeFactor{"seq_len", ph.seq_len};
    const std::string where = pr.path + ": phase '" + ph.name + "'";
    MemoryPlan step, eval;
    plan_parameters(step, pc, indexer, true);
    const int64_t params = step.total();
    plan_activations(step, pc, {"batch / micro_batches", ph.batch / ph.micro_batches}, s, true);
    step.check(where + ": a training step", dev);
    lines << "memory plan [" << ph.name << "]: parameters, gradients and moments " << format_bytes(double(params))
          << ", activations of a micro-batch >= " << format_bytes(double(step.total() - params)) << "\n";
    plan_parameters(eval, pc, indexer, false);
    plan_activations(eval, pc, {"eval_rows", ph.eval_rows}, s, false);
    eval.check(where + ": the held-out evaluation", dev);
  }
  return lines.str();
}

// The held-out LM loss over the phase's fixed rows, or NaN and why there is none: a number only
// when some target was evaluated (a loss over no targets would print as a perfect 0).
std::pair<double, std::string> heldout_loss(const Model& model, const Batch& eval, const TokenSet& held,
                                            int64_t seq_len, Comm& cp) {
  if (count_lm_targets(eval, model.cfg.pad_token_id) == 0) {
    int64_t shortest = -1;
    for (int64_t d = 0; d < held.docs(); ++d) {
      const int64_t len = held.doc_offsets[d + 1] - held.doc_offsets[d];
      shortest = shortest < 0 ? len : std::min(shortest, len);
    }
    if (shortest < 0) return {std::nan(""), "the held-out set has no documents"};
    if (shortest > seq_len)
      return {std::nan(""), "no held-out document fits in seq_len = " + std::to_string(seq_len) + " (the shortest has " +
                                std::to_string(shortest) + " tokens)"};
    return {std::nan(""), "the held-out documents that fit in seq_len have no next-token targets"};
  }
  double loss = model_lm_loss(model, eval, cp);
  cp.allreduce_sum(&loss, 1);
  return {loss, ""};
}

double mean(const std::vector<double>& v, size_t from, size_t to) {
  if (to <= from) return std::nan("");
  double s = 0;
  for (size_t i = from; i < to; ++i) s += v[i];
  return s / double(to - from);
}

uint64_t loader_seed(const Programme& pr, int64_t phase) { return pr.seed + 7919ull * uint64_t(phase + 1); }

// metrics.jsonl as JSON objects (a line that does not parse is an error naming it).
std::vector<json> read_metrics(const fs::path& p) {
  std::vector<json> rows;
  if (!fs::exists(p)) return rows;
  std::istringstream in(io::read_file(p.string()));
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    try {
      rows.push_back(json::parse(line));
    } catch (const json::exception&) {
      throw IoError(p.string() + ": line " + std::to_string(n) + " is not JSON");
    }
  }
  return rows;
}

double number_or_nan(const json& row, const char* key) {
  auto it = row.find(key);
  return it != row.end() && it->is_number() ? it->get<double>() : std::nan("");
}

// On --resume: metrics.jsonl back to the length it had at the checkpoint, so a resumed run's file
// equals an uninterrupted one's (-1: a checkpoint from before hmla recorded it; left as it is).
void check_metrics_length(const fs::path& p, int64_t bytes) {
  const int64_t size = fs::exists(p) ? int64_t(fs::file_size(p)) : 0;
  HMLA_CHECK(bytes < 0 || size >= bytes, IoError, p.string(), ": ", size, " bytes, shorter than the ", bytes,
             " the checkpoint recorded; it was changed after the run");
}

void truncate_metrics(const fs::path& p, int64_t bytes) {
  check_metrics_length(p, bytes);
  if (bytes >= 0) fs::resize_file(p, uintmax_t(bytes));
}

// The step lines of the phase in progress: those after the last phase-end line.
void phase_history(const std::vector<json>& rows, std::vector<double>& losses, std::vector<double>& kls) {
  for (const json& r : rows) {
    if (r.contains("heldout_lm_loss")) losses.clear(), kls.clear();
    if (!r.contains("step")) continue;
    losses.push_back(number_or_nan(r, "lm_loss"));
    kls.push_back(number_or_nan(r, "indexer_kl"));
  }
}

// The end-of-run table from metrics.jsonl (so phases run before a resume are in it too).
std::vector<PhaseSummary> summaries_from_metrics(const Programme& pr, const std::vector<json>& rows) {
  std::vector<PhaseSummary> out;
  size_t peak = 0;
  for (const json& r : rows) {
    if (r.contains("step")) peak = std::max(peak, r.value("peak_bytes", size_t(0)));
    if (!r.contains("heldout_lm_loss") || out.size() >= pr.phases.size()) continue;
    const PhaseSettings& ph = pr.phases[out.size()];
    out.push_back({ph.name, mode_name(ph.mode), ph.steps, number_or_nan(r, "first20_lm_loss"),
                   number_or_nan(r, "last20_lm_loss"), number_or_nan(r, "last20_indexer_kl"),
                   number_or_nan(r, "heldout_lm_loss"), number_or_nan(r, "seconds"), peak});
    if (auto it = r.find("heldout_unavailable"); it != r.end() && it->is_string())
      out.back().heldout_unavailable = it->get<std::string>();
    peak = 0;
  }
  return out;
}

// The programme of a resumed run must be the one that wrote it (programme.json), but for the keys
// --allow-safe-changes admits.
void check_same_programme(const Programme& pr, const fs::path& saved, int64_t from_phase, bool allow_safe) {
  if (!fs::exists(saved)) return;  // a run from before hmla kept it
  const std::vector<std::string> changed =
      programme_changes(io::read_file(saved.string()), programme_json(pr), from_phase, allow_safe);
  if (changed.empty()) return;
  std::string list;
  for (const std::string& c : changed) list += (list.empty() ? "" : "; ") + c;
  throw ConfigError(pr.path + ": the programme differs from the one this run started with (" + saved.string() +
                    "): " + list + (allow_safe ? "" : " (--allow-safe-changes admits steps, log_every, "
                                                        "checkpoint_every and eval_rows of the current and later phases)"));
}

// What every phase reads: the model config (its layer modes left to the phases), which layers
// are hybrid, and the data with its fingerprint.
struct RunInputs {
  ModelConfig cfg;
  std::vector<bool> hybrid;
  TokenSet train, held;
  std::string fingerprint;
  std::string memory_plan;  // one console line per phase
};

// Reads and checks what the run needs before anything is created: the config fits the byte
// tokenizer, the hybrid layers exist, every phase fits in memory; then the data.
RunInputs load_run_inputs(const Programme& pr, int cp_ranks, Device dev) {
  RunInputs in;
  in.cfg = load_model_config(pr.model_config, LayerModesFrom::programme);
  HMLA_CHECK(in.cfg.vocab_size >= kByteVocab, ConfigError, pr.model_config, ": vocab_size ", in.cfg.vocab_size,
             " is smaller than the byte tokenizer's ", kByteVocab);
  in.hybrid = hybrid_mask(pr, in.cfg.num_hidden_layers);
  in.memory_plan = check_programme_memory(pr, in.cfg, in.hybrid, cp_ranks, dev);
  in.train = load_token_set((fs::path(pr.data_dir) / "train.safetensors").string());
  in.held = load_token_set((fs::path(pr.data_dir) / "heldout.safetensors").string());
  in.fingerprint = data_fingerprint(in.train, in.held);
  return in;
}

// Where the run starts: its state (phase 0, step 0 unless resumed), the model, and a resumed
// phase's optimizer state.
struct RunStart {
  RunState st;
  Model model;
  io::TensorMap opt_state;
};

// The layers whose indexer a checkpoint's tensors hold.
std::vector<bool> indexers_in(const io::TensorMap& w, int64_t layers) {
  std::vector<bool> has(layers, false);
  for (int64_t L = 0; L < layers; ++L) has[L] = w.count(layer_prefix(L) + "self_attn.indexer.wk.weight") > 0;
  return has;
}

// --resume: the latest checkpoint of this run, once the data, the programme and metrics.jsonl
// are known to be the ones it was written with and its data position lies inside its document.
RunStart resume_from_latest(const Programme& pr, const TrainOptions& opt, const RunInputs& in, Device dev,
                            std::ostream& log) {
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
  const io::TensorMap w = io::load_safetensors((dir / "model.safetensors").string());
  ModelConfig cfg = in.cfg;
  cfg.layer_modes = saved.layer_modes;
  s.model = build_model(cfg, indexers_in(w, cfg.num_hidden_layers), dev);
  load_into_model(s.model, w, (dir / "model.safetensors").string());
  s.opt_state = io::load_safetensors((dir / "optimizer.safetensors").string());
  log << "resuming " << name << " at phase " << s.st.phase << ", step " << s.st.step << "\n";
  return s;
}

// A new run: the init_checkpoint's weights (with the indexers it holds) or a random
// initialisation from the seed.
RunStart start_fresh(const Programme& pr, const ModelConfig& cfg, Device dev) {
  RunStart s;
  if (!pr.init_checkpoint.empty()) {
    const io::TensorMap w = io::load_checkpoint_tensors(pr.init_checkpoint);
    s.model = build_model(cfg, indexers_in(w, cfg.num_hidden_layers), dev);
    load_into_model(s.model, w, pr.init_checkpoint);
  } else {
    s.model = build_model(cfg, std::vector<bool>(cfg.num_hidden_layers, false), dev);
    init_model(s.model, pr.seed);
  }
  return s;
}

// metrics.jsonl: one JSON object a line, written by rank 0 alone (the other ranks' rows go
// nowhere). A resumed run appends to the file as its checkpoint left it.
class MetricsLog {
 public:
  MetricsLog(bool root, const fs::path& path, bool append) : root_(root) {
    if (root_) file_.open(path, append ? std::ios::app : std::ios::trunc);
  }
  void row(const json& j) {
    if (root_) file_ << j.dump() << "\n" << std::flush;
  }
  int64_t bytes() { return root_ ? int64_t(file_.tellp()) : int64_t(0); }  // for the checkpoint's state
  void close() { file_.close(); }

 private:
  bool root_;
  std::ofstream file_;
};

// What every step of a started run reads.
struct Run {
  const Programme& pr;
  RankGrid& grid;
  const RunInputs& in;
  const fs::path out, ckroot;
  std::ostream& log;  // the console on rank 0, a sink elsewhere
  MetricsLog& metrics;
  const SigintCatcher& sigint;
};

// The model as phase `p` runs it: the hybrid layers in its mode, the others mha, the latent
// layers in the split kv_b_proj form when the phase asks for it, and an indexer on every layer
// that has had one or that the phase's dsa mode needs. The arena is rebuilt only
// when an indexer is new (initialised from the run's seed; the log says how many tensors).
void enter_phase(const Run& run, int64_t p, Model& model) {
  const PhaseSettings& ph = run.pr.phases[p];
  ModelConfig pc = model.cfg;
  set_modes(pc, run.in.hybrid, ph.mode);
  std::vector<bool> need = model.has_indexer;
  for (int64_t L = 0; L < pc.num_hidden_layers; ++L) need[L] = need[L] || (run.in.hybrid[L] && is_dsa(ph.mode));
  if (is_dsa(ph.mode))
    HMLA_CHECK(pc.has_indexer_fields() && pc.q_lora_rank > 0, ConfigError, run.pr.model_config, ": phase '", ph.name,
               "' runs ", mode_name(ph.mode), ", which needs index_n_heads, index_head_dim, index_topk and q_lora_rank");
  if (need == model.has_indexer) {
    model.cfg = pc;
  } else {
    int created = 0;
    model = rebuild(model, pc, need, run.pr.seed + uint64_t(p), created);
    if (created > 0) run.log << "[" << ph.name << "] initialised " << created << " missing indexer tensors\n";
  }
  model.split_kv_b_proj = ph.mqa_split_kv_b_proj;
}

// On entering a latent phase with some hybrid layer: logs the MHA/MQA equivalence (console and
// metrics) and stops the programme when it fails.
// The check's tolerance: the programme's for f32 compute (the CPU). On CUDA the two forms round
// different intermediates to bf16 (unit roundoff u = 2^-9): per hybrid layer the attention's q, k
// and v and the absorption's and de-absorption's two inputs, <= 8 sites each perturbing what it
// touches by <= u relative, so to first order the logits differ by <= 8 u per hybrid layer
// relative to their largest; a structural error (a wrong split or absorption) is O(1).
double equivalence_rtol(const PhaseSettings& ph, const Model& model, const std::vector<bool>& hybrid) {
  if (model.device() == Device::cpu) return ph.equivalence_rtol;
  const double layers = double(std::count(hybrid.begin(), hybrid.end(), true));
  return std::max(ph.equivalence_rtol, 8.0 * layers * std::ldexp(1.0, -9));
}

void check_phase_equivalence(const Run& run, const PhaseSettings& ph, const Model& model, const Batch& eval) {
  auto [diff, mag] = equivalence(model, run.in.hybrid, eval, run.grid.cp);
  const double rtol = equivalence_rtol(ph, model, run.in.hybrid);
  run.log << "[" << ph.name << "] equivalence: max|logits_mqa - logits_mha| = " << std::scientific
          << std::setprecision(3) << diff << ", max|logits_mha| = " << mag << " (rtol " << rtol
          << (rtol != ph.equivalence_rtol ? ", the bound of bf16 compute" : "") << ")\n"
          << std::defaultfloat << std::setprecision(6);
  run.metrics.row(json{{"phase", ph.name}, {"equivalence_max_diff", diff}, {"equivalence_max_logit", mag}});
  HMLA_CHECK(diff <= rtol * mag, ConfigError, "phase '", ph.name, "': the MHA/MQA equivalence check failed (", diff,
             " > ", rtol, " * ", mag, "); the programme stops");
}

struct StepResult {
  double lm = 0, kl = 0;  // the step's global LM loss and indexer KL
  int64_t tokens = 0;
  OptimStats os;
  double seconds = 0;
};

// One optimizer step: the step's micro-batches dealt round-robin to the data-parallel ranks,
// gradients (into `garena`) and losses summed over the whole grid, then the update. A
// non-finite loss or weight stops the run before anything of the step is saved.
StepResult train_step(const Run& run, const PhaseSettings& ph, int64_t step, Model& model, Optimizer& optim,
                      PackedLoader& loader, Tensor& garena, io::TensorMap& grads) {
  const auto t0 = std::chrono::steady_clock::now();
  allocator(model.device()).reset_peak();
  std::vector<Batch> micro;
  int64_t targets = 0, rows = 0;
  for (int64_t i = 0; i < ph.micro_batches; ++i) {
    micro.push_back(loader.next(ph.batch / ph.micro_batches));
    targets += count_lm_targets(micro.back(), model.cfg.pad_token_id);
    rows += loss_row_count(micro.back().layout, &micro.back().input_ids, model.cfg.pad_token_id);
  }
  garena.fill_zero();
  const bool indexer_only = ph.mode == LayerMode::dsa_warmup;
  StepOptions so{!indexer_only, std::max<int64_t>(targets, 1), std::max<int64_t>(rows, 1), ph.recompute_attention};
  double sums[3] = {0, 0, 0};  // lm, kl, tokens of this rank's micro-batches
  for (size_t i = run.grid.dp_rank; i < micro.size(); i += size_t(run.grid.dp)) {
    StepStats s = model_step(model, micro[i], so, grads, run.grid.cp);
    sums[0] += s.lm_loss;
    sums[1] += s.indexer_kl;
    sums[2] += double(s.tokens);
  }
  run.grid.world.allreduce_sum(garena.data<float>(), garena.numel(), garena.device());  // CP shares and DP replicas
  run.grid.world.allreduce_sum(sums, 3);
  StepResult r;
  r.lm = sums[0];
  r.kl = sums[1];
  r.tokens = int64_t(sums[2]);
  const std::string at = "phase '" + ph.name + "' step " + std::to_string(step + 1) + ": ";
  HMLA_CHECK(std::isfinite(r.lm) && std::isfinite(r.kl), DivergenceError, at, "the ",
             std::isfinite(r.lm) ? "indexer KL" : "LM loss", " is ", std::isfinite(r.lm) ? r.kl : r.lm,
             "; the run stops and the last checkpoint is kept as it was");
  try {
    r.os = optim.step(model, grads, step);
  } catch (const DivergenceError& e) {
    throw DivergenceError(at + e.what() + "; the run stops and the last checkpoint is kept as it was");
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

void write_step_row(const Run& run, const PhaseSettings& ph, int64_t step, const StepResult& r, Device dev) {
  run.metrics.row(json{{"phase", ph.name}, {"step", step + 1}, {"lm_loss", r.lm},
                       {"indexer_kl", is_dsa(ph.mode) ? json(r.kl) : json()}, {"lr", r.os.lr},
                       {"grad_norm_backbone", r.os.grad_norm_backbone}, {"grad_norm_indexer", r.os.grad_norm_indexer},
                       {"tokens_per_s", double(r.tokens) / r.seconds},
                       {"peak_bytes", allocator(dev).peak_bytes()}});
}

// "[name] step 7/20  lm 3.1416  kl 0.1234  5123 tok/s  ETA 0m42s" (kl in dsa phases only).
void print_progress(const Run& run, const PhaseSettings& ph, int64_t step, const StepResult& r, double per_step) {
  std::ostream& log = run.log;
  log << "[" << ph.name << "] step " << step + 1 << "/" << ph.steps << "  lm " << std::fixed << std::setprecision(4)
      << r.lm;
  if (is_dsa(ph.mode)) log << "  kl " << r.kl;
  log << "  " << std::setprecision(0) << double(r.tokens) / r.seconds << " tok/s  ETA "
      << fmt_time(per_step * double(ph.steps - step - 1)) << std::defaultfloat << std::setprecision(6) << "\n"
      << std::flush;
}

std::string checkpoint_name(int64_t p, const PhaseSettings& ph, const std::string& what) {
  return std::to_string(p) + "-" + ph.name + "-" + what;
}

// The phase's end: the means of its first and last 20 steps (those before a resume included),
// the held-out loss over the fixed rows (or why there is none, also on the console), as one
// metrics row.
void write_phase_end_row(const Run& run, const PhaseSettings& ph, const Model& model, const Batch& eval,
                         const std::vector<double>& losses, const std::vector<double>& kls, double seconds) {
  PhaseSummary sum{ph.name, mode_name(ph.mode), ph.steps};
  sum.seconds = seconds;
  const size_t w = std::min<size_t>(20, losses.size());
  sum.first_loss = mean(losses, 0, w);
  sum.final_loss = mean(losses, losses.size() - w, losses.size());
  sum.final_kl = is_dsa(ph.mode) ? mean(kls, kls.size() - w, kls.size()) : std::nan("");
  std::tie(sum.heldout, sum.heldout_unavailable) = heldout_loss(model, eval, run.in.held, ph.seq_len, run.grid.cp);
  json end{{"phase", ph.name}, {"heldout_lm_loss", std::isnan(sum.heldout) ? json() : json(sum.heldout)},
           {"first20_lm_loss", sum.first_loss}, {"last20_lm_loss", sum.final_loss},
           {"first20_indexer_kl", is_dsa(ph.mode) ? json(mean(kls, 0, w)) : json()},
           {"last20_indexer_kl", is_dsa(ph.mode) ? json(sum.final_kl) : json()}, {"seconds", sum.seconds}};
  if (!sum.heldout_unavailable.empty()) {
    end["heldout_unavailable"] = sum.heldout_unavailable;
    run.log << "[" << ph.name << "] held-out loss not evaluated: " << sum.heldout_unavailable << "\n";
  }
  run.metrics.row(end);
}

// Phase p from its entry (or, resumed inside it, from the checkpoint's step) to its end
// checkpoint. `resumed` holds the resumed phase's state, or nothing.
void run_phase(const Run& run, int64_t p, Model& model, const RunState* resumed, io::TensorMap& opt_state,
               std::vector<double> losses, std::vector<double> kls) {
  const PhaseSettings& ph = run.pr.phases[p];
  const bool root = run.grid.root();
  enter_phase(run, p, model);
  const Batch eval = fixed_rows(run.in.held, ph.seq_len, ph.eval_rows);
  const bool any_hybrid = std::find(run.in.hybrid.begin(), run.in.hybrid.end(), true) != run.in.hybrid.end();
  // At the phase's entry only: a run resumed inside the phase checked it before its checkpoint.
  if (any_hybrid && !resumed && (ph.mode == LayerMode::mqa_full_causal || ph.mode == LayerMode::dsa_sparse))
    check_phase_equivalence(run, ph, model, eval);
  Optimizer optim(model, ph.optim, ph.mode == LayerMode::dsa_warmup);
  if (resumed) optim.load_state(opt_state, "checkpoint");
  opt_state.clear();  // so that peak memory after a resume is an uninterrupted run's
  PackedLoader loader(run.in.train, ph.seq_len, loader_seed(run.pr, p));
  if (resumed) loader.seek(resumed->data_pos);
  Tensor garena = Tensor::zeros({model.arena.numel()}, DType::f32, model.device());
  io::TensorMap grads = arena_views(model.table, garena);

  const int64_t first = resumed ? resumed->step : 0;
  const auto t_phase = std::chrono::steady_clock::now();
  for (int64_t step = first; step < ph.steps; ++step) {
    const StepResult r = train_step(run, ph, step, model, optim, loader, garena, grads);
    losses.push_back(r.lm);
    kls.push_back(r.kl);
    write_step_row(run, ph, step, r, model.device());
    if ((step + 1) % ph.log_every == 0 || step + 1 == ph.steps) {
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_phase).count();
      print_progress(run, ph, step, r, elapsed / double(step + 1 - first));
    }
    if (run.sigint.stop_requested())
      throw Interrupted("interrupted at phase '" + ph.name + "' step " + std::to_string(step + 1) +
                        "; the last complete checkpoint is intact (resume with --resume)");
    const bool ckpt = ph.checkpoint_every > 0 && (step + 1) % ph.checkpoint_every == 0 && step + 1 < ph.steps;
    if (ckpt && root)
      save_checkpoint(run.ckroot, checkpoint_name(p, ph, "step" + std::to_string(step + 1)), model, optim,
                      {p, step + 1, loader.position(), run.in.fingerprint, run.metrics.bytes()});
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_phase).count();
  write_phase_end_row(run, ph, model, eval, losses, kls, seconds);
  if (root)
    save_checkpoint(run.ckroot, checkpoint_name(p, ph, "end"), model, optim,
                    {p + 1, 0, {}, run.in.fingerprint, run.metrics.bytes()});
}

// The run's final weights and config next to its checkpoints (a diverged model is never saved).
void save_final_model(const fs::path& out, const Model& model) {
  const io::TensorMap params = host_params(model);
  check_finite_weights(params);
  save_model_config((out / "config.json").string(), model.cfg);
  io::save_safetensors((out / "model.safetensors").string(), params, {{"format", "pt"}});
}

// The end-of-run table on the console, one line per phase, then the phases without a held-out
// loss and why.
void print_summary_table(std::ostream& log, const std::vector<PhaseSummary>& summaries) {
  log << "\n" << std::left << std::setw(14) << "phase" << std::setw(17) << "mode" << std::right << std::setw(7) << "steps"
      << std::setw(11) << "loss_0" << std::setw(11) << "loss" << std::setw(10) << "kl" << std::setw(11) << "heldout"
      << std::setw(10) << "time" << std::setw(11) << "peak_MiB" << "\n";
  auto num = [](double x) {
    std::ostringstream os;
    if (std::isnan(x)) os << "-";
    else os << std::fixed << std::setprecision(4) << x;
    return os.str();
  };
  for (const PhaseSummary& s : summaries)
    log << std::left << std::setw(14) << s.name << std::setw(17) << s.mode << std::right << std::setw(7) << s.steps
        << std::setw(11) << num(s.first_loss) << std::setw(11) << num(s.final_loss) << std::setw(10) << num(s.final_kl)
        << std::setw(11) << (s.heldout_unavailable.empty() ? num(s.heldout) : "n/a") << std::setw(10) << fmt_time(s.seconds)
        << std::fixed << std::setprecision(1) << std::setw(11) << s.peak / 1048576.0 << std::defaultfloat << "\n";
  for (const PhaseSummary& s : summaries)
    if (!s.heldout_unavailable.empty())
      log << "heldout n/a in phase '" << s.name << "': " << s.heldout_unavailable << "\n";
}

// summary.json: the same table as JSON (null for a number that is not one).
void write_summary_json(const fs::path& out, const std::vector<PhaseSummary>& summaries) {
  auto num = [](double x) { return std::isnan(x) ? json() : json(x); };
  json table = json::array();
  for (const PhaseSummary& s : summaries) {
    table.push_back({{"phase", s.name}, {"mode", s.mode}, {"steps", s.steps}, {"first20_lm_loss", num(s.first_loss)},
                     {"last20_lm_loss", num(s.final_loss)}, {"last20_indexer_kl", num(s.final_kl)},
                     {"heldout_lm_loss", num(s.heldout)}, {"seconds", s.seconds}, {"peak_bytes", s.peak}});
    if (!s.heldout_unavailable.empty()) table.back()["heldout_unavailable"] = s.heldout_unavailable;
  }
  write_json_atomic(out / "summary.json", table);
}

}  // namespace

Device training_device(const std::string& requested) {
  HMLA_CHECK(requested == "cpu" || requested == "cuda", ConfigError, "device '", requested, "': use cpu or cuda");
  if (requested == "cpu") return Device::cpu;
  HMLA_CHECK(cuda_built(), ConfigError,
             "device cuda: this build of hmla has no CUDA backend (rebuild with the CUDA toolkit's nvcc on PATH)");
  HMLA_CHECK(cuda_device_count() > 0, ConfigError, "device cuda: no CUDA device is visible on this machine");
  return Device::cuda;
}

void run_programme(const Programme& pr, const TrainOptions& opt, std::ostream& console) {
  RankGrid grid = set_up_rank_grid(pr, opt.cp);
  const bool root = grid.root();
  std::ostringstream sink;  // what the other ranks would print
  std::ostream& log = root ? console : sink;
  if (opt.on_rank_ready) opt.on_rank_ready(grid.world.rank());  // the test seam (TrainOptions)
  std::optional<SigintCatcher> sigint(std::in_place);  // until the last phase ends
  const Device dev = training_device(opt.device.empty() ? pr.device : opt.device);
  if (dev == Device::cuda) cuda_select_device(grid.world.rank());  // each rank its node's GPU, before any allocation
  const RunInputs in = load_run_inputs(pr, opt.cp, dev);
  const fs::path out(opt.out_dir);
  RunDir run_dir = claim_on_root(pr, opt, grid.world);  // checked; nothing written before begin_on_root
  RunStart start = opt.resume ? resume_from_latest(pr, opt, in, dev, log) : start_fresh(pr, in.cfg, dev);

  begin_on_root(run_dir, grid.world, dev);  // every check passed: create, lock (until the run ends), mark
  std::vector<double> resumed_losses, resumed_kls;  // the current phase's steps before the resume
  if (root && opt.resume) {
    truncate_metrics(out / "metrics.jsonl", start.st.metrics_bytes);
    phase_history(read_metrics(out / "metrics.jsonl"), resumed_losses, resumed_kls);
  }
  if (root && !opt.resume) io::write_file_atomic((out / "programme.json").string(), programme_json(pr));
  MetricsLog metrics(root, out / "metrics.jsonl", opt.resume);
  // Once every check has passed, so that an error stays the only line on stderr.
  if (const std::string hint = cpu_blas_hint(); !hint.empty()) log << hint << "\n";
  log << in.memory_plan;
  const Run run{pr, grid, in, out, out / "checkpoints", log, metrics, *sigint};
  Model& model = start.model;
  for (int64_t p = start.st.phase; p < int64_t(pr.phases.size()); ++p) {
    const bool resuming_here = opt.resume && p == start.st.phase && start.st.step > 0;
    if (resuming_here) run_phase(run, p, model, &start.st, start.opt_state, resumed_losses, resumed_kls);
    else run_phase(run, p, model, nullptr, start.opt_state, {}, {});
  }
  sigint.reset();
  if (!root) return;
  metrics.close();
  const std::vector<PhaseSummary> summaries = summaries_from_metrics(pr, read_metrics(out / "metrics.jsonl"));
  save_final_model(out, model);
  print_summary_table(log, summaries);
  write_summary_json(out, summaries);
}

}  // namespace hmla
