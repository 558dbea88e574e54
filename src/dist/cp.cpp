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
void check_rows(const Tensor& t, const char* what, bool any_dtype) {
  HMLA_CHECK(t.dim() == 3 && (t.dtype() == DType::f32 || (any_dtype && t.dtype() == DType::i32)) &&
                 t.is_contiguous() && t.device() == Device::cpu,
             ShapeError, what, ": expected a contiguous ", any_dtype ? "f32 or i32" : "f32",
             " [b, rows, W] CPU tensor, got ", dtype_name(t.dtype()), shape_str(t.shape()));
}
}  // namespace

// The wire format is [R, b, rows, W]: rank-major blocks, each the rank's rows of every batch row.
Tensor cp_all_gather_rows(Comm& cp, const Tensor& local) {
  if (cp.size() == 1) return local;
  check_rows(local, "all-gather", true);
  const int64_t R = cp.size(), b = local.size(0), n = local.size(1), W = local.size(2);
  const size_t es = dtype_size(local.dtype());
  Tensor wire = Tensor::empty({R, b, n, W}, local.dtype());
  cp.allgather(local.raw_data(), wire.raw_data(), b * n * W * es);
  Tensor full = Tensor::empty({b, R * n, W}, local.dtype());
  auto* dst = static_cast<char*>(full.raw_data());
  const auto* src = static_cast<const char*>(wire.raw_data());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t bb = 0; bb < b; ++bb)
      std::memcpy(dst + (bb * R * n + r * n) * W * es, src + (r * b + bb) * n * W * es, n * W * es);
  return full;
}

Tensor cp_reduce_scatter_rows(Comm& cp, const Tensor& full) {
  if (cp.size() == 1) return full;
  check_rows(full, "reduce-scatter", false);
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
