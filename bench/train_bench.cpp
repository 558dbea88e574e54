// hmla's training step against the PyTorch twin. The twin runs as a child process that answers one
// step per request, so the two arms alternate rep by rep and machine noise hits both alike. Batch:
// b rows of seeded byte tokens packed as two documents and a padded tail (s/2, 3s/8, s/8 of pad),
// so document masks and loss-row rules are exercised. In dsa_sparse the twin attends over hmla's
// selection table of the first step (it does not re-select; its indexer scores and KL are still
// computed each step), so its step is, if anything, slightly cheaper than a real one.
#include "train_bench.h"

#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "bench_util.h"
#include "hmla/core/cuda.h"
#include "hmla/core/error.h"
#include "hmla/io/json_strict.h"
#include "hmla/io/safetensors.h"
#include "hmla/ops/backend.h"
#include "hmla/ops/optim.h"
#include "hmla/train/optim.h"
#include "hmla/train/trainer.h"

namespace hmla::bench {

namespace {

namespace fs = std::filesystem;

// The PyTorch twin as a child process: "step\n" in, one JSON line out.
class Twin {
 public:
  Twin(const std::string& python, const std::string& script, const fs::path& dir) {
    int to[2], from[2];
    HMLA_CHECK(pipe(to) == 0 && pipe(from) == 0, Error, "bench train: pipe failed");
    pid_ = fork();
    HMLA_CHECK(pid_ >= 0, Error, "bench train: fork failed");
    if (pid_ == 0) {
      dup2(to[0], 0);
      dup2(from[1], 1);
      close(to[1]);
      close(from[0]);
      execl(python.c_str(), python.c_str(), script.c_str(), "--serve", dir.c_str(), (char*)nullptr);
      _exit(127);
    }
    close(to[0]);
    close(from[1]);
    in_ = fdopen(to[1], "w");
    out_ = fdopen(from[0], "r");
  }
  ~Twin() {
    if (in_) std::fputs("quit\n", in_), std::fclose(in_);
    if (out_) std::fclose(out_);
    int st = 0;
    waitpid(pid_, &st, 0);
  }
  std::string attention, version;  // what the twin reports: "sdpa" or "matmul", torch's version
  // One step: (ms, LM loss), or nothing when the twin failed.
  bool step(double& ms, double& loss) {
    if (std::fputs("step\n", in_) < 0 || std::fflush(in_) != 0) return false;
    char buf[512];
    if (!std::fgets(buf, sizeof buf, out_)) return false;
    try {
      auto j = io::parse_json(buf, "bench train: the twin's reply");
      ms = j.at("ms").get<double>();
      loss = j.at("loss").get<double>();
      attention = j.value("attention", "");
      version = j.value("torch", "");
      return true;
    } catch (const nlohmann::json::exception&) {
      return false;
    } catch (const IoError&) {
      return false;
    }
  }

 private:
  pid_t pid_ = -1;
  FILE* in_ = nullptr;
  FILE* out_ = nullptr;
};

Batch bench_batch(int64_t b, int64_t s, int64_t vocab) {
  std::mt19937_64 rng(7);
  std::vector<int32_t> ids(b * s, 0);
  std::vector<std::vector<int64_t>> cu(b, {0, s / 2, s - s / 8});
  for (int64_t r = 0; r < b; ++r)
    for (int64_t t = 0; t < s - s / 8; ++t) ids[r * s + t] = int32_t(3 + rng() % uint64_t(std::min<int64_t>(vocab, 259) - 3));
  return {Tensor::from_vector<int32_t>({b, s}, ids), layout_from_cu_seqlens(s, cu)};
}

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int64_t count_params(const Model& m, bool (*which)(const std::string&)) {
  int64_t n = 0;
  for (const ParamSpec& p : m.table)
    if (which(p.name)) n += shape_numel(p.shape);
  return n;
}

// The activation plan of a training step (model.h's plan_activations: a lower bound) with the
// activations in `compute` (the device's compute dtype; f32 is what every device kept before the
// bf16 policy, printed beside it on CUDA).
int64_t activation_plan(const ModelConfig& cfg, int64_t batch, int64_t s, DType compute) {
  MemoryPlan plan;
  plan_activations(plan, cfg, {"batch", batch}, {"seq_len", s}, true, compute);
  return plan.total();
}

}  // namespace

void run_train_bench(const TrainBenchOptions& opt, std::ostream& os) {
  const int threads = omp_get_max_threads();
  const Device dev = training_device(opt.device);
  const bool gpu = dev == Device::cuda;
  const ModelConfig base = load_model_config(opt.config);
  const std::string script = opt.twin.empty() ? HMLA_SOURCE_DIR "/tests/python/train_twin.py" : opt.twin;
  const bool twin_ok = !opt.python.empty() && fs::exists(opt.python) && fs::exists(script);
  if (!twin_ok)
    std::cerr << "hmla: note: bench train runs without the PyTorch arm (" << opt.python << " or " << script
              << " not found)\n";
  for (const std::string& mode_text : opt.modes)
    for (int64_t s : opt.seq_lens) {
      const LayerMode mode = parse_mode(mode_text, "--mode");
      ModelConfig cfg = base;
      set_all_modes(cfg, mode);
      Model m = build_model(cfg, std::vector<bool>(cfg.num_hidden_layers, is_dsa(mode)), dev);
      init_model(m, 1);
      const Batch batch = bench_batch(opt.batch, s, cfg.vocab_size);
      OptimSettings os_;
      os_.lr = os_.indexer_lr = 1e-3;
      const bool warmup = mode == LayerMode::dsa_warmup;  // the indexers alone learn, no backbone backward
      Optimizer optim(m, os_, warmup);
      Tensor garena = Tensor::zeros({m.arena.numel()}, DType::f32, dev);
      io::TensorMap grads = arena_views(m.table, garena);
      // The twin's modes: mha and dsa_sparse (on the GPU: mha, the baseline of the phase 1).
      // V4: mha only (its twin has no CSA indexer KL).
      const bool with_twin =
          twin_ok && (mode == LayerMode::mha || (!gpu && mode == LayerMode::dsa_sparse && !cfg.is_v4()));

      // The twin's inputs: the initial weights, the batch, hmla's selection tables.
      const fs::path dir = fs::temp_directory_path() / ("hmla_bench_train_" + std::to_string(::getpid()));
      fs::create_directories(dir);
      std::unique_ptr<Twin> twin;
      if (with_twin) {
        io::TensorMap weights = arena_views(m.table, m.arena.on(Device::cpu));
        for (const auto& [name, t] : m.ints) weights[name] = t.on(Device::cpu);  // DeepSeek-V4's tid2eid
        io::save_safetensors((dir / "weights.safetensors").string(), weights);
        io::TensorMap bt{{"input_ids", batch.input_ids}, {"doc_start", batch.layout.doc_start},
                         {"doc_end", batch.layout.doc_end}};
        if (!cfg.is_v4()) {  // the MLA twin attends over hmla's selection (V4's twin runs its own indexer)
          std::vector<Tensor> tables;
          model_logits(m, batch, &tables);
          for (size_t L = 0; L < tables.size(); ++L)
            if (tables[L].defined()) bt["table." + std::to_string(L)] = tables[L].on(Device::cpu);
        }
        io::save_safetensors((dir / "batch.safetensors").string(), bt);
        nlohmann::json tj{{"config", fs::absolute(opt.config).string()}, {"mode", mode_text},
                          {"threads", threads}, {"lr", os_.lr}, {"device", opt.device}};
        if (cfg.is_v4()) tj["csa_selection"] = "dense";  // in mha a CSA layer attends every visible entry
        io::write_file_atomic((dir / "twin.json").string(), tj.dump());
        twin = std::make_unique<Twin>(opt.python, script, dir);
      }
      std::vector<double> hmla_ms, torch_ms;
      double hmla_loss0 = 0, torch_loss0 = std::nan("");
      size_t peak = 0;
      allocator(dev).reset_peak();
      bool torch_running = bool(twin);
      const int64_t targets = count_lm_targets(batch, cfg.pad_token_id);
      CudaCounters step_cost;  // of the last rep: what a steady step costs the host (cuda.h)
      for (int rep = 0; rep <= opt.reps; ++rep) {  // rep 0 warms both arms up
        const auto t0 = Clock::now();
        const CudaCounters c0 = cuda_counters();
        peak = std::max(peak, peak_above_live(
                                  [&] {
                                    // The trainer's step (src/train/step.cpp): every launch queued,
                                    // then one read-back of the stats, which waits for all of it.
                                    garena.fill_zero();
                                    const Tensor stats = Tensor::zeros({kStatCount}, DType::f64, dev);
                                    const Tensor bad = Tensor::zeros({1}, DType::f32, dev);
                                    model_step(m, batch, {!warmup, targets, 0, false, stats, {}, 0, 0, {}}, grads);
                                    stats_losses(stats, bad);
                                    optim.launch_step(m, grads, rep, stats, bad);
                                    const std::vector<double> h = stats.to_vector<double>();
                                    if (rep == 0) hmla_loss0 = h[kStatLm];
                                  },
                                  dev));
        if (rep > 0) hmla_ms.push_back(ms_since(t0));
        step_cost = cuda_counters() - c0;
        double ms = 0, loss = 0;
        if (torch_running && !(torch_running = twin->step(ms, loss)))
          std::cerr << "hmla: note: the PyTorch twin stopped; see its message above\n";
        if (torch_running && rep == 0) torch_loss0 = loss;
        if (torch_running && rep > 0) torch_ms.push_back(ms);
      }
      const std::string torch_attention = twin ? twin->attention : "", torch_version = twin ? twin->version : "";
      twin.reset();
      fs::remove_all(dir);
      const double hm = median(hmla_ms), tm = median(torch_ms);
      const double tokens = double(opt.batch * s);
      auto num = [](double x) { return std::isfinite(x) ? nlohmann::ordered_json(x) : nlohmann::ordered_json(); };
      const double flops = model_flops(
          cfg, mode, batch.layout, m.arena.numel(),
          count_params(m, [](const std::string& n) { return n == "model.embed_tokens.weight"; }),
          count_params(m, [](const std::string& n) { return n.find("indexer.") != std::string::npos; }));
      const double tflops = flops / (hm * 1e-3) / 1e12;
      if (gpu) {
        nlohmann::ordered_json j{{"bench", "cuda-train"}, {"mode", mode_text}, {"seq_len", s}, {"batch", opt.batch},
                                 {"params", m.arena.numel()}, {"reps", opt.reps}, {"step_ms", hm},
                                 {"tokens_per_s", tokens / hm * 1e3}, {"model_flops", flops}, {"model_tflops", tflops},
                                 {"mfu", tflops / kH200PeakTflops}, {"peak_bytes", allocator(dev).peak_bytes()},
                                 {"activation_plan_bytes", activation_plan(cfg, opt.batch, s, compute_dtype(dev))},
                                 {"activation_plan_f32_bytes", activation_plan(cfg, opt.batch, s, DType::f32)},
                                 {"syncs", step_cost.syncs}, {"launches", step_cost.launches},
                                 {"h2d_bytes", step_cost.h2d_bytes}, {"d2h_bytes", step_cost.d2h_bytes},
                                 {"torch_step_ms", num(tm)}, {"torch_tokens_per_s", num(tokens / tm * 1e3)},
                                 {"speedup", num(tm / hm)}, {"loss_rel_diff", num(std::abs(torch_loss0 - hmla_loss0) / std::abs(hmla_loss0))},
                                 {"torch", torch_version}, {"torch_attention", torch_attention}};
        os << j.dump() << std::endl;
        continue;
      }
      nlohmann::ordered_json j{{"bench", "train"}, {"mode", mode_text}, {"seq_len", s}, {"batch", opt.batch},
                               {"params", m.arena.numel()}, {"threads", threads}, {"reps", opt.reps},
                               {"hmla_step_ms", hm}, {"torch_step_ms", num(tm)},
                               {"hmla_tokens_per_s", tokens / hm * 1e3}, {"torch_tokens_per_s", num(tokens / tm * 1e3)},
                               {"model_flops", flops}, {"model_tflops", tflops},
                               {"speedup", num(tm / hm)}, {"hmla_peak_bytes", peak},
                               {"activation_plan_bytes", activation_plan(cfg, opt.batch, s, DType::f32)},
                               {"loss_rel_diff", num(std::abs(torch_loss0 - hmla_loss0) / std::abs(hmla_loss0))},
                               {"torch", torch_version}, {"torch_attention", torch_attention}};
      os << j.dump() << std::endl;
    }
}

}  // namespace hmla::bench
