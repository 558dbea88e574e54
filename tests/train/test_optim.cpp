// Optimizers against hand-computed updates: the schedule, one AdamW step (bias correction,
// decoupled decay only on matrices, separate clips per group, indexer-only), Muon's
// orthogonalised update (singular values near 1, scaled by 0.2 sqrt(max(rows, cols))) and its
// closed form on a one-row matrix (Nesterov momentum, decay), and the checks of a loaded state.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "cpu_kernels.h"
#include "hmla/train/optim.h"

namespace hmla {
namespace {

Model tiny_model() {
  nlohmann::json j{{"hidden_size", 8},       {"num_attention_heads", 1}, {"num_hidden_layers", 1},
                   {"q_lora_rank", 4},       {"kv_lora_rank", 4},       {"qk_nope_head_dim", 4},
                   {"qk_rope_head_dim", 2},  {"v_head_dim", 4},         {"vocab_size", 12},
                   {"intermediate_size", 16}, {"index_n_heads", 1},     {"index_head_dim", 4},
                   {"index_topk", 2},        {"hmla_layer_modes", {"dsa_warmup"}}};
  Model m = build_model(parse_model_config(j, "t"), {true});
  init_model(m, 1);
  return m;
}

TEST(Optim, WarmupThenCosine) {
  OptimSettings o;
  o.warmup_steps = 4;
  o.total_steps = 14;
  o.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(lr_at(o, 1.0, 0), 0.25);
  EXPECT_DOUBLE_EQ(lr_at(o, 1.0, 3), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(o, 1.0, 4), 1.0);
  EXPECT_NEAR(lr_at(o, 1.0, 9), 0.55, 1e-12);  // half way: 0.1 + 0.9 * 0.5
  EXPECT_NEAR(lr_at(o, 1.0, 14), 0.1, 1e-12);
}

TEST(Optim, AdamWStepByHand) {
  Model m = tiny_model();
  OptimSettings o;
  o.lr = 0.1;
  o.indexer_lr = 0.01;
  o.weight_decay = 0.5;
  o.clip_backbone = 1e9;
  o.clip_indexer = 0.1;  // the indexer group is clipped, the backbone is not
  Tensor garena = Tensor::zeros({m.arena.numel()}, DType::f32);
  io::TensorMap g = arena_views(m.table, garena);
  for (int64_t i = 0; i < garena.numel(); ++i) garena.data<float>()[i] = 0.01f * float(i % 7 + 1);
  const std::string mat = "model.layers.0.mlp.up_proj.weight", vec = "model.norm.weight",
                    idx = "model.layers.0.self_attn.indexer.wk.weight";
  const float w_mat = m.params.at(mat).data<float>()[3], w_vec = m.params.at(vec).data<float>()[2],
              w_idx = m.params.at(idx).data<float>()[1];
  const float g_mat = g.at(mat).data<float>()[3], g_vec = g.at(vec).data<float>()[2], g_idx = g.at(idx).data<float>()[1];
  Optimizer opt(m, o, false);
  OptimStats st = opt.step(m, g, 0);
  // Step 1 of Adam: m^ = g, v^ = g^2, so the update is lr * (sign(g) + wd * w) (eps negligible).
  EXPECT_NEAR(m.params.at(mat).data<float>()[3], w_mat - 0.1f * (1.f + 0.5f * w_mat), 1e-6);
  EXPECT_NEAR(m.params.at(vec).data<float>()[2], w_vec - 0.1f * 1.f, 1e-6);  // no decay on 1-D
  // The indexer group is scaled by 0.1 / norm before the update, which a unit step ignores.
  EXPECT_NEAR(m.params.at(idx).data<float>()[1], w_idx - 0.01f * (1.f + 0.5f * w_idx), 1e-6);
  EXPECT_GT(st.grad_norm_indexer, 0.1);
  (void)g_mat, (void)g_vec, (void)g_idx;

  // indexer_only: the backbone does not move.
  Model m2 = tiny_model();
  Optimizer only(m2, o, true);
  const float before = m2.params.at(mat).data<float>()[3];
  only.step(m2, g, 0);
  EXPECT_EQ(m2.params.at(mat).data<float>()[3], before);
  EXPECT_NE(m2.params.at(idx).data<float>()[1], w_idx);
}

// Clipping is invisible to Adam's first step (the update is sign(g) at any scale), so: two steps,
// the second with twice the gradient. Unclipped (the backbone), Adam sees g then 2g and its second
// update is ((b1 + 2) / (1 + b1)) / sqrt((b2 + 4) / (1 + b2)) sign(g) (bias-corrected moments;
// eps = 0), 0.958 with b1 = 0.9, b2 = 0.95. Clipped (the indexer, its norm far above the clip),
// both steps' gradients scale to the same clip-norm vector, so the second update is sign(g) again.
TEST(Optim, ClippingScalesWhatAdamSees) {
  Model m = tiny_model();
  OptimSettings o;
  o.lr = o.indexer_lr = 0.1;
  o.eps = 0;
  o.total_steps = 100, o.min_lr_ratio = 1.0;  // a constant learning rate
  o.clip_backbone = 0;                        // no clipping
  o.clip_indexer = 1e-3;                      // every step clipped
  Tensor garena = Tensor::zeros({m.arena.numel()}, DType::f32);
  io::TensorMap g = arena_views(m.table, garena);
  auto fill = [&](float k) {
    for (int64_t i = 0; i < garena.numel(); ++i) garena.data<float>()[i] = k * 0.01f * float(i % 7 + 1) * (i % 3 ? 1 : -1);
  };
  const std::string mat = "model.layers.0.mlp.up_proj.weight", idx = "model.layers.0.self_attn.indexer.wk.weight";
  const Tensor w_mat = m.params.at(mat).clone(), w_idx = m.params.at(idx).clone();
  Optimizer opt(m, o, false);
  fill(1.f);
  const std::vector<float> g_mat = g.at(mat).to_vector<float>(), g_idx = g.at(idx).to_vector<float>();
  EXPECT_GT(opt.step(m, g, 0).grad_norm_indexer, 100 * o.clip_indexer);
  fill(2.f);
  opt.step(m, g, 1);
  const double b1 = o.beta1, b2 = o.beta2, u2 = (b1 + 2) / (1 + b1) / std::sqrt((b2 + 4) / (1 + b2));
  auto sign = [](float x) { return x > 0 ? 1.0 : -1.0; };
  for (int64_t i = 0; i < w_mat.numel(); i += 5)
    EXPECT_NEAR(m.params.at(mat).data<float>()[i], w_mat.data<float>()[i] - 0.1 * (1 + u2) * sign(g_mat[size_t(i)]), 1e-6)
        << "backbone, unclipped, element " << i;
  for (int64_t i = 0; i < w_idx.numel(); i += 5)
    EXPECT_NEAR(m.params.at(idx).data<float>()[i], w_idx.data<float>()[i] - 0.1 * 2 * sign(g_idx[size_t(i)]), 1e-6)
        << "indexer, clipped, element " << i;  // 1e-6: the f32 update rounds at ~1e-8 for |w| ~ 0.2
}

TEST(Optim, MuonUpdateIsOrthogonalised) {
  Model m = tiny_model();
  OptimSettings o;
  o.optimizer = "muon";
  o.lr = 1.0;
  o.muon_momentum = 0.0;  // the update is then NS(g) * 0.2 sqrt(max(rows, cols))
  o.clip_backbone = o.clip_indexer = 0;
  const std::string mat = "model.layers.0.mlp.up_proj.weight";  // [16, 8]
  Tensor garena = Tensor::zeros({m.arena.numel()}, DType::f32);
  io::TensorMap g = arena_views(m.table, garena);
  std::mt19937_64 rng(5);
  std::normal_distribution<float> nd;
  for (int64_t i = 0; i < garena.numel(); ++i) garena.data<float>()[i] = nd(rng);
  Tensor before = m.params.at(mat).clone();
  Optimizer opt(m, o, false);
  opt.step(m, g, 0);
  const int64_t R = 16, C = 8;
  std::vector<float> U(R * C), UtU(C * C);
  const float scale = 0.2f * std::sqrt(16.f);
  for (int64_t i = 0; i < R * C; ++i) U[i] = (before.data<float>()[i] - m.params.at(mat).data<float>()[i]) / scale;
  cpu::sgemm(cpu::Trans::yes, cpu::Trans::no, C, C, R, 1.f, U.data(), C, U.data(), C, 0.f, UtU.data(), C);
  for (int64_t i = 0; i < C; ++i) {  // U^T U ~ I: quintic Newton-Schulz lands singular values in ~[0.7, 1.2]
    EXPECT_GT(UtU[i * C + i], 0.45f);
    EXPECT_LT(UtU[i * C + i], 1.5f);
    for (int64_t j = 0; j < C; ++j) {
      if (j != i) {
        EXPECT_LT(std::abs(UtU[i * C + j]), 0.35f) << i << "," << j;
      }
    }
  }
}

// A checkpoint's optimizer state must match the model: missing, of another size or dtype, it is
// refused naming the tensor (an IoError about the checkpoint), before anything is copied.
TEST(Optim, LoadStateRefusesStateThatDoesNotMatchTheModel) {
  Model m = tiny_model();
  Optimizer opt(m, OptimSettings{}, false);
  const int64_t n = m.arena.numel();
  const io::TensorMap good{{"optimizer.m", Tensor::zeros({n}, DType::f32)}, {"optimizer.v", Tensor::zeros({n}, DType::f32)}};
  EXPECT_NO_THROW(opt.load_state(good, "ck"));
  for (const Tensor& bad : {Tensor::zeros({n - 1}, DType::f32), Tensor::zeros({n + 1}, DType::f32),
                            Tensor::zeros({n}, DType::bf16), Tensor()}) {
    io::TensorMap s = good;
    if (bad.defined()) s["optimizer.v"] = bad;
    else s.erase("optimizer.v");
    try {
      opt.load_state(s, "ck");
      ADD_FAILURE() << "a mismatched optimizer.v was loaded";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("optimizer.v"), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not an IoError: " << e.what();
    }
  }
}

// On a one-row matrix Newton-Schulz keeps the row's direction and maps its singular value
// sigma_0 = |u| / (|u| + 1e-7) through the quintic p(x) = a x + b x^3 + c x^5 five times, so
// Muon's update is known in closed form: w -= lr (0.2 sqrt(cols) p^5(sigma_0) u / |u| + wd w), with
// the Nesterov vector u = g + beta m and m = beta m + g. Two steps with non-parallel gradients,
// against that update in float64: plain momentum (u = m) or a missing decay moves w by ~1e-2,
// while the f32 path rounds at ~1e-7 relative per operation over some fifty operations (1e-5).
TEST(Optim, MuonOnARowIsNesterovMomentumAlongItsDirectionPlusDecay) {
  Model m = tiny_model();
  OptimSettings o;
  o.optimizer = "muon";
  o.lr = o.indexer_lr = 0.1;
  o.weight_decay = 0.5;
  o.muon_momentum = 0.9;
  o.warmup_steps = 0, o.total_steps = 100, o.min_lr_ratio = 1.0;  // a constant learning rate
  o.clip_backbone = o.clip_indexer = 0;
  const std::string row = "model.layers.0.self_attn.indexer.weights_proj.weight";
  ASSERT_EQ(m.params.at(row).shape(), Shape({1, 8}));
  Tensor garena = Tensor::zeros({m.arena.numel()}, DType::f32);
  io::TensorMap g = arena_views(m.table, garena);
  std::vector<double> w(8), mom(8, 0.0);
  for (int64_t i = 0; i < 8; ++i) w[size_t(i)] = m.params.at(row).data<float>()[i];
  Optimizer opt(m, o, false);
  for (int64_t step = 0; step < 2; ++step) {
    std::vector<double> u(8);
    double norm = 0;
    for (int64_t i = 0; i < 8; ++i) {
      const float gi = step == 0 ? 0.1f * float(i + 1) : (i % 2 ? 0.3f : -0.2f);  // not parallel
      g.at(row).data<float>()[i] = gi;
      mom[size_t(i)] = 0.9 * mom[size_t(i)] + gi;
      u[size_t(i)] = gi + 0.9 * mom[size_t(i)];
      norm += u[size_t(i)] * u[size_t(i)];
    }
    norm = std::sqrt(norm);
    double sigma = norm / (norm + 1e-7);
    for (int k = 0; k < 5; ++k) sigma = 3.4445 * sigma - 4.7750 * std::pow(sigma, 3) + 2.0315 * std::pow(sigma, 5);
    for (int64_t i = 0; i < 8; ++i)
      w[size_t(i)] -= 0.1 * (0.2 * std::sqrt(8.0) * sigma * u[size_t(i)] / norm + 0.5 * w[size_t(i)]);
    opt.step(m, g, step);
    for (int64_t i = 0; i < 8; ++i)
      EXPECT_NEAR(m.params.at(row).data<float>()[i], w[size_t(i)], 1e-5) << "step " << step << ", element " << i;
  }
}

}  // namespace
}  // namespace hmla
