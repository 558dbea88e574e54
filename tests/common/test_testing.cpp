// The suite's own measuring tools against errors made by hand: the STYLE.md tolerance rule and the
// finite-difference check of tests/common/testing.h. Every table row that uses them proves only
// what they reject, so each must reject the error it names and accept the error it allows.
#include <gtest/gtest-spi.h>

#include <cfloat>
#include <cmath>
#include <vector>

#include "testing.h"

namespace hmla::testing {
namespace {

constexpr float kEps = FLT_EPSILON;  // 2^-23: the f32 spacing on [1, 2), so 1 + k eps is exact for k < 2^23

// Naive error e = 2^-10 on |ref| <= 2: the bound is 2e + 8 eps 2 = 2^-9 + 2^-19.
TEST(ToleranceRule, AllowsTwiceTheNaiveErrorAndNoMore) {
  const std::vector<double> oracle{1.0, -2.0, 0.5};
  const std::vector<float> naive{1.f, -2.f + 0x1p-10f, 0.5f};
  expect_within_rule("2x naive", {1.f, -2.f + 0x1p-9f, 0.5f}, naive, oracle);
  EXPECT_NONFATAL_FAILURE(expect_within_rule("3x naive", {1.f, -2.f + 0x1.8p-9f, 0.5f}, naive, oracle),
                          "kernel error");
}

// An exact naive result leaves only the rounding term, 8 ulps of the largest reference value.
TEST(ToleranceRule, TheRoundingTermIsEightUlpsOfTheLargestReference) {
  const std::vector<double> oracle{1.0, -0.25};
  const std::vector<float> naive{1.f, -0.25f};
  expect_within_rule("7 ulps", {1.f + 7 * kEps, -0.25f}, naive, oracle);
  EXPECT_NONFATAL_FAILURE(expect_within_rule("9 ulps", {1.f + 9 * kEps, -0.25f}, naive, oracle), "kernel error");
}

// A result that cancels to 0 still carries the rounding of the terms that cancelled: 8 ulps of
// the caller's cancelled magnitude, not of the (zero) result.
TEST(ToleranceRule, CancelledTermsWidenTheRoundingTerm) {
  const std::vector<double> oracle{0.0, 0.0};
  const std::vector<float> naive{0.f, 0.f};
  expect_within_rule("cancelled", {7 * kEps, 0.f}, naive, oracle, 1.0);
  EXPECT_NONFATAL_FAILURE(expect_within_rule("not cancelled", {7 * kEps, 0.f}, naive, oracle), "kernel error");
}

// NaN never passes; infinities (lse of empty rows) must match exactly, in either direction.
TEST(ToleranceRule, NanAndMismatchedInfinitiesFail) {
  const std::vector<double> oracle{1.0, INFINITY};
  const std::vector<float> naive{1.f, INFINITY};
  expect_within_rule("matching inf", {1.f, INFINITY}, naive, oracle);
  EXPECT_NONFATAL_FAILURE(expect_within_rule("nan", {NAN, INFINITY}, naive, oracle), "kernel error");
  EXPECT_NONFATAL_FAILURE(expect_within_rule("finite for inf", {1.f, 3.f}, naive, oracle), "kernel error");
  EXPECT_NONFATAL_FAILURE(expect_within_rule("inf for finite", {INFINITY, INFINITY}, naive, oracle), "kernel error");
  EXPECT_TRUE(std::isinf(max_abs_err(std::vector<float>{NAN}, {0.0}).max_err));
}

// loss = sum_i x_i^3 has gradient 3 x_i^2: accepted as is, rejected 1% off (0.03 at x = 1, far
// above both the central difference's h^2 error and the tolerance).
TEST(ToleranceRule, TheFiniteDifferenceCheckAcceptsTheGradientAndRejectsAWrongOne) {
  std::vector<double> x{1.0, -0.5, 2.0};
  auto loss = [&] {
    double l = 0;
    for (double v : x) l += v * v * v;
    return l;
  };
  std::vector<double> grad{3.0, 0.75, 12.0};
  expect_fd_gradient(x, grad, loss, "x^3", 1e-6, 1e-5);
  grad[0] *= 1.01;
  EXPECT_NONFATAL_FAILURE(expect_fd_gradient(x, grad, loss, "x^3 1% off", 1e-6, 1e-5), "x^3 1% off[0]");
}

}  // namespace
}  // namespace hmla::testing
