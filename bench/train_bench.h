// `hmla bench train`: hmla's whole training step (forward + backward + AdamW, f32, this machine's
// threads) next to a PyTorch twin of the same model, weights and batch (tests/python/
// train_twin.py, run by Debian's python3 with python3-torch), interleaved rep by rep. With
// --device cuda (bench "cuda-train"): the step on the GPU with its model FLOPs and MFU, the
// twin on the same GPU (bf16 autocast, SDPA) for the mha phase.
#pragma once
#include <ostream>
#include <string>
#include <vector>

#include "hmla/core/layout.h"
#include "hmla/model/config.h"

namespace hmla::bench {

struct TrainBenchOptions {
  std::string config = "configs/demo_model.json";
  std::vector<int64_t> seq_lens{128, 512};
  std::vector<std::string> modes{"mha", "dsa_sparse"};
  int64_t batch = 4;
  int reps = 5;
  bool json = true;  // the only format (--json accepted like the other benches)
  std::string python = "/usr/bin/python3";  // "" or missing: hmla's arm only
  std::string twin;                          // train_twin.py (default: the source tree's)
  std::string device = "cpu";                // cpu or cuda
};

// The model FLOPs of one training step of `mode` over a batch with this layout (docs/cuda.md):
// 6 x the non-embedding parameters a token uses x tokens (2 x for the backbone in dsa_warmup, which
// runs no backbone backward; a MoE layer's token uses num_experts_per_tok of its routed experts,
// so the other experts' parameters are not counted), plus attention over the valid pairs by the FlashAttention convention (3.5 x
// the forward's 2 (Dqk + Dv) per pair and head; the forward alone in dsa_warmup), sparse attention
// over the valid selected pairs, and in the dsa modes the indexer's scores (2 HI DI per pair of
// A(t)) and its KL (6 HI DI + 2 H Dqk per candidate pair). A DeepSeek-V4 stack (model_flops.cpp):
// the same 6 x parameters (its CSA indexers' only in the DSA modes, where they run), each layer's
// core over its window and compressed entries (2 (d + d) per pair and head, 3.5 x; a CSA layer in
// dsa_sparse over the top-k), and a CSA layer's indexer in the DSA modes: the top-k's scores (2 HI
// DI per visible entry, dsa_sparse) and the KL (6 HI DI + 2 H d per candidate entry); hybrid_mla
// layers as MLA layers of their own geometry.
double model_flops(const ModelConfig& cfg, LayerMode mode, const DocLayout& layout, int64_t params,
                   int64_t embedding_params, int64_t indexer_params);

// An H200's dense bf16 tensor-core peak, the MFU's denominator.
inline constexpr double kH200PeakTflops = 989.5;

void run_train_bench(const TrainBenchOptions& opt, std::ostream& os);

}  // namespace hmla::bench
