// Expert parallelism's storage (model.h: expert_shard_table, build_model's ep, host_params): each
// rank's table is the replicated tensors in table order, then its block of the routed experts; a
// rank's initialised block is what one rank draws for it; its arena is the plan's byte count; the
// group's rank 0 gathers every block back (host_params), and a loaded checkpoint fills each rank's
// own block. On one rank (the default suite) the group is that rank alone: the table as it is.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "hmla/core/allocator.h"
#include "hmla/core/error.h"
#include "hmla/model/model.h"
#include "hmla/model/rank_plan.h"

namespace hmla {
namespace {

std::vector<ModelConfig> moe_configs() {
  ModelConfig v4 = load_model_config(HMLA_SOURCE_DIR "/tests/train/tiny_v4_mtp.json");
  v4.v4.mtp_params = true;  // its MTP layer's experts are parameters too
  return {load_model_config(HMLA_SOURCE_DIR "/configs/demo_moe_model.json"), v4};
}

std::vector<bool> indexers(const ModelConfig& c) { return std::vector<bool>(size_t(c.num_hidden_layers), true); }

TEST(ExpertShard, NamesTheirExpert) {
  EXPECT_EQ(routed_expert_of("model.layers.1.mlp.experts.12.gate_proj.weight"), 12);
  EXPECT_EQ(routed_expert_of("model.layers.2.ffn.experts.3.w1.weight"), 3);
  EXPECT_EQ(routed_expert_of("mtp.0.ffn.experts.7.w2.weight"), 7);
  EXPECT_EQ(routed_expert_of("model.layers.1.mlp.shared_experts.gate_proj.weight"), -1);
  EXPECT_EQ(routed_expert_of("model.layers.1.mlp.gate.weight"), -1);
  EXPECT_EQ(routed_expert_of("model.layers.1.mlp.experts.x.weight"), -1);
  EXPECT_EQ(routed_expert_of("model.layers.1.mlp.experts.4"), -1);
}

TEST(ExpertShard, TablesSplitTheExpertsInBlocksAfterTheRest) {
  for (const ModelConfig& c : moe_configs()) {
    const std::vector<ParamSpec> all = model_param_table(c, indexers(c));
    const int64_t E = c.moe.n_routed_experts;
    std::vector<std::string> rest, experts;
    for (const ParamSpec& p : all) (routed_expert_of(p.name) < 0 ? rest : experts).push_back(p.name);
    ASSERT_GT(experts.size(), 0u);
    EXPECT_EQ(expert_shard_table(all, E, 1, 0).size(), all.size());
    for (int R : {2, 4, 8}) {
      if (E % R != 0) continue;
      size_t held = 0;
      for (int q = 0; q < R; ++q) {
        const std::vector<ParamSpec> t = expert_shard_table(all, E, R, q);
        ASSERT_GE(t.size(), rest.size());
        for (size_t i = 0; i < rest.size(); ++i) EXPECT_EQ(t[i].name, rest[i]);  // every rank's, in order
        std::vector<std::string> mine, want;  // its block, in table order
        for (size_t i = rest.size(); i < t.size(); ++i) mine.push_back(t[i].name);
        for (const std::string& n : experts)
          if (routed_expert_of(n) >= q * E / R && routed_expert_of(n) < (q + 1) * E / R) want.push_back(n);
        EXPECT_EQ(mine, want) << "rank " << q << " of " << R;
        held += mine.size();
      }
      EXPECT_EQ(held, experts.size()) << "every expert on one rank (R = " << R << ")";
    }
    EXPECT_THROW(expert_shard_table(all, E, 3, 0), ConfigError);
  }
}

TEST(ExpertShard, EachRankHoldsWhatOneRankWouldAndRankZeroGathersItAll) {
  Comm& world = Comm::world();
  const int R = world.size();
  for (const ModelConfig& c : moe_configs()) {
    Model one = build_model(c, indexers(c));
    init_model(one, 7);
    const size_t live = allocator(Device::cpu).live_bytes();
    Model mine = build_model(c, indexers(c), Device::cpu, &world);
    // The arena is the plan's count to the byte: its replicated values and 1/R of the experts.
    MemoryPlan plan;
    plan_rank_parameters(plan, c, mine.has_indexer, RankShare{R, R, false}, DType::f32);
    int64_t tables = 0;  // DeepSeek-V4's hash layers' tid2eid, on the host beside the arena
    for (const MemoryPlan::Item& it : plan.items()) tables += it.what.find("tid2eid") != std::string::npos ? it.bytes : 0;
    EXPECT_EQ(int64_t(allocator(Device::cpu).live_bytes() - live), plan.items().at(0).bytes + tables);
    EXPECT_EQ(mine.arena.nbytes(), plan.items().at(0).bytes);
    EXPECT_EQ(mine.ep, R > 1 ? &world : nullptr);
    EXPECT_EQ(mine.table.size() - mine.first_expert, R > 1 ? (one.table.size() - mine.first_expert) / size_t(R) : 0u);
    init_model(mine, 7);
    for (const auto& [name, t] : mine.params)
      EXPECT_EQ(t.to_vector<float>(), one.params.at(name).to_vector<float>()) << name << " on rank " << world.rank();
    const io::TensorMap got = host_params(mine);
    EXPECT_EQ(got.size(), world.rank() == 0 ? one.params.size() : mine.params.size());
    for (const auto& [name, t] : got) EXPECT_EQ(t.to_vector<float>(), one.params.at(name).to_vector<float>()) << name;
    Model loaded = build_model(c, indexers(c), Device::cpu, &world);  // every rank reads the whole checkpoint
    io::TensorMap ck = host_params(one);
    for (const auto& [name, t] : one.ints) ck[name] = t;  // DeepSeek-V4's tid2eid
    load_into_model(loaded, ck, "one rank's weights");
    EXPECT_EQ(loaded.arena.to_vector<float>(), mine.arena.to_vector<float>());
  }
  world.barrier();
}

}  // namespace
}  // namespace hmla
