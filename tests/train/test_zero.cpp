// ZeRO-1's placement (hmla/train/zero.h): the size-greedy assignment is deterministic, owns every
// tensor once, and is balanced (no load above another by more than the largest tensor); the plan
// places the trained tensors first and lays each rank's block out in table order.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "hmla/train/zero.h"

namespace hmla {
namespace {

TEST(Zero, AssignmentIsTheGreedyRuleByHand) {
  // Descending sizes 9, 7, 5, 5 (the earlier 5 first), 3, 1 to the least-loaded rank, equal loads
  // to the lower rank: 9 -> 0, 7 -> 1, 5 -> 1 (7 < 9), 5' -> 0 (9 < 12), 3 -> 1 (12 < 14), 1 -> 0.
  std::vector<int64_t> load(2, 0);
  const std::vector<int> owner = assign_shards({5, 9, 1, 7, 5, 3}, load);
  EXPECT_EQ(owner, (std::vector<int>{1, 0, 0, 1, 0, 1}));
  EXPECT_EQ(load, (std::vector<int64_t>{15, 15}));
}

TEST(Zero, AssignmentIsDeterministicBalancedAndOwnsEachTensorOnce) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int ranks = 1 + int(rng() % 9);
    std::vector<int64_t> numel(1 + rng() % 40);
    for (int64_t& n : numel) n = 1 + int64_t(rng() % (rng() % 2 ? 100000 : 64));  // big and small mixed
    std::vector<int64_t> load(size_t(ranks), 0), again(size_t(ranks), 0);
    const std::vector<int> owner = assign_shards(numel, load);
    EXPECT_EQ(owner, assign_shards(numel, again)) << "not deterministic";
    std::vector<int64_t> sum(size_t(ranks), 0);
    for (size_t i = 0; i < numel.size(); ++i) {
      ASSERT_TRUE(owner[i] >= 0 && owner[i] < ranks);
      sum[size_t(owner[i])] += numel[i];
    }
    EXPECT_EQ(sum, load);  // each tensor counted once, at its owner
    const int64_t largest = *std::max_element(numel.begin(), numel.end());
    EXPECT_LE(*std::max_element(load.begin(), load.end()), *std::min_element(load.begin(), load.end()) + largest);
  }
}

TEST(Zero, PlanPlacesTrainedTensorsFirstAndBlocksInTableOrder) {
  const std::vector<ParamSpec> table = {{"a", {4, 4}}, {"b", {8}}, {"indexer.c", {3, 2}}, {"d", {10}}};
  // Only "b" and "indexer.c" train: they split first (8 -> 0, 6 -> 1), then 16 -> 1, 10 -> 0.
  const ShardPlan p = shard_plan(table, {false, true, true, false}, 2, 1);
  EXPECT_EQ(p.owner, (std::vector<int>{1, 0, 1, 0}));
  EXPECT_EQ(p.load, (std::vector<int64_t>{18, 22}));
  EXPECT_EQ(p.block, 22);
  EXPECT_EQ(p.offset, (std::vector<int64_t>{22, 0, 38, 8}));  // rank 1's block: a then indexer.c
  EXPECT_TRUE(p.mine(0) && !p.mine(1));
  const Tensor arena = Tensor::zeros({p.arena_numel()}, DType::f32);
  const io::TensorMap v = shard_views(table, p, arena);
  EXPECT_EQ(v.at("indexer.c").shape(), (Shape{3, 2}));
  EXPECT_EQ(v.at("indexer.c").data<float>() - arena.data<float>(), 38);
}

}  // namespace
}  // namespace hmla
