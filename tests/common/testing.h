// Shared test helpers: seeded random tensors, f32 <-> f64 vectors, and the STYLE.md tolerance
// rule: a kernel's max error against the float64 oracle may be at most 2x the max error of the
// naive f32 implementation plus a rounding term of 8 f32 ulps of the largest magnitude that
// enters the result: the largest reference value, or the caller's `cancelled` magnitude where
// terms cancel (dq = 0 in a one-token document is dP - D, each term as large as dO . v; the naive
// f32 code may cancel them exactly while a kernel that sums them in another order, as any BLAS
// kernel set may, keeps their rounding).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "hmla/core/tensor.h"

namespace hmla::testing {

inline std::vector<float> randn(size_t n, uint64_t seed, float stddev = 1.f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

inline std::vector<double> to_f64(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Columns [c0, c0 + w) of a row-major [rows, width] buffer (a column slice's values, contiguous).
inline std::vector<float> cols(const std::vector<float>& x, int64_t rows, int64_t width, int64_t c0, int64_t w) {
  std::vector<float> o(size_t(rows * w));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < w; ++c) o[size_t(r * w + c)] = x[size_t(r * width + c0 + c)];
  return o;
}

// Rows [r0, r0 + n) of a row-major [b, s, width] vector.
template <class T>
std::vector<T> rows_of(const std::vector<T>& x, int64_t b, int64_t s, int64_t width, int64_t r0, int64_t n) {
  std::vector<T> out;
  for (int64_t bb = 0; bb < b; ++bb)
    out.insert(out.end(), x.begin() + (bb * s + r0) * width, x.begin() + (bb * s + r0 + n) * width);
  return out;
}

struct ErrStats {
  double max_err = 0, max_ref = 0;
};

// Max |x - ref| over entries; inf entries must match exactly (lse of empty rows).
template <class A>
ErrStats max_abs_err(const std::vector<A>& x, const std::vector<double>& ref) {
  ErrStats e;
  EXPECT_EQ(x.size(), ref.size());
  for (size_t i = 0; i < std::min(x.size(), ref.size()); ++i) {
    double xi = static_cast<double>(x[i]);
    if (std::isinf(ref[i]) || std::isinf(xi)) {
      if (xi != ref[i]) e.max_err = INFINITY;
      continue;
    }
    if (std::isnan(xi)) e.max_err = INFINITY;
    e.max_err = std::max(e.max_err, std::abs(xi - ref[i]));
    e.max_ref = std::max(e.max_ref, std::abs(ref[i]));
  }
  return e;
}

// Asserts the tolerance rule for one tensor; returns the kernel's max error.
inline double expect_within_rule(const std::string& what, const std::vector<float>& kernel,
                                 const std::vector<float>& naive32, const std::vector<double>& oracle,
                                 double cancelled = 0) {
  ErrStats k = max_abs_err(kernel, oracle), n = max_abs_err(naive32, oracle);
  const double bound = 2.0 * n.max_err + 8.0 * FLT_EPSILON * std::max(n.max_ref, cancelled);
  EXPECT_LE(k.max_err, bound) << what << ": kernel error " << k.max_err << " vs naive f32 error "
                              << n.max_err << " (max |ref| " << n.max_ref << ", cancelled terms "
                              << cancelled << ")";
  return k.max_err;
}

// Central finite differences of `loss()` (float64, reading x) against the analytic gradient.
template <class Loss>
void expect_fd_gradient(std::vector<double>& x, const std::vector<double>& grad, Loss loss, const char* name,
                        double h = 1e-6, double tol = 1e-7) {
  ASSERT_EQ(x.size(), grad.size()) << name;
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double lp = loss();
    x[i] = x0 - h;
    const double lm = loss();
    x[i] = x0;
    EXPECT_NEAR(grad[i], (lp - lm) / (2 * h), tol) << name << "[" << i << "]";
  }
}

}  // namespace hmla::testing
