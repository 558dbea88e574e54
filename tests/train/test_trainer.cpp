// End-to-end programmes on the shipped data with a tiny model: all four phases, dsa_warmup
// updating only the indexers, a trained indexer never re-initialised, exact resume, and the
// equivalence check stopping a programme.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "hmla/io/safetensors.h"
#include "hmla/data/loader.h"
#include "hmla/dist/comm.h"
#include "hmla/model/model.h"
#include "hmla/train/trainer.h"
#include "programmes.h"

namespace hmla {
namespace {

namespace fs = std::filesystem;

using testing::tmpdir;

// A programme over the demo data with the tiny model (tests/train/tiny_model.json).
std::string programme(const std::string& phases, const std::string& extra = "") {
  return testing::programme_text("tests/train/tiny_model.json", 3, "micro_batches: 2, warmup_steps: 2", phases, extra);
}

void run(const std::string& text, const fs::path& out, bool resume = false) {
  TrainOptions o;
  o.resume = resume;
  testing::run_text(text, out, o);
}

io::TensorMap weights(const fs::path& out) { return io::load_safetensors((out / "model.safetensors").string()); }
io::TensorMap checkpoint(const fs::path& out, const std::string& name) {
  return io::load_safetensors((out / "checkpoints" / name / "model.safetensors").string());
}
bool same(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

TEST(Trainer, FourPhasesAndWarmupTouchesOnlyTheIndexers) {
  const fs::path out = tmpdir("four");
  run(programme("  - {name: pre, mode: mha, steps: 4}\n  - {name: eq, mode: mqa_full_causal, steps: 0}\n"
                "  - {name: warm, mode: dsa_warmup, steps: 3}\n  - {name: sparse, mode: dsa_sparse, steps: 3}\n"),
      out);
  EXPECT_TRUE(fs::exists(out / "summary.json"));
  EXPECT_TRUE(fs::exists(out / "metrics.jsonl"));
  io::TensorMap before = checkpoint(out, "1-eq-end"), after = checkpoint(out, "2-warm-end");
  int indexer = 0;
  for (const auto& [name, t] : after) {
    if (name.find("indexer.") != std::string::npos) {
      ++indexer;
      EXPECT_FALSE(before.count(name)) << name;  // created when dsa_warmup began
      continue;
    }
    EXPECT_TRUE(same(t, before.at(name))) << name << " changed during dsa_warmup";
  }
  EXPECT_EQ(indexer, 2 * 5);  // exactly five indexer tensors per hybrid layer
  io::TensorMap fin = weights(out);
  EXPECT_FALSE(same(fin.at("model.norm.weight"), after.at("model.norm.weight")));  // dsa_sparse trains the backbone
  fs::remove_all(out);
}

TEST(Trainer, ATrainedIndexerIsNeverReinitialised) {
  const fs::path a = tmpdir("a"), b = tmpdir("b");
  run(programme("  - {name: warm, mode: dsa_warmup, steps: 2}\n"), a);
  run(programme("  - {name: warm2, mode: dsa_warmup, steps: 0}\n", "init_checkpoint: " + (a / "model.safetensors").string() + "\n"), b);
  io::TensorMap wa = weights(a), wb = weights(b);
  for (const auto& [name, t] : wa) EXPECT_TRUE(same(t, wb.at(name))) << name;
  fs::remove_all(a);
  fs::remove_all(b);
}

// metrics.jsonl / summary.json without their timing fields (tokens_per_s, seconds).
std::string without_timing(const fs::path& p) {
  std::string text = io::read_file(p.string()), out;
  for (const char* key : {"\"tokens_per_s\":", "\"seconds\":"}) {
    out.clear();
    for (size_t i = 0; i < text.size();) {
      const size_t k = text.find(key, i);
      if (k == std::string::npos) {
        out += text.substr(i);
        break;
      }
      out += text.substr(i, k - i);
      i = text.find_first_of(",}\n", k);
    }
    text = out;
  }
  return text;
}

TEST(Trainer, ResumeContinuesExactly) {
  const std::string phases =
      "  - {name: pre, mode: mha, steps: 4, checkpoint_every: 2}\n  - {name: sparse, mode: dsa_sparse, steps: 4, "
      "checkpoint_every: 2}\n";
  const fs::path full = tmpdir("full"), part = tmpdir("part");
  run(programme(phases), full);
  // Interrupted after the sparse phase's step 3: its step-2 checkpoint is the latest, and
  // metrics.jsonl already holds step 3 (as the whole run's does).
  fs::create_directories(part / "checkpoints");
  fs::copy(full / "checkpoints" / "1-sparse-step2", part / "checkpoints" / "1-sparse-step2", fs::copy_options::recursive);
  std::ofstream(part / "checkpoints" / "latest") << "1-sparse-step2\n";
  fs::copy(full / "programme.json", part / "programme.json");
  fs::copy(full / "metrics.jsonl", part / "metrics.jsonl");
  run(programme(phases), part, true);
  io::TensorMap a = weights(full), b = weights(part);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) EXPECT_TRUE(same(t, b.at(name))) << name << " differs after resume";
  // The files equal an uninterrupted run's: steps after the checkpoint are not repeated, and the
  // phase means and the end-of-run table cover the steps before the resume too.
  EXPECT_EQ(without_timing(full / "metrics.jsonl"), without_timing(part / "metrics.jsonl"));
  EXPECT_EQ(without_timing(full / "summary.json"), without_timing(part / "summary.json"));
  EXPECT_NE(without_timing(full / "summary.json").find("\"pre\""), std::string::npos);

  // A changed programme or changed data is refused, naming what changed; nothing is touched.
  const std::string before = io::read_file((part / "metrics.jsonl").string());
  std::ofstream(part / "checkpoints" / "latest") << "1-sparse-step2\n";
  const std::string lr_changed = std::string(phases).replace(phases.find("steps: 4, checkpoint_every: 2}\n  -"), 5,
                                                             "lr: 0.1, steps");
  try {
    run(programme(lr_changed), part, true);
    ADD_FAILURE() << "a changed lr was accepted on --resume";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("phases[0].lr"), std::string::npos) << e.what();
  }
  auto safe = parse_programme(programme(std::string(phases).replace(phases.rfind("steps: 4"), 8, "steps: 5")),
                              (part / "p.yaml").string());
  std::ostringstream log;
  EXPECT_THROW(run_programme(safe, {part.string(), true}, log), ConfigError);
  EXPECT_EQ(before, io::read_file((part / "metrics.jsonl").string()));
  fs::remove_all(full);
  fs::remove_all(part);
}

TEST(Trainer, DivergenceStopsTheRunWithoutSavingIt) {
  const fs::path out = tmpdir("diverge");
  // A finite but absurd learning rate: the weights overflow within a few steps.
  const std::string p = programme("  - {name: pre, mode: mha, steps: 6, checkpoint_every: 1, lr: 1.0e+30}\n");
  try {
    run(p, out);
    ADD_FAILURE() << "a diverged run ended normally";
  } catch (const DivergenceError& e) {
    EXPECT_NE(std::string(e.what()).find("phase 'pre' step"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(out / "model.safetensors"));
  for (const auto& d : fs::directory_iterator(out / "checkpoints")) {
    if (!d.is_directory()) continue;
    io::TensorMap w = io::load_safetensors((d.path() / "model.safetensors").string());
    for (const auto& [name, t] : w) EXPECT_LT(first_non_finite(t), 0) << d.path() << " " << name;
  }
  fs::remove_all(out);
}

// An update that overflows every weight (lr = 1e39 is infinite in f32) leaves the step's own loss
// finite: the checkpoint's check of every element (index 0 included) must stop the run there,
// before anything non-finite is saved.
TEST(Trainer, AnUpdateThatOverflowsTheWeightsIsStoppedAtTheSave) {
  const fs::path out = tmpdir("overflow");
  const std::string p = programme("  - {name: pre, mode: mha, steps: 3, checkpoint_every: 1, lr: 1.0e+39}\n");
  try {
    run(p, out);
    ADD_FAILURE() << "a run with infinite weights ended normally";
  } catch (const DivergenceError& e) {
    EXPECT_NE(std::string(e.what()).find("became non-finite"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(out / "model.safetensors"));
  if (fs::exists(out / "checkpoints"))
    for (const auto& d : fs::directory_iterator(out / "checkpoints")) {
      if (!d.is_directory()) continue;
      io::TensorMap w = io::load_safetensors((d.path() / "model.safetensors").string());
      for (const auto& [name, t] : w) EXPECT_LT(first_non_finite(t), 0) << d.path() << " " << name;
    }
  fs::remove_all(out);
}

TEST(Trainer, FailedEquivalenceStopsTheProgramme) {
  const fs::path out = tmpdir("eq");
  EXPECT_THROW(run(programme("  - {name: pre, mode: mha, steps: 1}\n"
                             "  - {name: eq, mode: mqa_full_causal, steps: 0, equivalence_rtol: 0.0}\n"),
                   out),
               ConfigError);
  fs::remove_all(out);
}

// attention_backend cudnn is refused before anything is written where it cannot run: on the CPU.
TEST(Trainer, AttentionBackendCudnnNeedsTheCudaDevice) {
  const fs::path dir = tmpdir("cudnn"), out = dir / "run";
  try {
    run(programme("  - {name: pre, mode: mha, steps: 1}\n", "attention_backend: cudnn\n"), out);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), (out / "p.yaml").string() + ": attention_backend cudnn needs device cuda");
  }
  EXPECT_FALSE(fs::exists(out));
  fs::remove_all(dir);
}

// The test seam (TrainOptions::on_rank_ready): called once with the rank before anything is
// read or written, and what it throws ends the run there (tests/python/mpi_dp.py injects a
// rank's failure through it).
TEST(Trainer, TheRankSeamRunsFirstAndItsErrorEndsTheRun) {
  const fs::path dir = tmpdir("seam"), out = dir / "run";
  TrainOptions opt;
  opt.out_dir = out.string();
  std::vector<int> ranks;
  opt.on_rank_ready = [&ranks](int rank) {
    ranks.push_back(rank);
    throw Error("injected");
  };
  std::ostringstream log;
  EXPECT_THROW(run_programme(parse_programme(programme("  - {name: pre, mode: mha, steps: 1}\n"),
                                             (dir / "p.yaml").string()), opt, log),
               Error);
  EXPECT_EQ(ranks, std::vector<int>{0});
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(log.str(), "");
  fs::remove_all(dir);
}

// A plain Hugging Face config (index_* fields, no hmla_layer_modes) defaults to dsa_sparse
// everywhere (DESIGN.md section 2); a programme sets the modes itself, so an mha phase trains.
TEST(Trainer, APlainHfConfigWithoutLayerModesTrains) {
  const fs::path out = tmpdir("plain");
  nlohmann::json cfg = nlohmann::json::parse(io::read_file(HMLA_SOURCE_DIR "/tests/train/tiny_model.json"));
  cfg.erase("hmla_layer_modes");
  std::ofstream(out / "plain.json") << cfg.dump();
  std::string text = programme("  - {name: pre, mode: mha, steps: 1}\n");
  text.replace(text.find(HMLA_SOURCE_DIR "/tests/train/tiny_model.json"),
               std::string(HMLA_SOURCE_DIR "/tests/train/tiny_model.json").size(), (out / "plain.json").string());
  ASSERT_NO_THROW(run(text, out / "run"));
  const auto written = nlohmann::json::parse(io::read_file((out / "run" / "config.json").string()));
  EXPECT_EQ(written["hmla_layer_modes"], nlohmann::json({"mha", "mha"}));
  fs::remove_all(out);
}

std::vector<nlohmann::json> step_rows(const fs::path& out) {
  std::vector<nlohmann::json> rows;
  std::istringstream metrics(io::read_file((out / "metrics.jsonl").string()));
  for (std::string line; std::getline(metrics, line);)
    if (auto j = nlohmann::json::parse(line); j.contains("step")) rows.push_back(j);
  return rows;
}

// mqa_split_kv_b_proj trains the model the unsplit form trains, and keeps kv_b_proj on disk.
//
// The bound (STYLE.md: by rule, not read off a run). The split form changes only the latent
// layers' products with W_kb: k_b_proj holds W_kb transposed, so the BLAS kernel may sum the same
// products in another order (W_vb keeps its layout). MlaLayer.SplitFormComputesTheSameLayer bounds
// one layer's output and gradients by 4 Rkv eps relative to their largest magnitude. Those errors
// add up (first order) over the latent layers of the forward and again in the backward, and the
// LM loss moves by at most 2 max|d logits| (each row's cross-entropy has a gradient of L1 norm
// <= 2 in its logits), with max|logits| <= the loss here (a tiny model near its initialisation:
// logits of order 1, the loss about ln V). Every optimizer step then starts from weights that
// differ by at most the previous updates' differences, which AdamW (lr m / (sqrt(v) + eps), a
// smooth function of the gradient away from 0) keeps of the gradients' relative order: the
// differences grow at most linearly with the steps taken in split phases. So each step's loss,
// KL and gradient norms agree within 2 x steps x 2 layers x 4 Rkv eps, relative.
TEST(Trainer, SplitKvBProjTrainsLikeKvBProj) {
  const std::string phases =
      "  - {name: pre, mode: mha, steps: 2}\n  - {name: eq, mode: mqa_full_causal, steps: 3SPLIT}\n"
      "  - {name: warm, mode: dsa_warmup, steps: 2}\n  - {name: sparse, mode: dsa_sparse, steps: 3SPLIT}\n";
  auto with = [&](const std::string& split) {
    std::string p = phases;
    for (size_t i; (i = p.find("SPLIT")) != std::string::npos;) p.replace(i, 5, split);
    return programme(p);
  };
  const fs::path plain = tmpdir("unsplit"), split = tmpdir("split");
  run(with(""), plain);
  run(with(", mqa_split_kv_b_proj: true"), split);
  const std::vector<nlohmann::json> a = step_rows(plain), b = step_rows(split);
  ASSERT_EQ(a.size(), 10u);
  ASSERT_EQ(b.size(), a.size());
  const int64_t Rkv = 16, latent_layers = 2, split_steps = 6;  // tests/train/tiny_model.json
  const double rtol = 2.0 * split_steps * latent_layers * 4.0 * Rkv * FLT_EPSILON;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    for (const char* key : {"lm_loss", "indexer_kl", "grad_norm_backbone", "grad_norm_indexer"}) {
      if (a[i][key].is_null()) continue;
      const double x = a[i][key].get<double>(), y = b[i][key].get<double>();
      if (i < 2) {
        EXPECT_EQ(x, y) << key << " of step " << i + 1 << " (the mha phase runs no split layer)";
      }
      EXPECT_LE(std::abs(x - y), rtol * std::abs(x)) << key << " of step " << i + 1 << ": " << x << " vs " << y;
      if (x != 0) worst = std::max(worst, std::abs(x - y) / std::abs(x));
    }
  std::printf("split vs unsplit: largest relative difference %.2e (bound %.2e)\n", worst, rtol);
  // Checkpoints and the final weights keep the HF form: the same names and shapes.
  for (const fs::path& w : {split / "model.safetensors", split / "checkpoints" / "1-eq-end" / "model.safetensors"}) {
    const io::TensorMap ws = io::load_safetensors(w.string());
    const io::TensorMap wa = io::load_safetensors((plain / fs::relative(w, split)).string());
    ASSERT_EQ(ws.size(), wa.size()) << w;
    for (const auto& [name, t] : wa) {
      ASSERT_TRUE(ws.count(name)) << w << ": " << name;
      EXPECT_EQ(ws.at(name).shape(), t.shape()) << name;
    }
  }
  fs::remove_all(plain);
  fs::remove_all(split);
}

// No held-out document fits in seq_len: the loss over no targets is not a number to print.
TEST(Trainer, HeldOutLossThatCannotBeEvaluatedIsNullWithAReason) {
  const fs::path out = tmpdir("heldout");
  std::string text = programme("  - {name: pre, mode: mha, steps: 1}\n");
  text.replace(text.find("seq_len: 32"), 11, "seq_len: 4");
  std::ostringstream log;
  run_programme(parse_programme(text, (out / "p.yaml").string()), {out.string(), false}, log);
  EXPECT_NE(log.str().find("[pre] held-out loss not evaluated: no held-out document fits in seq_len = 4 (the "
                           "shortest has "),
            std::string::npos)
      << log.str();
  EXPECT_EQ(log.str().find("0.0000"), std::string::npos) << log.str();
  const auto summary = nlohmann::json::parse(io::read_file((out / "summary.json").string()));
  EXPECT_TRUE(summary[0]["heldout_lm_loss"].is_null());
  EXPECT_NE(summary[0]["heldout_unavailable"].get<std::string>().find("no held-out document fits"), std::string::npos);
  std::istringstream metrics(io::read_file((out / "metrics.jsonl").string()));
  int phase_lines = 0;
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("heldout_lm_loss")) continue;
    ++phase_lines;
    EXPECT_TRUE(j["heldout_lm_loss"].is_null());
    EXPECT_TRUE(j.contains("heldout_unavailable"));
  }
  EXPECT_EQ(phase_lines, 1);
  fs::remove_all(out);
}

// DeepSeek-V3's auxiliary-loss-free balancing through the trainer, against a float64 count made
// here from the step's own batches (the loader's order, rebuilt) and the experts model_logits
// chooses on the step's starting weights: bias = bias0 + rate sign(mean_load - load) per MoE layer,
// bit for bit, and the metrics' imbalance max / mean of those loads.
TEST(Trainer, TheCorrectionBiasMovesByTheStepsGlobalLoad) {
  const fs::path out = tmpdir("moe_bias");
  const std::string text = testing::programme_text(
      "configs/demo_moe_model.json", 5, "micro_batches: 2, moe_bias_update_rate: 0.25, moe_aux_loss_coeff: 0",
      "  - {name: a, mode: mha, steps: 0}\n  - {name: b, mode: mha, steps: 1}\n");
  run(text, out);
  const Programme pr = parse_programme(text, (out / "p.yaml").string());
  const ModelConfig cfg = load_model_config((out / "config.json").string());
  Model m = build_model(cfg, std::vector<bool>(3, false));
  load_into_model(m, checkpoint(out, "0-a-end"), "start");
  PackedLoader loader(load_token_set(pr.data_dir + "/train.safetensors"), 32, pr.seed + 7919ull * 2);  // phase 1
  const int64_t E = 8, k = 2;
  std::vector<double> load(2 * E, 0.0);
  for (int mb = 0; mb < 2; ++mb) {
    const Batch bt = loader.next(2);
    std::vector<Tensor> experts;
    model_logits(m, bt, nullptr, Comm::self(), &experts);
    const std::vector<int32_t> ids = bt.input_ids.to_vector<int32_t>();
    const std::vector<int32_t> ds = bt.layout.doc_start.to_vector<int32_t>();
    for (int j = 0; j < 2; ++j) {
      const std::vector<int32_t> e = experts[size_t(j + 1)].to_vector<int32_t>();
      for (size_t t = 0; t < ids.size(); ++t) {
        if (ids[t] == cfg.pad_token_id || ds[t] > int32_t(t % 32)) continue;  // not a loss row
        for (int64_t i = 0; i < k; ++i) load[size_t(j * E + e[t * k + size_t(i)])] += 1;
      }
    }
  }
  const io::TensorMap end = checkpoint(out, "1-b-end"), start = checkpoint(out, "0-a-end");
  std::ifstream metrics(out / "metrics.jsonl");
  nlohmann::json row;
  for (std::string line; std::getline(metrics, line);)
    if (line.find("\"step\"") != std::string::npos) row = nlohmann::json::parse(line);
  for (int j = 0; j < 2; ++j) {
    const std::string name = "model.layers." + std::to_string(j + 1) + ".mlp.gate.e_score_correction_bias";
    const std::vector<float> b0 = start.at(name).to_vector<float>(), b1 = end.at(name).to_vector<float>();
    double total = 0, most = 0;
    for (int64_t e = 0; e < E; ++e) total += load[size_t(j * E + e)], most = std::max(most, load[size_t(j * E + e)]);
    int moved = 0;
    for (int64_t e = 0; e < E; ++e) {
      const double mean = total / double(E), l = load[size_t(j * E + e)];
      const float sign = mean > l ? 1.f : mean < l ? -1.f : 0.f;
      EXPECT_EQ(b1[size_t(e)], b0[size_t(e)] + 0.25f * sign) << name << " expert " << e;
      moved += sign != 0;
    }
    EXPECT_GT(moved, 0) << name;
    EXPECT_NEAR(row["moe_imbalance"][size_t(j)].get<double>(), most / (total / double(E)), 1e-12);
  }
  EXPECT_EQ(row["moe_layers"], nlohmann::json::array({1, 2}));
  EXPECT_FALSE(row.contains("moe_aux_loss"));  // coefficient 0: no balance loss
}

// Rate 0 leaves the bias where it was initialised (0); the same step at a rate moves it. (That
// counting and coefficient 0 leave the step's bits: tests/model/test_moe.cpp.)
TEST(Trainer, RateZeroLeavesTheBias) {
  const fs::path a = tmpdir("moe_off_a"), b = tmpdir("moe_off_b");
  const std::string phases = "  - {name: a, mode: mha, steps: 1}\n";
  run(testing::programme_text("configs/demo_moe_model.json", 5, "moe_bias_update_rate: 0, moe_aux_loss_coeff: 0",
                              phases),
      a);
  run(testing::programme_text("configs/demo_moe_model.json", 5, "moe_bias_update_rate: 0.5, moe_aux_loss_coeff: 0",
                              phases),
      b);
  const io::TensorMap wa = weights(a), wb = weights(b);
  for (const std::string L : {"1", "2"}) {
    const std::string n = "model.layers." + L + ".mlp.gate.e_score_correction_bias";
    for (float v : wa.at(n).to_vector<float>()) EXPECT_EQ(v, 0.f) << n;  // initialised 0, never moved
    EXPECT_FALSE(same(wa.at(n), wb.at(n))) << n << ": the rate moves it";
  }
}

// The correction bias is saved in every checkpoint and a resumed MoE run continues it exactly:
// the same weights (biases included) and metrics (imbalance and balance loss) as an uninterrupted run.
TEST(Trainer, AResumedMoeRunContinuesItsBalancingExactly) {
  const std::string text = testing::programme_text("configs/demo_moe_model.json", 5, "moe_bias_update_rate: 0.01",
                                                   "  - {name: pre, mode: mha, steps: 4, checkpoint_every: 2}\n");
  const fs::path full = tmpdir("moe_full"), part = tmpdir("moe_part");
  run(text, full);
  fs::create_directories(part / "checkpoints");
  fs::copy(full / "checkpoints" / "0-pre-step2", part / "checkpoints" / "0-pre-step2", fs::copy_options::recursive);
  std::ofstream(part / "checkpoints" / "latest") << "0-pre-step2\n";
  fs::copy(full / "programme.json", part / "programme.json");
  fs::copy(full / "metrics.jsonl", part / "metrics.jsonl");
  run(text, part, true);
  const io::TensorMap a = weights(full), b = weights(part), at2 = checkpoint(full, "0-pre-step2");
  const std::string bias = "model.layers.1.mlp.gate.e_score_correction_bias";
  EXPECT_FALSE(same(at2.at(bias), a.at(bias))) << "the bias moves after the checkpoint";
  for (const auto& [name, t] : a) EXPECT_TRUE(same(t, b.at(name))) << name << " differs after resume";
  EXPECT_EQ(without_timing(full / "metrics.jsonl"), without_timing(part / "metrics.jsonl"));
}

// Multi-token prediction on a tiny V4 stack with a CSA MTP layer (tests/train/tiny_v4_mtp.json;
// docs/deepseek_v4_math.md section 14): a phase with mtp_loss_coeff logs mtp_loss per step and
// trains the MTP layer, whose tensors the checkpoints hold in DeepSeek's names; a phase at 0 logs
// none and leaves them as they were while the stack trains; a resumed run continues exactly.
TEST(Trainer, MtpLayersTrainWhereTheCoefficientIsSetAndResumeExactly) {
  const std::string text = testing::programme_text(
      "tests/train/tiny_v4_mtp.json", 3, "moe_aux_loss_coeff: 0",
      "  - {name: mtp, mode: mha, steps: 2, checkpoint_every: 1, mtp_loss_coeff: 0.3}\n"
      "  - {name: plain, mode: mha, steps: 1}\n");
  const fs::path full = tmpdir("mtp_full"), part = tmpdir("mtp_part");
  run(text, full);
  fs::create_directories(part / "checkpoints");
  fs::copy(full / "checkpoints" / "0-mtp-step1", part / "checkpoints" / "0-mtp-step1", fs::copy_options::recursive);
  std::ofstream(part / "checkpoints" / "latest") << "0-mtp-step1\n";
  fs::copy(full / "programme.json", part / "programme.json");
  fs::copy(full / "metrics.jsonl", part / "metrics.jsonl");
  run(text, part, true);
  // (read after both runs: tensors held during a run would count in its peak_bytes)
  std::ifstream metrics(full / "metrics.jsonl");
  int with = 0, without = 0;
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json row = nlohmann::json::parse(line);
    if (!row.contains("step")) continue;
    if (row["phase"] == "mtp") with += row.contains("mtp_loss") && row["mtp_loss"].get<double>() > 0;
    else without += !row.contains("mtp_loss");
  }
  EXPECT_EQ(with, 2);
  EXPECT_EQ(without, 1);
  const io::TensorMap start = checkpoint(full, "0-mtp-step1"), mid = checkpoint(full, "0-mtp-end"), end = weights(full);
  int mtp = 0;
  for (const auto& [name, t] : end) {
    if (!name.starts_with("mtp.0.")) continue;
    ++mtp;
    EXPECT_TRUE(same(mid.at(name), t)) << name << " moved in the phase at coefficient 0";
  }
  EXPECT_GT(mtp, 40);
  EXPECT_FALSE(same(start.at("mtp.0.e_proj.weight"), mid.at("mtp.0.e_proj.weight")));
  EXPECT_TRUE(end.count("mtp.0.attn.kv_norm.weight") && end.count("mtp.0.attn.indexer.wq_b.weight"));
  EXPECT_FALSE(same(mid.at("head.weight"), end.at("head.weight")));
  const io::TensorMap b = weights(part);
  for (const auto& [name, t] : end) EXPECT_TRUE(same(t, b.at(name))) << name << " differs after resume";
  EXPECT_EQ(without_timing(full / "metrics.jsonl"), without_timing(part / "metrics.jsonl"));
}


// The DSA programme on a hybrid DeepSeek-V4 stack (DESIGN.md section 10; configs/deepseek_v4_tiny_hybrid.json:
// HCA, hybrid_mla, CSA, hybrid_mla): the four phases with a dense control arm. Entering dsa_warmup
// creates the CSA and hybrid indexers (none before: the pretrain checkpoint has none); dsa_warmup
// moves nothing but them (mHC, MoE and its router bias, compressors, hash table all frozen; a
// planted bug that ran the backbone's update or the bias rule in warmup fails here); the steps log
// the KL per kind and, on the logging steps (here each phase's last), the attention mass of the CSA
// and HCA kinds (none of the absent sliding kind); the control arm runs in mha from the warmup's end
// and the sparse phase restarts from there too (its first step's model is the control's), and
// summary.json states both arms.
TEST(Trainer, TheProgrammeOnAHybridV4StackWithItsControlArm) {
  const fs::path out = tmpdir("v4prog");
  run(testing::programme_text("configs/deepseek_v4_tiny_hybrid.json", 3, "moe_aux_loss_coeff: 0, warmup_steps: 1",
                              "  - {name: pre, mode: mha, steps: 3}\n  - {name: eq, mode: mqa_full_causal, steps: 0}\n"
                              "  - {name: warm, mode: dsa_warmup, steps: 3}\n"
                              "  - {name: sparse, mode: dsa_sparse, steps: 2, control: dense}\n"),
      out);
  const io::TensorMap pre = checkpoint(out, "1-eq-end"), warm = checkpoint(out, "2-warm-end");
  int indexer = 0;
  for (const auto& [name, t] : warm) {
    if (name.find("indexer.") != std::string::npos) {
      ++indexer;
      EXPECT_FALSE(pre.count(name)) << name;  // created when dsa_warmup began
      continue;
    }
    EXPECT_TRUE(same(t, pre.at(name))) << name << " changed during dsa_warmup";
  }
  EXPECT_EQ(indexer, 2 * 5 + 6);  // two hybrid layers' five, the CSA layer's six (its compressor's four)
  std::ifstream metrics(out / "metrics.jsonl");
  int warm_rows = 0, sparse_rows = 0, control_rows = 0, mass_rows = 0;
  const std::map<std::string, int> last_step = {{"pre", 3}, {"warm", 3}, {"sparse-control", 2}, {"sparse", 2}};
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json row = nlohmann::json::parse(line);
    if (!row.contains("step")) continue;
    const bool logged = row["step"] == last_step.at(row["phase"]);
    for (const char* kind : {"csa", "hca", "sliding"}) {
      double sum = 0;
      for (const char* part : {"window", "entries", "sink"}) {
        const std::string key = std::string("attn_mass_") + part + "_" + kind;
        EXPECT_EQ(row.contains(key), logged && std::string(kind) != "sliding") << key << " in " << line;
        if (!row.contains(key)) continue;
        sum += row[key].get<double>();
        EXPECT_GT(row[key].get<double>(), 0.0) << key;
      }
      if (logged && std::string(kind) != "sliding") {
        EXPECT_NEAR(sum, 1.0, 1e-12) << kind << " in " << line;
      }
    }
    mass_rows += logged;
    if (row["phase"] == "warm" || row["phase"] == "sparse") {
      EXPECT_TRUE(row.contains("indexer_kl_csa") && row.contains("indexer_kl_hybrid")) << line;
      (row["phase"] == "warm" ? warm_rows : sparse_rows) += 1;
    }
    if (row["phase"] == "sparse-control") control_rows += !row.contains("indexer_kl_csa");
  }
  EXPECT_EQ(warm_rows, 3);
  EXPECT_EQ(sparse_rows, 2);
  EXPECT_EQ(control_rows, 2);
  EXPECT_EQ(mass_rows, 4);
  const nlohmann::json summary = nlohmann::json::parse(std::ifstream(out / "summary.json"));
  ASSERT_EQ(summary.size(), 5u);
  EXPECT_EQ(summary[3]["phase"], "sparse-control");
  EXPECT_EQ(summary[3]["mode"], "mha");
  EXPECT_EQ(summary[4]["control"]["phase"], "sparse-control");
  EXPECT_EQ(summary[4]["control"]["heldout_lm_loss"], summary[3]["heldout_lm_loss"]);
  fs::remove_all(out);
}

// The seed's pattern: the MTP layer is hybrid_mla (tests/train/tiny_v4_hybrid_mtp.json: the hybrid
// stack above plus one hybrid_mla MTP layer) and runs the programme with the stack (DESIGN.md section
// 10), mtp_loss_coeff 0.3 in every phase. Its indexer is a parameter from the start (the same names
// in every phase); mha and dsa_sparse log the MTP loss and train the layer; dsa_warmup logs none and
// moves the MTP layer's indexer only (by its KL, counted in indexer_kl_hybrid) while every other MTP
// tensor stays; dsa_sparse moves the indexer on. Planted bugs caught: the MTP layer left out of
// dsa_warmup (its indexer would not move there), its backbone trained in dsa_warmup.
// The four phases with an MTP layer that runs its indexer (mtp_loss_coeff 0.3 throughout): its
// indexer tensors (`indexer`, `n_indexer` of them) move in dsa_warmup, where nothing else of the MTP
// layer does, and in dsa_sparse; `trained` moves in mha and dsa_sparse; the KL of its kind (`kl`)
// is logged in both dsa phases. A planted bug that skipped the MTP layer's KL in warmup (or ran
// it in mha) fails here.
void mtp_layer_runs_the_four_phases(const char* config, const char* indexer, int n_indexer, const char* trained,
                                    const char* kl) {
  const fs::path out = tmpdir("v4mtpkl");
  run(testing::programme_text(config, 3, "moe_aux_loss_coeff: 0, warmup_steps: 1, mtp_loss_coeff: 0.3",
                              "  - {name: pre, mode: mha, steps: 2, checkpoint_every: 1}\n  - {name: eq, mode: mqa_full_causal, steps: 0}\n"
                              "  - {name: warm, mode: dsa_warmup, steps: 2}\n  - {name: sparse, mode: dsa_sparse, steps: 2}\n"),
      out);
  const io::TensorMap start = checkpoint(out, "0-pre-step1"), pre = checkpoint(out, "1-eq-end"),
                      warm = checkpoint(out, "2-warm-end"), end = weights(out);
  int mtp = 0, mtp_indexer = 0;
  for (const auto& [name, t] : warm) {
    if (!name.starts_with("mtp.0.")) continue;
    ++mtp;
    ASSERT_TRUE(pre.count(name) && end.count(name)) << name;  // the same names in every phase
    if (name.starts_with(indexer)) {
      ++mtp_indexer;
      EXPECT_FALSE(same(t, pre.at(name))) << name << " did not move in dsa_warmup";
      EXPECT_FALSE(same(t, end.at(name))) << name << " did not move in dsa_sparse";
    } else {
      EXPECT_TRUE(same(t, pre.at(name))) << name << " changed during dsa_warmup";
    }
  }
  EXPECT_EQ(mtp_indexer, n_indexer);
  EXPECT_GT(mtp, 40);
  int at_start = 0;
  for (const auto& [name, t] : start) at_start += name.starts_with(indexer);
  EXPECT_EQ(at_start, n_indexer);  // there from the start
  for (const char* t : {"mtp.0.e_proj.weight", trained}) {  // trained in mha and dsa_sparse
    EXPECT_FALSE(same(start.at(t), pre.at(t))) << t;
    EXPECT_FALSE(same(pre.at(t), end.at(t))) << t;
  }
  std::ifstream metrics(out / "metrics.jsonl");
  int with = 0, warm_rows = 0;
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json row = nlohmann::json::parse(line);
    if (!row.contains("step")) continue;
    if (row["phase"] == "warm") {
      warm_rows += !row.contains("mtp_loss") && row.contains(kl);
      continue;
    }
    with += row.contains("mtp_loss") && std::isfinite(row["mtp_loss"].get<double>()) && row["mtp_loss"].get<double>() > 0;
    if (row["phase"] == "sparse") {
      EXPECT_TRUE(row.contains(kl)) << line;
    }
  }
  EXPECT_EQ(with, 4);  // pre's and sparse's steps
  EXPECT_EQ(warm_rows, 2);
  fs::remove_all(out);
}

TEST(Trainer, AHybridMlaMtpLayerRunsTheFourPhases) {
  mtp_layer_runs_the_four_phases("tests/train/tiny_v4_hybrid_mtp.json", "mtp.0.self_attn.indexer.", 5,
                                 "mtp.0.self_attn.kv_b_proj.weight", "indexer_kl_hybrid");
}

// The same stack with a CSA MTP layer: its indexer (the two projections and its compressor's four
// tensors) trains by the CSA KL.
TEST(Trainer, ACsaMtpLayerTrainsItsIndexerByTheCsaKl) {
  mtp_layer_runs_the_four_phases("tests/train/tiny_v4_csa_mtp.json", "mtp.0.attn.indexer.", 6, "mtp.0.attn.wkv.weight",
                                 "indexer_kl_csa");
}

}  // namespace
}  // namespace hmla

namespace hmla {
namespace {

// `hmla train --memory-plan --device cuda --plan-seq-len ...` for V4-Flash with no device here: a
// plan per sequence length and phase, with the bf16 compute copy CUDA keeps, against the budget
// HMLA_MEMORY_BUDGET names (an H200's 141 GB), each with its verdict; each plan at its own length,
// the layers' saved activations the same per token at both.
TEST(Trainer, TheV4FlashMemoryPlanNeedsNoDevice) {
  ::setenv("HMLA_MEMORY_BUDGET", "141000000000", 1);
  TrainOptions o;
  o.device = "cuda";
  const std::string t =
      programme_memory_plan(load_programme(HMLA_SOURCE_DIR "/configs/deepseek_v4_flash_4k.yaml"), o, {4096, 16384});
  ::unsetenv("HMLA_MEMORY_BUDGET");
  auto count = [&t](const std::string& what) {
    size_t n = 0;
    for (size_t at = t.find(what); at != std::string::npos; at = t.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("memory plan ["), 8u) << t;  // 2 lengths x 4 phases
  EXPECT_EQ(count("bf16 compute copy"), 8u);
  EXPECT_EQ(count("budget: 131.3 GiB (HMLA_MEMORY_BUDGET)"), 8u);
  EXPECT_EQ(count("fits: no"), 8u);  // 284B parameters: far beyond one GPU (issue 47's sharding)
  std::vector<int64_t> seq, per;  // "= 1 x S x V values": the plan's length and values per token
  const std::string key = "the V4 layers' saved activations (f32) ((batch / micro_batches) x seq_len x (values per token) = 1 x ";
  for (size_t at = t.find(key); at != std::string::npos; at = t.find(key, at + 1)) {
    const std::string rest = t.substr(at + key.size());
    seq.push_back(std::stoll(rest));
    per.push_back(std::stoll(rest.substr(rest.find(" x ") + 3)));
  }
  ASSERT_EQ(seq.size(), 8u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(seq[i], 4096);
    EXPECT_EQ(seq[i + 4], 16384);
    EXPECT_EQ(per[i], per[i + 4]) << i;
    EXPECT_GT(per[i], 1000000);  // V4-Flash's 43 layers keep millions of values per token
  }
}

}  // namespace
}  // namespace hmla
