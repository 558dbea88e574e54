// What the entry points of the dense ops (ops/nn.cpp) and the optimizer steps (ops/optim.cpp)
// share beyond entry_point.h: the checks of contiguous operands and f64 scalars, whose messages
// name the op and the operand.
#pragma once

#include "hmla/core/error.h"
#include "hmla/core/tensor.h"
#include "hmla/ops/optim.h"
#include "entry_point.h"

namespace hmla::detail {

inline void check_dtype(const Tensor& t, DType dt, const char* op, const char* name) {
  HMLA_CHECK(t.defined() && t.dtype() == dt, ShapeError, op, ": ", name, " must be ", dtype_name(dt), ", got ",
             desc(t));
}

inline void check_layout(const Tensor& t, const char* dtypes, const Shape& want, const char* op, const char* name) {
  HMLA_CHECK(t.is_contiguous() && t.shape() == want, ShapeError, op, ": ", name, " must be a contiguous ", dtypes,
             shape_str(want), " tensor, got ", desc(t), t.is_contiguous() ? "" : " (strided)");
}

inline void check_contiguous(const Tensor& t, DType dt, const Shape& want, const char* op, const char* name) {
  check_dtype(t, dt, op, name);
  check_layout(t, dtype_name(dt), want, op, name);
}

// An f64 scalar accumulator: one value (a view of a stats buffer allowed).
inline void check_scalar(const Tensor& acc, const char* op) {
  HMLA_CHECK(acc.defined() && acc.dtype() == DType::f64 && acc.numel() == 1, ShapeError, op,
             ": the accumulator must be one f64 value, got ", desc(acc));
}

inline void check_stats(const Tensor& s, const char* op) {
  check_contiguous(s, DType::f64, {kStatCount}, op, "the stats buffer");
}

// A one-value accumulator on dev holding v (the host-returning entries' start).
inline Tensor scalar_holding(double v, Device dev) { return Tensor::from_vector<double>({1}, {v}).on(dev); }

}  // namespace hmla::detail
