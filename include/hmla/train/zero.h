// ZeRO-1's placement (DESIGN.md section 8, docs/scale_out.md "Sharded optimizer (ZeRO-1)"): which
// rank owns each whole tensor's optimizer state (Muon's Newton-Schulz needs whole matrices), and
// the owner-ordered gradient arena whose equal blocks a reduce-scatter and an all-gather move.
#pragma once
#include <cstdint>
#include <vector>

#include "hmla/model/model.h"

namespace hmla {

// Greedy by size (longest-processing-time first): the entries in order of descending numel (equal
// sizes: the earlier entry first), each to the rank with the least load so far (equal loads: the
// lower rank). `load` (one per rank) carries the loads in and out, so a second call continues
// the first's balance. Returns the owner of each entry. Balanced: afterwards no rank's load
// exceeds another's by more than the largest entry placed (when the loads came in equal).
std::vector<int> assign_shards(const std::vector<int64_t>& numel, std::vector<int64_t>& load);

// A table's placement over `ranks` ranks, seen from `rank`.
struct ShardPlan {
  int ranks = 1, rank = 0;
  std::vector<int> owner;       // per table entry
  std::vector<int64_t> offset;  // per table entry: its first value in the owner-ordered arena
  std::vector<int64_t> load;    // per rank: the values it owns
  int64_t block = 0;            // values per rank's block: the largest load (the rest is zero padding)
  int64_t arena_numel() const { return block * ranks; }
  bool mine(size_t entry) const { return owner[entry] == rank; }
};

// The entries the optimizer updates (`trained`) are placed first, balanced among themselves (their
// moments are the memory ZeRO-1 divides); the others (frozen in this phase: their gradients are
// still reduced and counted in the norms) continue from those loads. Within a block the owner's
// entries keep table order.
ShardPlan shard_plan(const std::vector<ParamSpec>& table, const std::vector<bool>& trained, int ranks, int rank);

// Every table entry's view of an owner-ordered arena (f32 [plan.arena_numel()]).
io::TensorMap shard_views(const std::vector<ParamSpec>& table, const ShardPlan& plan, const Tensor& arena);

}  // namespace hmla
