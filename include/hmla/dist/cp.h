// Context parallelism's row shards (DESIGN.md section 8): rank r of the R ranks of a
// context-parallel group owns rows [r * s / R, (r + 1) * s / R) of every batch row. Keys travel
// at their narrowest: all-gathered as [b, rows, W] blocks, their gradients reduce-scattered back.
// With one rank every function is the identity (no copy).
#pragma once
#include <cstdint>
#include <string>

#include "hmla/core/tensor.h"
#include "hmla/dist/comm.h"

namespace hmla {

struct RowShard {
  int64_t s = 0;     // global rows
  int64_t row0 = 0;  // global position of this rank's first row
  int64_t rows = 0;  // this rank's rows
};

// The split a user asked for (--cp-split): only "contiguous" exists; anything else (zigzag,
// striped, ...) is a ConfigError naming it.
void check_cp_split(const std::string& split);

// This rank's shard of s rows; R not dividing s is a ConfigError.
RowShard row_shard(const Comm& cp, int64_t s);

// [b, rows, W] (f32 or i32) on each rank -> [b, s, W], rows in position order.
Tensor cp_all_gather_rows(Comm& cp, const Tensor& local);
// [b, s, W] partial sums on each rank -> this rank's [b, rows, W] rows of their sum.
Tensor cp_reduce_scatter_rows(Comm& cp, const Tensor& full);
// This shard's rows [row0, row0 + rows) of a [b, s, ...] tensor, as a contiguous copy (the
// tensor itself when the shard is everything).
Tensor take_rows(const Tensor& full, const RowShard& sh);

}  // namespace hmla
