// The MoE ops (hmla/ops/moe.h, docs/moe.md) on the CPU: the router's tie rule (the smaller index
// wins, in a group's rank and an expert's), the bias that chooses but does not weigh, and the
// dispatch's order (slots grouped by expert, each expert's in token order). Their arithmetic
// against a float64 oracle is tests/model/test_moe.cpp's (the whole MoE MLP). On a CUDA device
// (the emulated one in test_cuda_emu) the ops are refused with the dispatch's one-line error, but
// the load-balancing ops, whose CUDA kernels equal the CPU's on a case table.
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

// The load-balancing ops on a CUDA device (moe_balance.cu; the emulated one in test_cuda_emu)
// against the CPU kernels on one case table: the load (integer counts) and the bias update exactly;
// the balance loss and its gradient within 8 f32 ulps of the magnitudes that enter per term (the
// two differ only in expf's last bits and the compiler's contraction).
TEST(MoeOps, TheBalancingOpsOnCudaEqualTheCpus) {
  if (!cuda_backend() || cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const int64_t rows = 3, N = rows * 5, E = 8, k = 2;
  std::vector<int32_t> idx;
  std::vector<float> mask(size_t(N), 1.f), u(size_t(N * E));
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < k; ++j) idx.push_back(int32_t((t * 3 + j * 5) % E));
  mask[4] = mask[9] = 0.f;
  for (size_t i = 0; i < u.size(); ++i) u[i] = float(std::sin(double(i) * 1.7)) * 2.f;
  auto on = [](const Tensor& t, Device d) { return d == Device::cpu ? t.clone() : t.to(d); };
  std::vector<double> loads[2];
  std::vector<float> biases[2], dls[2];
  double losses[2];
  for (int di = 0; di < 2; ++di) {
    const Device d = di ? Device::cuda : Device::cpu;
    const Tensor id = on(Tensor::from_vector<int32_t>({N, k}, idx), d);
    const Tensor m = on(Tensor::from_vector<float>({N}, mask), d);
    const Tensor load = on(Tensor::from_vector<double>({rows, E}, std::vector<double>(size_t(rows * E), 1.0)), d);
    moe_expert_load(id, m, rows, true, load);
    loads[di] = load.to(Device::cpu).to_vector<double>();
    const Tensor bias = on(Tensor::from_vector<float>({E}, {0.5f, -0.25f, 0.f, 0.125f, 1.f, 0.f, -1.f, 0.25f}), d);
    const Tensor total = Tensor::zeros({1, E}, DType::f64, d);
    moe_expert_load(id, m, 1, false, total);
    moe_bias_update(bias, total.view({E}), 0.01f);
    biases[di] = bias.to(Device::cpu).to_vector<float>();
    const Tensor counts = Tensor::zeros({rows, E}, DType::f64, d), dl = Tensor::zeros({N, E}, DType::f32, d);
    const Tensor loss = Tensor::zeros({1}, DType::f64, d);
    moe_expert_load(id, m, rows, false, counts);
    moe_aux_loss(on(Tensor::from_vector<float>({N, E}, u), d), counts, m, k, 0.3, dl, loss);
    dls[di] = dl.to(Device::cpu).to_vector<float>();
    losses[di] = loss.to(Device::cpu).to_vector<double>()[0];
  }
  EXPECT_EQ(loads[1], loads[0]);
  EXPECT_EQ(biases[1], biases[0]);
  EXPECT_NEAR(losses[1], losses[0], 8 * FLT_EPSILON * std::abs(losses[0]));
  float gmax = 0;
  for (float g : dls[0]) gmax = std::max(gmax, std::abs(g));
  ASSERT_GT(gmax, 0.f);
  for (size_t i = 0; i < dls[0].size(); ++i) EXPECT_NEAR(dls[1][i], dls[0][i], 8 * FLT_EPSILON * gmax) << i;
}

}  // namespace
}  // namespace hmla
