// ZeRO-1's placement (hmla/train/zero.h): whole tensors to ranks by a size-greedy rule, and the
// owner-ordered arena (rank r's tensors in table order, padded to the largest load) that lets the
// gradients be reduce-scattered and the weights all-gathered in equal blocks.
#include "hmla/train/zero.h"

#include <algorithm>
#include <numeric>

#include "hmla/core/error.h"

namespace hmla {

std::vector<int> assign_shards(const std::vector<int64_t>& numel, std::vector<int64_t>& load) {
  HMLA_CHECK(!load.empty(), ConfigError, "a sharded optimizer needs at least one rank");
  std::vector<size_t> order(numel.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&numel](size_t a, size_t b) { return numel[a] > numel[b]; });
  std::vector<int> owner(numel.size(), 0);
  for (size_t i : order) {
    const int r = int(std::min_element(load.begin(), load.end()) - load.begin());  // the first of equal loads
    owner[i] = r;
    load[size_t(r)] += numel[i];
  }
  return owner;
}

ShardPlan shard_plan(const std::vector<ParamSpec>& table, const std::vector<bool>& trained, int ranks, int rank) {
  HMLA_CHECK(trained.size() == table.size(), ShapeError, "shard_plan: ", trained.size(), " trained flags for ",
             table.size(), " tensors");
  ShardPlan p;
  p.ranks = ranks, p.rank = rank;
  p.load.assign(size_t(ranks), 0);
  p.owner.assign(table.size(), 0);
  for (const bool pass : {true, false}) {
    std::vector<size_t> entries;
    std::vector<int64_t> numel;
    for (size_t i = 0; i < table.size(); ++i)
      if (trained[i] == pass) entries.push_back(i), numel.push_back(shape_numel(table[i].shape));
    const std::vector<int> owner = assign_shards(numel, p.load);
    for (size_t k = 0; k < entries.size(); ++k) p.owner[entries[k]] = owner[k];
  }
  p.block = *std::max_element(p.load.begin(), p.load.end());
  std::vector<int64_t> next(static_cast<size_t>(ranks), 0);  // each block's first free value
  for (int r = 0; r < ranks; ++r) next[size_t(r)] = int64_t(r) * p.block;
  for (size_t i = 0; i < table.size(); ++i) {
    p.offset.push_back(next[size_t(p.owner[i])]);
    next[size_t(p.owner[i])] += shape_numel(table[i].shape);
  }
  return p;
}

io::TensorMap shard_views(const std::vector<ParamSpec>& table, const ShardPlan& plan, const Tensor& arena) {
  HMLA_CHECK(arena.numel() == plan.arena_numel() && arena.is_contiguous(), ShapeError, "owner-ordered arena of ",
             arena.numel(), " values for a plan of ", plan.arena_numel());
  const Tensor flat = arena.view({arena.numel()});
  io::TensorMap views;
  for (size_t i = 0; i < table.size(); ++i)
    views[table[i].name] = flat.slice(0, plan.offset[i], plan.offset[i] + shape_numel(table[i].shape)).view(table[i].shape);
  return views;
}

}  // namespace hmla
