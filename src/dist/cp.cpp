#include "hmla/dist/cp.h"

#include <cstring>

#include "hmla/core/error.h"

namespace hmla {

RowShard row_shard(const Comm& cp, int64_t s) {
  const int64_t R = cp.size();
  HMLA_CHECK(s % R == 0, ConfigError, "context parallelism: ", R, " ranks must divide the sequence length ", s);
  return {s, cp.rank() * (s / R), s / R};
}

namespace {
void check_rows(const Tensor& t, const char* what) {
  HMLA_CHECK(t.dim() == 3 && t.dtype() == DType::f32 && t.is_contiguous() && t.device() == Device::cpu,
             ShapeError, what, ": expected a contiguous f32 [b, rows, W] CPU tensor, got ", shape_str(t.shape()));
}
}  // namespace

// The wire format is [R, b, rows, W]: rank-major blocks, each the rank's rows of every batch row.
Tensor cp_all_gather_rows(Comm& cp, const Tensor& local) {
  if (cp.size() == 1) return local;
  check_rows(local, "all-gather");
  const int64_t R = cp.size(), b = local.size(0), n = local.size(1), W = local.size(2);
  Tensor wire = Tensor::empty({R, b, n, W}, DType::f32);
  cp.allgather(local.data<float>(), wire.data<float>(), b * n * W);
  Tensor full = Tensor::empty({b, R * n, W}, DType::f32);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t bb = 0; bb < b; ++bb)
      std::memcpy(full.data<float>() + (bb * R * n + r * n) * W, wire.data<float>() + ((r * b + bb) * n) * W,
                  n * W * sizeof(float));
  return full;
}

Tensor cp_reduce_scatter_rows(Comm& cp, const Tensor& full) {
  if (cp.size() == 1) return full;
  check_rows(full, "reduce-scatter");
  const int64_t R = cp.size(), b = full.size(0), s = full.size(1), W = full.size(2);
  const RowShard sh = row_shard(cp, s);
  const int64_t n = sh.rows;
  Tensor wire = Tensor::empty({R, b, n, W}, DType::f32);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t bb = 0; bb < b; ++bb)
      std::memcpy(wire.data<float>() + ((r * b + bb) * n) * W, full.data<float>() + (bb * s + r * n) * W,
                  n * W * sizeof(float));
  Tensor local = Tensor::empty({b, n, W}, DType::f32);
  cp.reduce_scatter_sum(wire.data<float>(), local.data<float>(), b * n * W);
  return local;
}

Tensor take_rows(const Tensor& full, const RowShard& sh) {
  if (sh.row0 == 0 && sh.rows == full.size(1)) return full;
  return full.slice(1, sh.row0, sh.row0 + sh.rows).clone();
}

}  // namespace hmla
