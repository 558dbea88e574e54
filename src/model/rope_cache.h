// cos/sin tables [s, Dr / 2] for positions pos0 .. pos0 + s - 1 (the token's index in its packed
// row; pos0 > 0 for a context-parallel shard), with the attention factor folded in; shared by the
// MLA layer and the indexer.
#pragma once
#include "hmla/core/tensor.h"
#include "hmla/model/config.h"

namespace hmla {

struct RopeCache {
  Tensor cos, sin;  // f32 [s, Dr / 2]
};

RopeCache rope_cache(const ModelConfig& c, int64_t s, int64_t pos0 = 0);

}  // namespace hmla
