// `hmla bench v4`: DeepSeek-V4's kernels through their op entry points at V4-Flash's shapes
// (bench/v4_bench.h), one JSON line per (kernel, s); `hmla bench ep`: expert parallelism's exchange
// at a config's MoE geometry under mpirun (bench/ep_bench.h). Registered by `hmla bench` (cmd_bench.cpp).
#include <algorithm>
#include <iostream>
#include <memory>

#include "commands.h"
#include "ep_bench.h"
#include "hmla/core/error.h"
#include "hmla/train/trainer.h"
#include "v4_bench.h"
#include "validators.h"

namespace hmla::app {

void add_bench_v4_command(CLI::App& bench) {
  auto o = std::make_shared<bench::V4BenchOptions>();
  CLI::App* v4 = bench.add_subcommand(
      "v4",
      "DeepSeek-V4's kernels through their op entry points at DeepSeek-V4-Flash's shapes on one causal\n"
      "document: the CSA compressor (rate 4, overlapping), its indexer's top-k, the attention core over\n"
      "the top-k and over every visible entry, the sparse and dense CSA KL, the HCA compressor and core\n"
      "(rate 128), mHC's entry and exit, the sqrtsoftplus router. One JSON line per (kernel, s): median\n"
      "ms, FLOPs or bytes (docs/bench.md), TFLOP/s or GB/s, the device and the implementation that ran;\n"
      "a row the device cannot hold or run is a line saying why.");
  v4->add_option("--device", o->device, "cuda, or cpu (small --s for a rehearsal)")
      ->capture_default_str()
      ->check(OneOf({"cpu", "cuda"}, "device"));
  v4->add_option("--s", o->seq_lens, "sequence lengths")->delimiter(',')->capture_default_str()->check(Int(1, 1 << 24));
  v4->add_option("--reps", o->reps, "timed runs after one warm-up (0: up to 5, as many as fit about 2 s)")
      ->capture_default_str()
      ->check(Int(0, 1000));
  v4->add_option("--dense-max-s", o->dense_max_s,
                 "the dense CSA rows (core and KL over every visible entry) only up to this s (0: every s)")
      ->capture_default_str()
      ->check(Int(0));
  v4->add_option("--kernels", o->kernels, "only these kernels (default: all; see docs/bench.md)")->delimiter(',');
  v4->add_option("--heads", o->heads, "attention heads H")->capture_default_str()->check(Int(1, 1 << 16));
  v4->add_option("--head-dim", o->head_dim, "head width d (RoPE slice included)")->capture_default_str()->check(Int(1, 1 << 16));
  v4->add_option("--index-heads", o->index_heads, "CSA index heads HI")->capture_default_str()->check(Int(1, 1 << 16));
  v4->add_option("--index-dim", o->index_dim, "CSA index head width DI")->capture_default_str()->check(Int(1, 1 << 16));
  v4->add_option("--topk", o->topk, "CSA top-k K")->capture_default_str()->check(Int(1, 1 << 20));
  v4->add_option("--csa-rate", o->csa_rate, "CSA compress rate")->capture_default_str()->check(Int(1, 1 << 20));
  v4->add_option("--hca-rate", o->hca_rate, "HCA compress rate")->capture_default_str()->check(Int(1, 1 << 20));
  v4->add_option("--window", o->window, "sliding window")->capture_default_str()->check(Int(1, 1 << 24));
  v4->add_option("--hc-mult", o->hc_mult, "mHC streams (at most 8)")->capture_default_str()->check(Int(1, 8));
  v4->add_option("--hidden", o->hidden, "hidden size (mHC's stream width)")->capture_default_str()->check(Int(1, 1 << 20));
  v4->add_option("--sinkhorn-iters", o->sinkhorn_iters, "mHC's Sinkhorn iterations")->capture_default_str()->check(Int(1, 1000));
  v4->add_option("--experts", o->experts, "routed experts E")->capture_default_str()->check(Int(1, 1 << 20));
  v4->add_option("--experts-per-tok", o->experts_per_tok, "experts per token k (<= E)")
      ->capture_default_str()
      ->check(Int(1, 1 << 20));
  v4->callback([o] {
    HMLA_CHECK(o->experts_per_tok <= o->experts, ConfigError, "--experts-per-tok ", o->experts_per_tok,
               " must be at most --experts ", o->experts);
    const auto& known = bench::v4_bench_kernels();
    for (const std::string& k : o->kernels)
      if (std::find(known.begin(), known.end(), k) == known.end()) {
        std::string list;
        for (const std::string& n : known) list += (list.empty() ? "" : ", ") + n;
        throw ConfigError("--kernels " + k + ": no such kernel; the kernels are " + list);
      }
    training_device(o->device);  // a clear error without a GPU
    bench::run_v4_bench(*o, std::cout);
  });
}

void add_bench_ep_command(CLI::App& bench) {
  auto o = std::make_shared<bench::EpBenchOptions>();
  CLI::App* ep = bench.add_subcommand(
      "ep",
      "Expert parallelism's all-to-all (run under mpirun: every rank of the job is one EP group) at a\n"
      "model config's MoE geometry: per MoE layer and micro-batch, the forward's dispatch and combine and\n"
      "the backward's two exchanges with balanced routing. One JSON line: the bytes a rank sent, measured\n"
      "on the wire and checked against `hmla plan`'s count, and the median ms of a layer's exchanges.");
  ep->add_option("config", o->config, "model config (.json) with MoE layers")->required()->check(CLI::ExistingFile);
  ep->add_option("--seq-len", o->seq_len, "rows of a micro-batch's sequence")->capture_default_str()->check(Int(1, 1 << 24));
  ep->add_option("--micro-batch", o->micro_batch, "sequences per micro-batch")->capture_default_str()->check(Int(1, 1 << 16));
  ep->add_option("--dtype", o->dtype, "the rows' dtype")->capture_default_str()->check(OneOf({"bf16", "f32"}, "dtype"));
  ep->add_option("--reps", o->reps, "timed layers after one warm-up")->capture_default_str()->check(Int(1, 1000));
  ep->callback([o] { bench::run_ep_bench(*o, std::cout); });
}

}  // namespace hmla::app
