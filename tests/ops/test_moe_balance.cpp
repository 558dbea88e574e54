// The MoE load-balancing ops (hmla/ops/moe.h, docs/moe.md "Load balancing") on the CPU: the
// experts' load per segment over the masked tokens, the bias update's sign rule (sign(0) = 0, rate
// 0 moves nothing), and the sequence-wise balance loss and its gradient against a float64 oracle
// (itself checked by central differences), by the STYLE.md rule (the naive float instance of the
// same oracle sets the bound). Bad arguments are one-line errors.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "hmla/core/error.h"
#include "hmla/ops/moe.h"
#include "cases_moe.h"

namespace hmla {
namespace {

std::vector<double> load_of(const std::vector<int32_t>& idx, const std::vector<float>& mask, int64_t k, int64_t E,
                            int64_t rows, bool masked = true) {
  const int64_t N = int64_t(idx.size()) / k;
  const Tensor out = Tensor::empty({rows, E}, DType::f64);
  moe_expert_load(Tensor::from_vector<int32_t>({N, k}, idx), masked ? Tensor::from_vector<float>({N}, mask) : Tensor(),
                  rows, false, out);
  return out.to_vector<double>();
}

TEST(MoeBalance, TheLoadCountsEachSegmentsMaskedChoices) {
  // 4 tokens in 2 segments, k = 2, E = 3; token 1 is padding (mask 0).
  const std::vector<int32_t> idx{0, 2, 1, 2, 2, 1, 0, 1};
  const std::vector<float> mask{0.25f, 0.f, 0.25f, 0.25f};
  EXPECT_EQ(load_of(idx, mask, 2, 3, 2), std::vector<double>({1, 0, 1, 1, 2, 1}));
  EXPECT_EQ(load_of(idx, mask, 2, 3, 1), std::vector<double>({2, 2, 2}));
  EXPECT_EQ(load_of(idx, mask, 2, 3, 1, false), std::vector<double>({2, 3, 3}));  // no mask: every token
  // accumulate adds into what is there (the step's micro-batches).
  const Tensor acc = Tensor::from_vector<double>({1, 3}, {10, 20, 30});
  moe_expert_load(Tensor::from_vector<int32_t>({4, 2}, idx), Tensor::from_vector<float>({4}, mask), 1, true, acc);
  EXPECT_EQ(acc.to_vector<double>(), std::vector<double>({12, 22, 32}));
}

std::vector<float> updated(std::vector<float> bias, const std::vector<double>& load, float rate) {
  const int64_t E = int64_t(bias.size());
  const Tensor b = Tensor::from_vector<float>({E}, bias);
  moe_bias_update(b, Tensor::from_vector<double>({E}, load), rate);
  return b.to_vector<float>();
}

TEST(MoeBalance, TheBiasMovesBySignOfMeanMinusLoad) {
  const std::vector<float> bias{0.5f, -0.25f, 0.125f, 0.f};
  // loads 3 1 2 2: mean 2; signs -1, +1, 0, 0 (sign(0) = 0: a balanced expert stays).
  const std::vector<float> got = updated(bias, {3, 1, 2, 2}, 0.01f);
  const std::vector<float> want{0.5f - 0.01f, -0.25f + 0.01f, 0.125f, 0.f};
  for (size_t e = 0; e < got.size(); ++e) EXPECT_EQ(got[e], want[e]) << "expert " << e;
  // A mean that is not an integer (5 / 3): no expert sits on it.
  EXPECT_EQ(updated({0.f, 0.f, 0.f}, {1, 2, 2}, 0.5f), std::vector<float>({0.5f, -0.5f, -0.5f}));
  // Rate 0 leaves every bit (the sign times 0 adds +0 or -0 to a value that is not -0).
  EXPECT_EQ(updated(bias, {3, 1, 2, 2}, 0.f), bias);
  // No load at all (a step of padding): total 0, every sign 0.
  EXPECT_EQ(updated(bias, {0, 0, 0, 0}, 0.01f), bias);
}

// The float64 oracle (and its naive float instance): op_cases::moe_aux_oracle (tests/common/cases_moe.h).
using op_cases::moe_aux_oracle;

TEST(MoeBalance, TheBalanceLossAndItsGradientMatchTheFloat64Oracle) {
  const int64_t rows = 2, N = rows * 7, E = 8, k = 3;
  std::mt19937 rng(28);
  std::normal_distribution<float> nd(0.f, 1.5f);
  std::vector<float> u(size_t(N * E)), mask(size_t(N), 1.f);
  for (float& x : u) x = nd(rng);
  mask[3] = mask[12] = mask[13] = 0.f;  // padding inside and at the end of a row
  std::vector<int32_t> idx;
  for (int64_t t = 0; t < N; ++t)  // k distinct experts per token
    for (int64_t j = 0; j < k; ++j) idx.push_back(int32_t((t * 5 + j * 3) % E));
  const std::vector<double> F = load_of(idx, mask, k, E, rows);
  const double scale = 1e-2 * double(E) / (double(k) * rows);
  const Tensor dl = Tensor::zeros({N, E}, DType::f32), loss = Tensor::from_vector<double>({1}, {0.5});
  moe_aux_loss(Tensor::from_vector<float>({N, E}, u), Tensor::from_vector<double>({rows, E}, F),
               Tensor::from_vector<float>({N}, mask), k, scale, dl, loss);
  std::vector<double> g64;
  std::vector<float> g32;
  const double l64 = moe_aux_oracle<double>(u, F, mask, N, E, k, rows, scale, &g64);
  const float l32 = moe_aux_oracle<float>(u, F, mask, N, E, k, rows, scale, &g32);
  // The oracle's gradient against central differences of its own loss (h = 1e-4 on u ~ 1: the
  // truncation error h^2 |f'''| ~ 1e-8 relative, far below the 1e-6 asserted).
  for (int64_t i = 0; i < N * E; i += 5) {
    const double h = 1e-4;
    auto at = [&](double d) {
      std::vector<double> ud(u.begin(), u.end());
      ud[size_t(i)] += d;
      return moe_aux_oracle<double>(ud, F, mask, N, E, k, rows, scale, nullptr);
    };
    const double fd = (at(h) - at(-h)) / (2 * h);
    EXPECT_NEAR(g64[size_t(i)], fd, 1e-6 * std::abs(scale) + 1e-9) << "entry " << i;
  }
  // The kernel by the rule: within twice the naive float instance's error, plus 8 ulps of the
  // magnitudes that enter (the loss: its terms; a gradient: c F / S s (1 - s) <= c F / S).
  const double got_loss = loss.to_vector<double>()[0] - 0.5;  // added into what was there
  EXPECT_NEAR(got_loss, l64, 2 * std::abs(double(l32) - l64) + 8 * FLT_EPSILON * std::abs(l64)) << "the loss";
  EXPECT_GT(l64, 0);
  const std::vector<float> got = dl.to_vector<float>();
  double gmax = 0;
  for (double g : g64) gmax = std::max(gmax, std::abs(g));
  EXPECT_GT(gmax, 0);
  for (size_t i = 0; i < got.size(); ++i) {
    const double naive = std::abs(double(g32[i]) - g64[i]);
    EXPECT_NEAR(got[i], g64[i], 2 * naive + 8 * FLT_EPSILON * gmax) << "dlogits entry " << i;
    if (!(mask[i / size_t(E)] > 0)) {
      EXPECT_EQ(got[i], 0.f) << "a padding token gets no gradient";
    }
  }
}

TEST(MoeBalance, BadArgumentsAreOneLineErrors) {
  const Tensor idx = Tensor::from_vector<int32_t>({3, 1}, {0, 1, 0});
  EXPECT_THROW(moe_expert_load(idx, Tensor(), 2, false, Tensor::empty({2, 2}, DType::f64)), ShapeError);
  EXPECT_THROW(moe_expert_load(idx, Tensor(), 1, false, Tensor::empty({1, 2}, DType::f32)), ShapeError);
  const Tensor b = Tensor::zeros({2}, DType::f32), l = Tensor::zeros({2}, DType::f64);
  EXPECT_THROW(moe_bias_update(b, l, -1.f), ConfigError);
  EXPECT_THROW(moe_bias_update(b, l, NAN), ConfigError);
  EXPECT_THROW(moe_bias_update(b, Tensor::zeros({3}, DType::f64), 0.1f), ShapeError);
}

}  // namespace
}  // namespace hmla
