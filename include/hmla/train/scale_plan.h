// `hmla plan` (docs/scale_out.md, "The plan"): one rank's memory and all-to-all traffic under a
// layout of context, data and expert parallelism and ZeRO-1 (DESIGN.md section 8), from the
// memory plans the trainer checks (plan_rank_parameters, plan_activations); and the search for
// the smallest layouts that fit a device. Nothing is allocated and no device is needed.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "hmla/core/size_check.h"
#include "hmla/model/config.h"

namespace hmla {

// `ranks` ranks: cp consecutive ranks split each sequence's rows, the dp = ranks / cp replicas
// split each step's micro-batches, and ep of the replicas split each MoE layer's routed experts.
struct ScaleLayout {
  int64_t ranks = 1, ep = 1, cp = 1;
  bool shard_optimizer = false;  // ZeRO-1
  int64_t dp() const { return ranks / cp; }
};

// What the ranks train: a model in one phase's modes over micro-batches of rows x seq_len tokens.
struct PlanCase {
  std::string name;           // the phase's, or the model config's file name
  std::string mode;           // the phase's mode ("" for a model config)
  ModelConfig cfg;            // in the phase's modes
  std::vector<bool> indexer;  // the layers that carry indexer tensors
  int64_t seq_len = 4096, rows = 1;
  int64_t micro_batches = 0;  // per optimizer step over all replicas; 0: one per replica
  bool recompute = false;
};

// The cases of CONFIG: a programme (.yaml: one per phase, at its seq_len and micro-batch rows) or
// a model config (.json: one, its layers in the config's modes, `rows` rows per micro-batch);
// seq_lens (empty: the programme's own, else 4096) repeat them at each length.
std::vector<PlanCase> plan_cases(const std::string& config, const std::vector<int64_t>& seq_lens, int64_t rows);

// ConfigError, one line, where the layout cannot train the case: cp must divide ranks and seq_len,
// ep must divide dp and n_routed_experts, dp must divide the micro-batches.
void check_layout(const PlanCase& pc, const ScaleLayout& l);

// One rank's plan (check_layout first).
struct RankPlan {
  MemoryPlan state;        // parameters, gradients, moments, tables, compute copy (plan_rank_parameters)
  MemoryPlan activations;  // a micro-batch's seq_len / cp rows (plan_activations; lower bounds)
  int64_t moe_layers = 0;          // the MoE layers (hash and MTP layers included)
  int64_t tokens = 0;              // a rank's tokens per micro-batch: rows x seq_len / cp
  int64_t rank_micro_batches = 0;  // per rank per step
  int64_t a2a_layer = 0;           // bytes a rank sends per MoE layer per micro-batch (ep_traffic.h)
  int64_t a2a_step = 0;            // per optimizer step, every MoE layer
  int64_t total() const { return state.total() + activations.total(); }
};
RankPlan plan_rank(const PlanCase& pc, const ScaleLayout& l, Device dev);

// The report `hmla plan` prints: per case, the rank's items, the all-to-all bytes and the verdict
// against device_bytes.
std::string rank_plan_report(const std::vector<PlanCase>& cases, const ScaleLayout& l, Device dev,
                             int64_t device_bytes);

// `hmla plan --search`: per seq_len of the cases, for ranks = 8, 16, ..., 1024, the smallest layouts
// (ep, cp, ZeRO-1) whose every case fits device_bytes: none with ep, cp and sharding all no larger.
std::string layout_search(const std::vector<PlanCase>& cases, Device dev, int64_t device_bytes);

// "141GB" (10^9), "80GiB" (2^30), "2TB", "1.5e11": bytes; ConfigError naming the option otherwise.
int64_t parse_device_memory(const std::string& text);

}  // namespace hmla
