// `hmla plan` (scale_plan.h): one rank's bytes under expert parallelism, ZeRO-1 and context
// parallelism, recounted here from the models' full parameter tables (every expert named), the
// all-to-all count on a hand-computed case, and the layouts refused with one-line errors.
#include <gtest/gtest.h>

#include <tuple>

#include "hmla/core/error.h"
#include "hmla/dist/ep_traffic.h"
#include "hmla/model/model.h"
#include "hmla/model/rank_plan.h"
#include "hmla/model/v4_tables.h"
#include "hmla/train/scale_plan.h"

namespace hmla {
namespace {

struct Split {
  int64_t replicated = 0, experts = 0;
};

// The full table's values, a routed expert's tensors (".experts.<e>.", not shared_experts) apart.
Split split_of(const std::vector<ParamSpec>& table) {
  Split s;
  for (const ParamSpec& p : table) {
    const bool expert = p.name.find(".ffn.experts.") != std::string::npos || p.name.find(".mlp.experts.") != std::string::npos;
    (expert ? s.experts : s.replicated) += shape_numel(p.shape);
  }
  return s;
}

int64_t item(const MemoryPlan& plan, const std::string& starts) {
  for (const MemoryPlan::Item& it : plan.items())
    if (it.what.starts_with(starts)) return it.bytes;
  ADD_FAILURE() << "no item '" << starts << "'";
  return -1;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

PlanCase tiny_v4_case(int64_t s, int64_t rows) {
  return plan_cases(HMLA_SOURCE_DIR "/configs/deepseek_v4_tiny.json", {s}, rows).at(0);
}

TEST(ScalePlan, TheCountsSplitTheFullTablesExpertsFromTheRest) {
  const PlanCase v4 = tiny_v4_case(64, 1);
  const Split t = split_of(v4_param_table(v4.cfg, false, v4.indexer));
  const ParamCounts n = count_parameters(v4.cfg, v4.indexer);
  EXPECT_EQ(n.replicated, t.replicated);
  EXPECT_EQ(n.routed_experts, t.experts);
  EXPECT_GT(t.experts, 0);
  for (const char* cfg : {"/configs/glm5_tiny.json", "/configs/demo_moe_model.json"}) {  // MLA MoE stacks
    const PlanCase pc = plan_cases(std::string(HMLA_SOURCE_DIR) + cfg, {32}, 1).at(0);
    const Split m = split_of(model_param_table(pc.cfg, pc.indexer));
    const ParamCounts c = count_parameters(pc.cfg, pc.indexer);
    EXPECT_EQ(c.replicated, m.replicated) << cfg;
    EXPECT_EQ(c.routed_experts, m.experts) << cfg;
    EXPECT_GT(m.experts, 0) << cfg;
  }
}

// EP divides the experts (8 over ep 2: 4 per layer), ZeRO-1 the moments: the replicated values over
// every rank (cp x dp: the ranks --shard-optimizer shards over), the rank's experts over the
// ranks / ep that hold them, each rounded up.
TEST(ScalePlan, EpDividesTheExpertsAndZeroTheMoments) {
  const PlanCase pc = tiny_v4_case(64, 2);
  const Split t = split_of(v4_param_table(pc.cfg, false, pc.indexer));
  for (const auto& [ranks, ep, cp, shard] : std::vector<std::tuple<int64_t, int64_t, int64_t, bool>>{
           {1, 1, 1, false}, {4, 2, 1, false}, {4, 2, 1, true}, {8, 4, 2, true}, {8, 8, 1, true}, {6, 1, 2, true}}) {
    const ScaleLayout l{ranks, ep, cp, shard};
    const RankPlan r = plan_rank(pc, l, Device::cuda);
    const int64_t held = t.replicated + t.experts / ep;
    EXPECT_EQ(item(r.state, "the parameters (f32)"), 4 * held) << ranks << " " << ep;
    EXPECT_EQ(item(r.state, "their gradients (f32)"), 4 * held);
    const int64_t moments = shard ? ceil_div(t.replicated, ranks) + ceil_div(t.experts / ep, ranks / ep) : held;
    EXPECT_EQ(item(r.state, "the optimizer's moments"), 8 * moments) << ranks << " " << ep << " " << shard;
    EXPECT_EQ(item(r.state, "the weights' bf16 compute copy"), 2 * held);
    // tid2eid: [vocab_size, k] i32 per hash layer, on every rank.
    int64_t ints = 0;
    for (const ParamSpec& p : v4_int_tables(pc.cfg)) ints += 4 * shape_numel(p.shape);
    EXPECT_EQ(r.state.total(), 4 * held + 4 * held + 8 * moments + 2 * held + ints);
  }
  // One rank unsharded is `hmla train --memory-plan`'s state: the f32 parameters 4 times
  // (themselves, gradients, 2 moments), then the tables and the compute copy.
  MemoryPlan one;
  plan_parameters(one, pc.cfg, pc.indexer, false, DType::bf16);
  EXPECT_EQ(plan_rank(pc, {1, 1, 1, false}, Device::cuda).state.total(), one.total() + 3 * one.items().front().bytes);
}

// CP gives a rank seq_len / cp rows of each micro-batch: the layers' saved values per token are
// the same, the rank's tokens half; EP adds the all-to-all buffers of N k rows.
TEST(ScalePlan, CpDividesTheRowsAndEpAddsItsBuffers) {
  const PlanCase pc = tiny_v4_case(64, 2);
  const RankPlan one = plan_rank(pc, {2, 1, 1, false}, Device::cuda), two = plan_rank(pc, {2, 1, 2, false}, Device::cuda);
  EXPECT_EQ(one.tokens, 2 * 64);
  EXPECT_EQ(two.tokens, 2 * 32);
  for (const char* kind : {"the V4 layers' saved activations (f32)", "the V4 layers' saved activations (bf16)"})
    EXPECT_EQ(item(one.activations, kind), 2 * item(two.activations, kind)) << kind;
  MemoryPlan acts;  // the trainer's plan at s / cp
  plan_activations(acts, pc.cfg, {"rows", 2}, {"s", 32}, true, DType::bf16, false);
  EXPECT_EQ(two.activations.total(), acts.total());
  const RankPlan ep = plan_rank(pc, {4, 2, 2, false}, Device::cuda);
  const int64_t k = pc.cfg.moe.num_experts_per_tok, D = pc.cfg.hidden_size;
  EXPECT_EQ(item(ep.activations, "the EP dispatch and combine buffers (balanced routing"), 2 * 32 * k * 4 * D * 2);
  EXPECT_EQ(ep.activations.total(), acts.total() + 2 * 32 * k * 4 * D * 2);
}

// 10 tokens x k 3 over ep 4: 30 choices, 7.5 to each rank, 22 (floor of 22.5) leave; 4 exchanges
// of 22 rows of 8 values of 2 bytes.
TEST(ScalePlan, TheAllToAllCount) {
  EXPECT_EQ(ep_rows_leaving(10, 3, 4), 22);
  EXPECT_EQ(ep_rows_leaving(8, 2, 4), 12);  // 16 choices: 4 stay, 12 leave
  EXPECT_EQ(ep_rows_leaving(10, 3, 1), 0);
  EXPECT_EQ(ep_all_to_all_bytes(10, 3, 8, 2, 4), 4 * 22 * 8 * 2);
  EXPECT_EQ(ep_all_to_all_bytes(10, 3, 8, 2, 1), 0);
  // The tiny V4 stack (4 MoE layers, hash ones included; k 2, hidden 128) at 2 rows x 64 / cp 2
  // over ep 4: 64 tokens x 2 = 128 choices, 96 leave; a programme of 8 micro-batches over dp 4
  // gives each rank 2.
  PlanCase pc = tiny_v4_case(64, 2);
  pc.micro_batches = 8;
  const RankPlan r = plan_rank(pc, {8, 4, 2, false}, Device::cuda);
  EXPECT_EQ(r.moe_layers, 4);
  EXPECT_EQ(r.rank_micro_batches, 2);
  EXPECT_EQ(r.a2a_layer, 4 * 96 * 128 * 2);
  EXPECT_EQ(r.a2a_step, r.a2a_layer * 4 * 2);
  EXPECT_EQ(plan_rank(pc, {8, 4, 2, false}, Device::cpu).a2a_layer, 4 * 96 * 128 * 4);  // f32 on the CPU
}

TEST(ScalePlan, LayoutsItCannotRunAreOneLineErrors) {
  PlanCase pc = tiny_v4_case(64, 1);
  auto refused = [&](const ScaleLayout& l, const std::string& needle) {
    try {
      check_layout(pc, l);
      ADD_FAILURE() << "accepted; expected '" << needle << "'";
    } catch (const ConfigError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(needle), std::string::npos) << m;
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    }
  };
  refused({6, 1, 4, false}, "--cp 4 does not divide --ranks 6");
  refused({6, 1, 3, false}, "--cp 3 does not divide seq_len 64");
  refused({8, 4, 4, false}, "--ep 4 does not divide the 2 data-parallel ranks");
  refused({48, 3, 1, false}, "--ep 3 does not divide n_routed_experts = 8");
  refused({32, 16, 1, false}, "--ep 16 does not divide n_routed_experts = 8");
  pc.micro_batches = 2;
  refused({4, 1, 1, false}, "has micro_batches = 2, which the 4 data-parallel ranks must divide");
  const PlanCase dense = plan_cases(HMLA_SOURCE_DIR "/configs/demo_model.json", {32}, 1).at(0);
  EXPECT_THROW(check_layout(dense, {2, 2, 1, false}), ConfigError);
}

TEST(ScalePlan, DeviceMemoryUnits) {
  EXPECT_EQ(parse_device_memory("141GB"), 141000000000);
  EXPECT_EQ(parse_device_memory("80GiB"), int64_t(80) << 30);
  EXPECT_EQ(parse_device_memory("1.5TB"), 1500000000000);
  EXPECT_EQ(parse_device_memory("4096"), 4096);
  EXPECT_EQ(parse_device_memory("64 kib"), 65536);
  for (const char* bad : {"", "GB", "0", "-1GB", "12XB", "1e30", "nan"})
    EXPECT_THROW(parse_device_memory(bad), ConfigError) << bad;
}

// V4-Flash (284B parameters) at 4096: one rank does not fit an H200; ep 128 x cp 4 over 512 ranks
// with ZeRO-1 does (docs/scale_out.md's table); the report says both, with its all-to-all count.
TEST(ScalePlan, V4FlashOnH200s) {
  const std::vector<PlanCase> cases = plan_cases(HMLA_SOURCE_DIR "/configs/deepseek_v4_flash.json", {4096}, 1);
  ASSERT_EQ(cases.size(), 1u);
  const int64_t h200 = parse_device_memory("141GB");
  EXPECT_GT(plan_rank(cases[0], {1, 1, 1, false}, Device::cuda).total(), h200);
  const std::string fits = rank_plan_report(cases, {512, 128, 4, true}, Device::cuda, h200);
  EXPECT_NE(fits.find(": fits, "), std::string::npos) << fits;
  EXPECT_NE(fits.find("2 routed experts per MoE layer per rank"), std::string::npos) << fits;
  // 1024 tokens x k 6 x 127 / 128 = 6096 rows leave, of 4096 bf16 values, in 43 MoE layers (from a
  // model config the MTP layer does not train).
  EXPECT_NE(fits.find("4 exchanges x 6096 rows leaving"), std::string::npos) << fits;
  EXPECT_EQ(plan_rank(cases[0], {512, 128, 4, true}, Device::cuda).a2a_step, int64_t(4) * 6096 * 4096 * 2 * 43);
  const std::string over = rank_plan_report(cases, {1, 1, 1, false}, Device::cuda, h200);
  EXPECT_NE(over.find(": does not fit, "), std::string::npos) << over;
}

// A programme's phases, each at the replaced seq_len.
TEST(ScalePlan, AProgrammesPhases) {
  const std::vector<PlanCase> cases =
      plan_cases(HMLA_SOURCE_DIR "/configs/deepseek_v4_flash_4k.yaml", {4096, 65536}, 1);
  ASSERT_EQ(cases.size(), 8u);
  EXPECT_EQ(cases[0].name, "pretrain");
  EXPECT_EQ(cases[0].mode, "mha");
  EXPECT_EQ(cases[3].mode, "dsa_sparse");
  EXPECT_EQ(cases[4].seq_len, 65536);
  EXPECT_EQ(cases[0].micro_batches, 1);
}

}  // namespace
}  // namespace hmla
