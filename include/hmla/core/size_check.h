// Size arithmetic that cannot overflow silently, and the memory budget a command is held to.
// Every factor carries the name of the config field or option that drives it, so an error says
// which value to change ("needs 7.5 TiB for the logits of batch x seq_len x vocab_size = ...")
// instead of ending in std::bad_alloc or a negative size.
#pragma once
#include <cstdint>
#include <string>

#include "hmla/core/allocator.h"
#include <vector>

namespace hmla {

struct SizeFactor {
  std::string name;  // "seq_len", "vocab_size", "index_topk + index_window"; "" for a silent 1
  int64_t value;
};

// a + b; ConfigError naming `what` if it does not fit int64.
int64_t checked_add(int64_t a, int64_t b, const std::string& what);
// The product of the factors; ConfigError "<what>: a x b = 3 x 4 overflows int64" if it does not
// fit, or if a factor is negative.
int64_t checked_product(const std::vector<SizeFactor>& factors, const std::string& what);

// "3.7 TiB", "512 B".
std::string format_bytes(double bytes);

// The bytes a command may plan to use: HMLA_MEMORY_BUDGET when set (bytes with an optional
// K/M/G/T suffix, binary; "unlimited" switches the check off, returned as -1), else the
// machine's physical memory (sysconf). ConfigError for a malformed value.
// On Device::cuda the machine is the GPU: its memory (cudaMemGetInfo's total), unless the variable
// is set.
int64_t memory_budget(Device dev = Device::cpu);
// Where memory_budget() comes from, for messages.
std::string memory_budget_source(Device dev = Device::cpu);

// What a command will allocate, item by item, checked against memory_budget() before anything
// is allocated. The items are lower bounds of the real footprint: the check refuses only what
// cannot fit, and names the largest item.
class MemoryPlan {
 public:
  // `what` ("the logits") takes product(factors) elements of `elem_bytes` each.
  void add(const std::string& what, const std::vector<SizeFactor>& factors, int64_t elem_bytes);
  // An item whose size is already known in bytes; `detail` says where it comes from.
  void add_bytes(const std::string& what, int64_t bytes, const std::string& detail);
  int64_t total() const { return total_; }
  // ConfigError "<context> needs at least X, more than the Y of <source>; the largest part: ..."
  // when the total exceeds the budget.
  void check(const std::string& context, Device dev = Device::cpu) const;

  struct Item {
    std::string what;
    int64_t bytes;
  };
  const std::vector<Item>& items() const { return items_; }

 private:
  std::vector<Item> items_;
  int64_t total_ = 0;
};

}  // namespace hmla
