// One rank's share of a model's training memory under expert parallelism and ZeRO-1 (DESIGN.md
// section 8; `hmla plan`, docs/scale_out.md): the parameter count split into routed experts and
// the rest, the rank's parameters, gradients, moments and compute copy, and the all-to-all
// buffers of expert parallelism. Counted from the same entries as plan_parameters (model.h).
#pragma once
#include <cstdint>
#include <vector>

#include "hmla/core/layout.h"
#include "hmla/core/size_check.h"
#include "hmla/model/config.h"

namespace hmla {

// The parameters split as expert parallelism splits them: the MoE layers' routed experts (MTP
// layers' included), and everything else, which every rank holds.
struct ParamCounts {
  int64_t replicated = 0;      // f32 values
  int64_t routed_experts = 0;  // f32 values, all experts of all MoE layers
  int64_t total() const { return replicated + routed_experts; }
};
ParamCounts count_parameters(const ModelConfig& c, const std::vector<bool>& has_indexer);

// One rank's share of the training state: ep ranks split each MoE layer's routed experts in
// contiguous blocks (ep divides n_routed_experts and dp), the rest replicated; the parameters and
// gradients in f32; AdamW's two f32 moments, with shard_optimizer (ZeRO-1) for 1/copies of the
// replicated values and 1/(copies / ep) of the rank's experts (the ranks holding a replica of them),
// rounded up (copies: the ranks that hold each replicated tensor, cp x dp: --shard-optimizer shards
// over every rank the gradients are summed over, docs/scale_out.md); the hash tables; the compute copy. Items: the parameters, their gradients, the
// moments, then plan_parameters' last items. At ep = dp = 1 unsharded: `hmla train --memory-plan`'s
// state (the parameters 4 times over, then the tables and the copy).
struct RankShare {
  int64_t ep = 1, copies = 1;
  bool shard_optimizer = false;
};
void plan_rank_parameters(MemoryPlan& plan, const ModelConfig& c, const std::vector<bool>& has_indexer,
                          const RankShare& r, DType compute);

// Expert parallelism's buffers beside plan_activations' (ep > 1 on a model with MoE layers): one
// MoE layer's all-to-all rows at a time, sent and received by the dispatch and by the combine, in
// the compute dtype. A rank may receive up to every token's k choices; planned: balanced routing,
// N k rows (N = rows x s).
void plan_ep_buffers(MemoryPlan& plan, const ModelConfig& c, const SizeFactor& rows, const SizeFactor& s, int64_t ep,
                     DType compute);

}  // namespace hmla
