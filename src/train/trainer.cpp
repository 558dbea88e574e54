// The programme driver (docs/programme.md, DESIGN.md section 7): the run's set-up in order of
// its checks, then each phase from its entry (the model in the phase's form, the equivalence
// check) through its steps and checkpoints to its end row and checkpoint. The parts live beside
// it: rank_grid (ranks and the run directory), run_inputs, checkpoint (save, load, resume checks),
// equivalence, step, summary (console and summary.json), and hmla/train/metrics.h.
#include "hmla/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>
#include <sstream>
#include <tuple>

#include "checkpoint.h"
#include "equivalence.h"
#include "hmla/core/cuda.h"
#include "hmla/io/safetensors.h"
#include "hmla/model/indexer.h"
#include "hmla/ops/cpu_blas.h"
#include "hmla/train/metrics.h"
#include "rank_grid.h"
#include "run_inputs.h"
#include "sigint.h"
#include "step.h"
#include "summary.h"

namespace hmla {

namespace fs = std::filesystem;

namespace {

using namespace train;

// A model for `cfg` carrying over every tensor of `old`; indexers new to it are initialised.
Model rebuild(const Model& old, const ModelConfig& cfg, const std::vector<bool>& has_indexer, uint64_t seed, int& created) {
  Model m = build_model(cfg, has_indexer, old.device(), old.ep);
  m.kept = old.kept;  // the MTP layers, carried as read (params.h)
  for (const auto& [name, t] : old.ints) m.ints.at(name).copy_from(t);  // DeepSeek-V4's tid2eid
  created = 0;
  for (const ParamSpec& p : m.table)
    if (old.params.count(p.name)) m.params.at(p.name).copy_from(old.params.at(p.name));
  // A V4 stack's new indexers (CSA: attn.indexer.*, hybrid_mla: self_attn.indexer.*) by init_model's
  // rules, which are indexer_init_missing's for the MLA tensors.
  if (cfg.is_v4()) created = init_missing_tensors(m, old.params, seed);
  for (int64_t L = 0; L < cfg.num_hidden_layers && !cfg.is_v4(); ++L) {
    if (!has_indexer[L] || (L < int64_t(old.has_indexer.size()) && old.has_indexer[L])) continue;
    io::TensorMap w;
    created += indexer_init_missing(w, cfg, seed * 1000003ull + uint64_t(L));
    for (auto& [name, t] : w) m.params.at(layer_prefix(L) + "self_attn." + name).copy_from(t);
  }
  refresh_compute_weights(m);  // the arena was written above
  return m;
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

// What every step of a started run reads.
struct Run {
  const Programme& pr;
  RankGrid& grid;
  const RunInputs& in;
  const fs::path out, ckroot;
  std::ostream& log;  // the console on rank 0, a sink elsewhere
  MetricsLog& metrics;
  const SigintCatcher& sigint;
  const bool shard_optimizer;  // ZeRO-1 over the grid (docs/scale_out.md)
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
  const std::vector<bool> phase = phase_indexers(pc, run.in.hybrid, ph.mode);
  for (int64_t L = 0; L < pc.num_hidden_layers; ++L)  // "shared" layers (IndexShare) never have one
    need[L] = need[L] || (phase[L] && !pc.indexer_shared(L));
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
  model.attn_backend = run.pr.attention_backend;
}


// The model as phase q's end checkpoint holds it (a sparse phase with a control arm restarts from
// it, docs/programme.md): read by every rank once the root has written it.
Model phase_end_model(const Run& run, int64_t p, const Model& now) {
  const int64_t q = run.pr.phases[size_t(p)].restart_from;
  run.grid.world.barrier();  // the root wrote the checkpoint before its ranks' next collective
  const fs::path dir = run.ckroot / checkpoint_name(q, run.pr.phases[size_t(q)], "end");
  ModelConfig cfg = now.cfg;
  CheckpointTensors ck = read_checkpoint((dir / "model.safetensors").string(), cfg);
  Model m = build_model(cfg, checkpoint_indexers(cfg, ck.tensors), now.device(), now.ep);
  load_checkpoint_into_model(m, std::move(ck), (dir / "model.safetensors").string());
  run.log << "[" << run.pr.phases[size_t(p)].name << "] restarts from " << dir.filename().string()
          << " (its control arm ran from there)\n";
  return m;
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
  MetricsRow end{MetricsRow::Kind::phase_end, ph.name};
  end.heldout_lm_loss = sum.heldout;
  end.first20_lm_loss = sum.first_loss, end.last20_lm_loss = sum.final_loss;
  end.first20_indexer_kl = is_dsa(ph.mode) ? mean(kls, 0, w) : MetricsRow::none;
  end.last20_indexer_kl = sum.final_kl;
  end.seconds = sum.seconds;
  end.heldout_unavailable = sum.heldout_unavailable;
  if (!sum.heldout_unavailable.empty())
    run.log << "[" << ph.name << "] held-out loss not evaluated: " << sum.heldout_unavailable << "\n";
  run.metrics.row(end);
}

// Phase p from its entry (or, resumed inside it, from the checkpoint's step) to its end
// checkpoint. `resumed` holds the resumed phase's state, or nothing.
void run_phase(const Run& run, int64_t p, Model& model, const RunState* resumed, io::TensorMap& opt_state,
               std::vector<double> losses, std::vector<double> kls) {
  const PhaseSettings& ph = run.pr.phases[p];
  const bool root = run.grid.root();
  if (ph.restart_from >= 0 && !resumed) model = phase_end_model(run, p, model);
  enter_phase(run, p, model);
  const Batch eval = fixed_rows(run.in.held, ph.seq_len, ph.eval_rows);
  const bool any_hybrid = std::find(run.in.hybrid.begin(), run.in.hybrid.end(), true) != run.in.hybrid.end();
  // At the phase's entry only: a run resumed inside the phase checked it before its checkpoint.
  if (any_hybrid && !resumed && (ph.mode == LayerMode::mqa_full_causal || ph.mode == LayerMode::dsa_sparse))
    check_phase_equivalence(ph, model, run.in.hybrid, eval, run.grid.cp, run.log, run.metrics);
  Optimizer optim(model, ph.optim, ph.mode == LayerMode::dsa_warmup, ph.mtp_loss_coeff > 0,
                  {&run.grid.world, model.ep ? &run.grid.experts : nullptr, run.shard_optimizer});
  if (resumed) optim.load_state(opt_state, "checkpoint");
  opt_state.clear();  // so that peak memory after a resume is an uninterrupted run's
  PackedLoader loader(run.in.train, ph.seq_len, loader_seed(run.pr, p));
  if (resumed) loader.seek(resumed->data_pos);
  Tensor garena = Tensor::zeros({optim.grad_arena_numel(model)}, DType::f32, model.device());
  io::TensorMap grads = optim.grad_views(garena);

  const int64_t first = resumed ? resumed->step : 0;
  const auto t_phase = std::chrono::steady_clock::now();
  for (int64_t step = first; step < ph.steps; ++step) {
    const bool log_step = (step + 1) % ph.log_every == 0 || step + 1 == ph.steps;
    const StepResult r = train_step(run.grid, ph, step, model, optim, loader, garena, grads, log_step);
    losses.push_back(r.lm);
    kls.push_back(r.kl);
    run.metrics.row(step_row(ph, step, r, model.device()));
    if (log_step) {
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_phase).count();
      print_progress(run.log, ph, step, r, elapsed / double(step + 1 - first));
    }
    if (run.sigint.stop_requested())
      throw Interrupted("interrupted at phase '" + ph.name + "' step " + std::to_string(step + 1) +
                        "; the last complete checkpoint is intact (resume with --resume)");
    const bool ckpt = ph.checkpoint_every > 0 && (step + 1) % ph.checkpoint_every == 0 && step + 1 < ph.steps;
    if (ckpt && (root || optim.state_per_rank()))  // sharded or expert parallel: every rank writes its moments
      save_checkpoint(run.ckroot, checkpoint_name(p, ph, "step" + std::to_string(step + 1)), model, optim,
                      {p, step + 1, loader.position(), run.in.fingerprint, run.metrics.bytes()}, run.grid.world);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_phase).count();
  write_phase_end_row(run, ph, model, eval, losses, kls, seconds);
  if (root || optim.state_per_rank())
    save_checkpoint(run.ckroot, checkpoint_name(p, ph, "end"), model, optim,
                    {p + 1, 0, {}, run.in.fingerprint, run.metrics.bytes()}, run.grid.world);
}

// The rows of the run's own metrics.jsonl, which hmla wrote whole: a malformed line is an error.
std::vector<MetricsRow> own_metrics(const fs::path& path) {
  MetricsFile f = read_metrics(path);
  require_well_formed(f, path);
  return std::move(f.rows);
}

}  // namespace

std::string programme_memory_plan(const Programme& pr, const TrainOptions& opt, const std::vector<int64_t>& seq_lens) {
  // A plan needs no device: CUDA's is planned in its compute dtype whether or not one is visible.
  const std::string dev = opt.device.empty() ? pr.device : opt.device;
  HMLA_CHECK(dev == "cpu" || dev == "cuda", ConfigError, "device '", dev, "': use cpu or cuda");
  Programme p = pr;
  std::string out;
  for (int64_t s : seq_lens.empty() ? std::vector<int64_t>{0} : seq_lens) {
    if (s > 0)
      for (PhaseSettings& ph : p.phases) ph.seq_len = s;
    out += train::memory_plan_table(p, opt.cp, dev == "cpu" ? Device::cpu : Device::cuda);
  }
  return out;
}

Device training_device(const std::string& requested) {
  HMLA_CHECK(requested == "cpu" || requested == "cuda", ConfigError, "device '", requested, "': use cpu or cuda");
  if (requested == "cpu") return Device::cpu;
  HMLA_CHECK(cuda_built(), ConfigError,
             "device cuda: this build of hmla has no CUDA backend (rebuild with the CUDA toolkit's nvcc on PATH)");
  HMLA_CHECK(cuda_device_count() > 0, ConfigError, "device cuda: no CUDA device is visible on this machine");
  return Device::cuda;
}

// cudnn insists on cuDNN's dense attention: refused up front where it cannot run at all (the
// kernels refuse per call where cuDNN declines the shapes, naming why).
static void check_attention_backend(const Programme& pr, Device dev) {
  if (pr.attention_backend != AttnBackend::cudnn) return;
  HMLA_CHECK(dev == Device::cuda, ConfigError, pr.path, ": attention_backend cudnn needs device cuda");
  HMLA_CHECK(attn_cudnn_built(), ConfigError, pr.path,
             ": attention_backend cudnn: this build has no cuDNN path (scripts/deps.sh installs cudnn-frontend's "
             "headers; reconfigure)");
}

namespace {

// --ep E: a model with MoE layers whose routed experts E divides, on the CPU (the CUDA path reads
// each layer's counts back, which the step's one-sync rule has no exception for yet).
void check_expert_parallel(const ModelConfig& c, int ep, Device dev) {
  if (ep == 1) return;
  HMLA_CHECK(c.has_moe_layers(), ConfigError, "--ep ", ep, ": the model has no MoE layers");
  HMLA_CHECK(c.moe.n_routed_experts % ep == 0, ConfigError, "--ep ", ep, " does not divide n_routed_experts = ",
             c.moe.n_routed_experts, ": each EP rank computes a contiguous block of the experts");
  HMLA_CHECK(dev == Device::cpu, ConfigError, "--ep ", ep, " with --device cuda: expert parallelism runs on the CPU so far "
             "(docs/scale_out.md \"Expert parallel\")");
}

}  // namespace

void run_programme(const Programme& pr, const TrainOptions& opt, std::ostream& console) {
  RankGrid grid = set_up_rank_grid(pr, opt.cp, opt.ep);
  const bool root = grid.root();
  std::ostringstream sink;  // what the other ranks would print
  std::ostream& log = root ? console : sink;
  if (opt.on_rank_ready) opt.on_rank_ready(grid.world.rank());  // the test seam (TrainOptions)
  std::optional<SigintCatcher> sigint(std::in_place);  // until the last phase ends
  const Device dev = training_device(opt.device.empty() ? pr.device : opt.device);
  if (dev == Device::cuda) cuda_select_device(grid.world.rank());  // each rank its node's GPU, before any allocation
  check_attention_backend(pr, dev);  // then each phase's model carries it (enter_phase)
  const RunInputs in = load_run_inputs(pr, opt.cp, dev, opt.ep);
  check_expert_parallel(in.cfg, opt.ep, dev);
  const fs::path out(opt.out_dir);
  RunDir run_dir = claim_on_root(pr, opt, grid.world);  // checked; nothing written before begin_on_root
  RunStart start = opt.resume ? resume_from_latest(pr, opt, in, dev, log, grid.model_ep())
                              : start_fresh(pr, in.cfg, dev, grid.model_ep());

  begin_on_root(run_dir, grid.world, dev, in.tokenizer);  // every check passed: create, lock (until the run ends), mark
  std::vector<double> resumed_losses, resumed_kls;  // the current phase's steps before the resume
  if (root && opt.resume) {
    truncate_metrics(out / "metrics.jsonl", start.st.metrics_bytes);
    phase_history(own_metrics(out / "metrics.jsonl"), resumed_losses, resumed_kls);
  }
  if (root && !opt.resume) io::write_file_atomic((out / "programme.json").string(), programme_json(pr));
  MetricsLog metrics(root, out / "metrics.jsonl", opt.resume);
  // Once every check has passed, so that an error stays the only line on stderr.
  if (const std::string hint = cpu_blas_hint(); !hint.empty()) log << hint << "\n";
  log << in.memory_plan;
  if (start.model.ep) {
    const int64_t held = start.model.arena.numel(), E = in.cfg.moe.n_routed_experts;
    log << "expert parallel: each rank holds " << held << " parameter values (" << table_numel({start.model.table.begin(),
           start.model.table.begin() + ptrdiff_t(start.model.first_expert)}) << " replicated and its " << E / opt.ep
        << " of each MoE layer's " << E << " routed experts)\n";
  }
  if (start.initialised > 0)
    log << "initialised " << start.initialised << " multi-token-prediction tensors the checkpoint does not hold\n";
  const Run run{pr, grid, in, out, out / "checkpoints", log, metrics, *sigint, opt.shard_optimizer};
  Model& model = start.model;
  for (int64_t p = start.st.phase; p < int64_t(pr.phases.size()); ++p) {
    const bool resuming_here = opt.resume && p == start.st.phase && start.st.step > 0;
    if (resuming_here) run_phase(run, p, model, &start.st, start.opt_state, resumed_losses, resumed_kls);
    else run_phase(run, p, model, nullptr, start.opt_state, {}, {});
  }
  sigint.reset();
  // Under expert parallelism every rank sends its experts.
  const io::TensorMap params = root || model.ep ? host_params(model) : io::TensorMap{};
  if (!root) return;
  metrics.close();
  const std::vector<PhaseSummary> summaries = summaries_from_metrics(pr, own_metrics(out / "metrics.jsonl"));
  save_final_model(out, model, params);
  print_summary_table(log, summaries);
  write_summary_json(out, summaries);
}

}  // namespace hmla
