// Context parallelism's row shards (hmla/dist/cp.h): the all-gather of [b, rows, W] key blocks
// into every rank's full rows and the reduce-scatter of their gradients back.
#include "hmla/dist/cp.h"

#include "hmla/core/error.h"

namespace hmla {

void check_cp_split(const std::string& split) {
  HMLA_CHECK(split == "contiguous", ConfigError, "--cp-split ", split,
             ": context parallelism splits sequences contiguously (rank r owns rows [r*s/R, (r+1)*s/R)); "
             "no other split is implemented");
}

RowShard row_shard(const Comm& cp, int64_t s) {
  const int64_t R = cp.size();
  HMLA_CHECK(s % R == 0, ConfigError, "context parallelism: ", R, " ranks must divide the sequence length ", s);
  return {s, cp.rank() * (s / R), s / R};
}

namespace {
// The all-gather moves bytes (activations in their compute dtype, tables); the reduce-scatter sums
// f32 gradients.
void check_rows(const Tensor& t, const char* what, bool any_dtype) {
  HMLA_CHECK(t.dim() == 3 &&
                 (t.dtype() == DType::f32 || (any_dtype && (t.dtype() == DType::i32 || t.dtype() == DType::bf16))) &&
                 t.is_contiguous(),
             ShapeError, what, ": expected a contiguous ", any_dtype ? "f32, bf16 or i32" : "f32",
             " [b, rows, W] tensor, got ", dtype_name(t.dtype()), shape_str(t.shape()));
}

// Rows [r * n, (r + 1) * n) of batch row bb of a [b, s, W] tensor: one contiguous block.
Tensor block(const Tensor& t, int64_t bb, int64_t r, int64_t n) {
  return t.slice(0, bb, bb + 1).slice(1, r * n, (r + 1) * n);
}
}  // namespace

// The wire format is [R, b, rows, W]: rank-major blocks, each the rank's rows of every batch row.
// Blocks move by copy_from, so CPU and CUDA tensors alike (the latter through NCCL).
Tensor cp_all_gather_rows(Comm& cp, const Tensor& local) {
  if (cp.size() == 1) return local;
  check_rows(local, "all-gather", true);
  const int64_t R = cp.size(), b = local.size(0), n = local.size(1), W = local.size(2);
  Tensor wire = Tensor::empty({R * b, n, W}, local.dtype(), local.device());
  cp.allgather(local.raw_data(), wire.raw_data(), int64_t(local.nbytes()), local.device());
  Tensor full = Tensor::empty({b, R * n, W}, local.dtype(), local.device());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t bb = 0; bb < b; ++bb) block(full, bb, r, n).copy_from(block(wire, r * b + bb, 0, n));
  return full;
}

Tensor cp_reduce_scatter_rows(Comm& cp, const Tensor& full) {
  if (cp.size() == 1) return full;
  check_rows(full, "reduce-scatter", false);
  const int64_t R = cp.size(), b = full.size(0), W = full.size(2);
  const int64_t n = row_shard(cp, full.size(1)).rows;
  Tensor wire = Tensor::empty({R * b, n, W}, DType::f32, full.device());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t bb = 0; bb < b; ++bb) block(wire, r * b + bb, 0, n).copy_from(block(full, bb, r, n));
  Tensor local = Tensor::empty({b, n, W}, DType::f32, full.device());
  cp.reduce_scatter_sum(wire.data<float>(), local.data<float>(), b * n * W, full.device());
  return local;
}

Tensor take_rows(const Tensor& full, const RowShard& sh) {
  if (sh.row0 == 0 && sh.rows == full.size(1)) return full;
  return full.slice(1, sh.row0, sh.row0 + sh.rows).clone();
}

}  // namespace hmla
