// The MoE ops (hmla/ops/moe.h, docs/moe.md) on the CPU: the router's tie rule (the smaller index
// wins, in a group's rank and an expert's), the bias that chooses but does not weigh, and the
// dispatch's order (slots grouped by expert, each expert's in token order). Their arithmetic
// against a float64 oracle is tests/model/test_moe.cpp's (the whole MoE MLP). On a CUDA device
// (the emulated one in test_cuda_emu) the ops are refused with the dispatch's one-line error.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <string>
#include <vector>

#include "hmla/core/cuda.h"
#include "hmla/core/error.h"
#include "hmla/ops/backend.h"
#include "hmla/ops/moe.h"

namespace hmla {
namespace {

struct Routed {
  std::vector<int32_t> idx;
  std::vector<float> weight;
};

Routed route(const std::vector<float>& logits, const std::vector<float>& bias, int64_t G, int64_t TG, int64_t k,
             bool norm = true, float rsf = 1.f) {
  const int64_t E = int64_t(bias.size()), N = int64_t(logits.size()) / E;
  MoeRouting r{Tensor::empty({N, k}, DType::i32), Tensor::empty({N, k}, DType::f32), Tensor::empty({N, k}, DType::f32)};
  moe_route_fwd(Tensor::from_vector<float>({N, E}, logits), Tensor::from_vector<float>({E}, bias), G, TG, norm, rsf, r);
  return {r.idx.to_vector<int32_t>(), r.weight.to_vector<float>()};
}

TEST(MoeRouter, ExactTiesGoToTheSmallerIndex) {
  const std::vector<float> zero(8, 0.f);
  // Every score equal: groups 0 and 1 (of 4 groups of 2) are kept, experts 0, 1, 2 chosen in order.
  EXPECT_EQ(route(std::vector<float>(8, 0.5f), zero, 4, 2, 3).idx, std::vector<int32_t>({0, 1, 2}));
  // Groups 1 and 3 tie for the best (one kept): group 1's experts; inside it 2 and 3 tie: 2 first.
  EXPECT_EQ(route({0, 0, 2, 2, 0, 0, 2, 2}, zero, 4, 1, 2).idx, std::vector<int32_t>({2, 3}));
  // Experts 1 and 6 tie for the first place, 3 and 4 for the third: 1, 6, 3.
  EXPECT_EQ(route({0, 3, 0, 1, 1, 0, 3, 0}, zero, 1, 1, 3).idx, std::vector<int32_t>({1, 6, 3}));
  // A group is scored by its top two, not its top one: group 1 (1 + 1) beats group 0 (2 + -3).
  EXPECT_EQ(route({2, -3, 1, 1}, std::vector<float>(4, 0.f), 2, 1, 1).idx, std::vector<int32_t>({2}));
}

TEST(MoeRouter, TheBiasChoosesAndTheScoresWeigh) {
  // Expert 3's score is the smallest, but its bias makes it chosen first; its weight is its score.
  const std::vector<float> u{1.f, 0.5f, 0.f, -1.f};
  const Routed r = route(u, {0.f, 0.f, 0.f, 1.f}, 1, 1, 2, false, 2.f);
  EXPECT_EQ(r.idx, std::vector<int32_t>({3, 0}));
  EXPECT_FLOAT_EQ(r.weight[0], 2.f / (1.f + std::exp(1.f)));
  EXPECT_FLOAT_EQ(r.weight[1], 2.f / (1.f + std::exp(-1.f)));
  // Normalised: the chosen weights sum to routed_scaling_factor.
  const Routed n = route(u, {0.f, 0.f, 0.f, 1.f}, 1, 1, 2, true, 2.5f);
  EXPECT_NEAR(n.weight[0] + n.weight[1], 2.5f, 4 * FLT_EPSILON * 2.5f);
}

TEST(MoeOps, TheDispatchGroupsSlotsByExpertInTokenOrder) {
  // 3 tokens, k = 2: slots 0..5 choose experts 2 0 | 0 1 | 2 1.
  const MoeDispatch d = moe_dispatch(Tensor::from_vector<int32_t>({3, 2}, {2, 0, 0, 1, 2, 1}), 3);
  EXPECT_EQ(d.order.to_vector<int32_t>(), std::vector<int32_t>({1, 2, 3, 5, 0, 4}));
  EXPECT_EQ(d.offsets.to_vector<int32_t>(), std::vector<int32_t>({0, 2, 4, 6}));
  EXPECT_EQ(d.pos.to_vector<int32_t>(), std::vector<int32_t>({4, 0, 1, 2, 5, 3}));
  EXPECT_THROW(moe_dispatch(Tensor::from_vector<int32_t>({1, 2}, {1, 1}), 3), ShapeError);  // an expert twice
  EXPECT_THROW(moe_dispatch(Tensor::from_vector<int32_t>({1, 2}, {0, 3}), 3), ShapeError);  // out of range
}

// No CUDA kernels yet: the backend's supports() refuses, and the op says so before anything runs.
TEST(MoeOps, TheCudaBackendRefusesThemClearly) {
  if (!cuda_backend() || cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const Tensor logits = Tensor::zeros({2, 4}, DType::f32, Device::cuda), bias = Tensor::zeros({4}, DType::f32, Device::cuda);
  MoeRouting r{Tensor::empty({2, 2}, DType::i32, Device::cuda), Tensor::empty({2, 2}, DType::f32, Device::cuda),
               Tensor::empty({2, 2}, DType::f32, Device::cuda)};
  try {
    moe_route_fwd(logits, bias, 2, 1, true, 1.f, r);
    ADD_FAILURE() << "accepted";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("moe_route: the cuda backend does not run the MoE ops"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(moe_dispatch(r.idx, 4), ShapeError);
}

}  // namespace
}  // namespace hmla
