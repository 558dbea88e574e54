// The whole programme on the CUDA backend (run by the SIMT emulator, or on a GPU) against the CPU
// backend in the same process: every phase step by step (LM loss, indexer KL, gradient norms), the held-out
// losses, and resuming across devices (a CPU checkpoint continued on CUDA and a CUDA checkpoint
// continued on the CPU). The model (emu_model.json) has the CUDA kernels' widths: head widths,
// index heads and index width multiples of 16, 16 heads (the sparse backward's warp tile).
//
// Tolerance, from the computation: on CUDA the products round their inputs to bf16 (unit
// roundoff u = 2^-9) and the attention kernels take bf16 copies of q, k, v and dO; the CPU
// computes in f32 (u = 2^-24, negligible). Per layer a value crosses about 12 rounding sites
// (4 projections and 2 MLP products, 2 inputs each; the attention's q, k, v and P), the head 2:
// 26 sites from the ids to the logits, each a relative perturbation <= u, so the logits, and the
// losses and KLs built from them by log-sum-exp, move by <= 26 u ~ 5% relative to first order;
// the backward crosses the same sites again (x2 for the gradient norms). Over a few steps of
// lr 3e-3 the weights' own drift adds less than that. So: the LM losses within 5%, gradient norms
// within 10%. The indexer's KL and gradient are differences between two nearly equal
// distributions (Q ~ P): the rounding acts on log P and log Q, which are far larger than the KL,
// so relative to the KL it weighs like a backward: 10% too. A wrong kernel (a missed mask, a
// transposed product, a lost row) moves any of them by O(1).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hmla/core/cuda.h"
#include "hmla/train/trainer.h"
#include "programmes.h"

namespace hmla {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr double kLossRtol = 0.05, kGradRtol = 0.10;

using testing::programme_text;
using testing::tmpdir;

// Every phase, with a checkpoint after step 2 of the first.
std::string programme() {
  return programme_text("tests/cuda/emu/emu_model.json", 5, "warmup_steps: 1, micro_batches: 2, checkpoint_every: 2",
                        "  - {name: pre, mode: mha, steps: 3}\n  - {name: eq, mode: mqa_full_causal, steps: 1}\n"
                        "  - {name: warm, mode: dsa_warmup, steps: 2}\n  - {name: sparse, mode: dsa_sparse, steps: 2}\n");
}

// The other branches of the device path: an attention sink, Muon (Newton-Schulz on the device's
// products and strided copies), and the split kv_b_proj in the latent phases.
std::string programme_muon_sink_split() {
  return programme_text("tests/cuda/emu/emu_model_sink.json", 6, "warmup_steps: 1, micro_batches: 1, optimizer: muon",
                        "  - {name: pre, mode: mha, steps: 2}\n"
                        "  - {name: eq, mode: mqa_full_causal, steps: 1, mqa_split_kv_b_proj: true}\n"
                        "  - {name: warm, mode: dsa_warmup, steps: 1}\n"
                        "  - {name: sparse, mode: dsa_sparse, steps: 2, mqa_split_kv_b_proj: true}\n");
}

void run(const fs::path& out, const std::string& device, bool resume = false,
         const std::string& text = programme()) {
  TrainOptions o;
  o.resume = resume, o.device = device;
  testing::run_text(text, out, o);
}

std::vector<json> metrics(const fs::path& out) {
  std::vector<json> rows;
  std::ifstream in(out / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) rows.push_back(json::parse(line));
  return rows;
}

double g_worst[2] = {0, 0};  // the largest relative differences seen (losses, gradient norms), printed

void expect_close(const json& a, const json& b, const char* key, double rtol, const std::string& where) {
  if (!a.contains(key) || a[key].is_null()) {
    EXPECT_TRUE(!b.contains(key) || b[key].is_null()) << where << ": " << key;
    return;
  }
  const double x = a[key].get<double>(), y = b[key].get<double>();
  EXPECT_TRUE(std::isfinite(y)) << where << ": " << key;
  double& worst = g_worst[rtol == kLossRtol ? 0 : 1];
  worst = std::max(worst, std::abs(x - y) / std::max(std::abs(x), 1e-6));
  EXPECT_LE(std::abs(x - y), rtol * std::max(std::abs(x), 1e-6)) << where << ": " << key << " cpu " << x << " cuda " << y;
}

// Step rows and phase-end rows of two runs, side by side (the same rows in the same order).
void expect_same_run(const std::vector<json>& cpu, const std::vector<json>& cuda, size_t from = 0) {
  ASSERT_EQ(cpu.size(), cuda.size());
  for (size_t i = from; i < cpu.size(); ++i) {
    const std::string where = cpu[i].dump().substr(0, 40);
    for (const char* k : {"lm_loss", "heldout_lm_loss"}) expect_close(cpu[i], cuda[i], k, kLossRtol, where);
    for (const char* k : {"indexer_kl", "grad_norm_backbone", "grad_norm_indexer"})
      expect_close(cpu[i], cuda[i], k, kGradRtol, where);
  }
}

// A copy of run `from` whose latest checkpoint is `name` (as if it had stopped there).
fs::path stopped_copy(const fs::path& from, const std::string& tag, const std::string& name) {
  const fs::path to = tmpdir(tag);
  fs::remove_all(to);
  fs::copy(from, to, fs::copy_options::recursive);
  std::ofstream(to / "checkpoints" / "latest") << name << "\n";
  return to;
}

// Built twice: over the emulated backend (test_train_emu, label emu) and over the real one
// (test_train_cuda, label gpu: skipped without a device).
#define HMLA_NEED_DEVICE() \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"

TEST(CudaTraining, EveryPhaseMatchesTheCpuAndResumesAcrossDevices) {
  HMLA_NEED_DEVICE();
  const fs::path cpu = tmpdir("cpu"), cuda = tmpdir("cuda");
  run(cpu, "cpu");
  run(cuda, "cuda");
  const std::vector<json> a = metrics(cpu), b = metrics(cuda);
  expect_same_run(a, b);
  size_t steps = 0;
  for (const json& r : b) steps += r.contains("step");
  EXPECT_EQ(steps, 8u);  // 3 + 1 + 2 + 2: every phase ran on the device

  // The CPU's checkpoint after step 2 continued on CUDA, and the CUDA's on the CPU: each run
  // ends as the uninterrupted one on the other device would (the same rule).
  const fs::path c2g = stopped_copy(cpu, "c2g", "0-pre-step2"), g2c = stopped_copy(cuda, "g2c", "0-pre-step2");
  run(c2g, "cuda", true);
  run(g2c, "cpu", true);
  expect_same_run(a, metrics(c2g));
  expect_same_run(b, metrics(g2c));
  std::printf("largest relative difference from the CPU: LM losses %.3g (rule %.3g), KLs and gradient norms %.3g (rule %.3g)\n",
              g_worst[0], kLossRtol, g_worst[1], kGradRtol);
  for (const fs::path& d : {cpu, cuda, c2g, g2c}) fs::remove_all(d);
}

TEST(CudaTraining, MuonSinkAndSplitKvBProjMatchTheCpu) {
  HMLA_NEED_DEVICE();
  const fs::path cpu = tmpdir("muon_cpu"), cuda = tmpdir("muon_cuda");
  run(cpu, "cpu", false, programme_muon_sink_split());
  run(cuda, "cuda", false, programme_muon_sink_split());
  expect_same_run(metrics(cpu), metrics(cuda));
  std::printf("largest relative difference from the CPU so far: LM losses %.3g, KLs and gradient norms %.3g\n",
              g_worst[0], g_worst[1]);
  for (const fs::path& d : {cpu, cuda}) fs::remove_all(d);
}

TEST(CudaTraining, TheRunRecordsItsDevice) {
  HMLA_NEED_DEVICE();
  const fs::path out = tmpdir("env");
  std::ostringstream log;
  TrainOptions o;
  o.out_dir = out.string(), o.device = "cuda";
  Programme pr = parse_programme(programme(), (out / "p.yaml").string());
  pr.phases.resize(1);
  pr.phases[0].steps = 1;
  run_programme(pr, o, log);
  std::ifstream in(out / "hmla-run.json");
  const json j = json::parse(in);
  EXPECT_EQ(j["environment"]["device"].get<std::string>().rfind("cuda: ", 0), 0u) << j.dump();
  fs::remove_all(out);
}

}  // namespace
}  // namespace hmla
