// Optimizers against hand-computed updates: the schedule, one AdamW step (bias correction,
// decoupled decay only on matrices, separate clips per group, indexer-only), Muon's
// orthogonalised update against float64 Newton-Schulz references (the quintic's band of singular
// values, scaled by 0.2 sqrt(max(rows, cols))) and its closed form on a one-row matrix (Nesterov
// momentum, decay), and the checks of a loaded state.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cstdio>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "hmla/train/optim.h"
#include "testing.h"
#include "tiny_config.h"

namespace hmla {
namespace {

Model tiny_model() {
  testing::TinyConfig t;
  t.hidden = 8, t.heads = 1, t.q_lora = 4, t.kv_lora = 4, t.nope = 4, t.rope = 2, t.v = 4, t.vocab = 12, t.intermediate = 16;
  t.indexer = testing::TinyIndexer{1, 4, 2, std::nullopt}, t.modes = {"dsa_warmup"};
  t.init_range = std::nullopt, t.max_positions = std::nullopt;
  Model m = build_model(testing::tiny_config(t, "t"), {true});
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

// Muon against float64 references written from its definition (no SVD): the quintic
// Newton-Schulz iteration p(x) = a x + b x^3 + c x^5 applied to G / |G|_F maps each singular value
// sigma of G to p^k(sigma / |G|_F) and keeps the singular vectors, so the update is U p^k(S') V^T;
// the polar factor Q = U V^T comes from the cubic iteration (1.5, -0.5, 0) run to convergence.
template <class T>
std::vector<T> product(const std::vector<T>& A, const std::vector<T>& B, int64_t n, int64_t k, int64_t m,
                       bool b_transposed) {  // [n, k] x [k, m] (B given as [m, k] when transposed)
  std::vector<T> C(size_t(n * m), T(0));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      T acc = 0;
      for (int64_t l = 0; l < k; ++l) acc += A[i * k + l] * (b_transposed ? B[j * k + l] : B[l * m + j]);
      C[i * m + j] = acc;
    }
  return C;
}

// g [rows, cols] as its wide orientation [r, c], r <= c (a transpose when rows > cols).
std::vector<double> wide(const std::vector<float>& g, int64_t rows, int64_t cols) {
  std::vector<double> x(g.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) x[rows > cols ? j * rows + i : i * cols + j] = g[i * cols + j];
  return x;
}

struct Quintic {
  double a, b, c;
};
constexpr Quintic kMuonNs{3.4445, -4.7750, 2.0315}, kPolar{1.5, -0.5, 0.0};

// k steps of X <- a X + (b A + c A^2) X, A = X X^T, from X = G / |G|_F, in precision T, on the
// wide orientation [r, c] (optim.cpp's order of operations, plain loops instead of BLAS).
template <class T>
std::vector<T> ns_iterate(const std::vector<double>& gw, int64_t r, int64_t c, int steps, Quintic q) {
  double ss = 0;
  for (double v : gw) ss += v * v;
  const T inv = T(1.0 / (std::sqrt(ss) + 1e-7));
  std::vector<T> X(gw.size());
  for (size_t i = 0; i < gw.size(); ++i) X[i] = T(gw[i]) * inv;
  for (int k = 0; k < steps; ++k) {
    const std::vector<T> A = product(X, X, r, c, r, true), AA = product(A, A, r, r, r, false);
    std::vector<T> B(A.size());
    for (size_t i = 0; i < A.size(); ++i) B[i] = T(q.c) * AA[i] + T(q.b) * A[i];
    const std::vector<T> BX = product(B, X, r, r, c, false);
    for (size_t i = 0; i < X.size(); ++i) X[i] = BX[i] + T(q.a) * X[i];
  }
  return X;
}

// Whether the symmetric [n, n] matrix S is positive definite (Cholesky succeeds).
bool positive_definite(std::vector<double> S, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t k = 0; k < j; ++k) S[j * n + j] -= S[j * n + k] * S[j * n + k];
    if (!(S[j * n + j] > 0)) return false;
    S[j * n + j] = std::sqrt(S[j * n + j]);
    for (int64_t i = j + 1; i < n; ++i) {
      for (int64_t k = 0; k < j; ++k) S[i * n + j] -= S[i * n + k] * S[j * n + k];
      S[i * n + j] /= S[j * n + j];
    }
  }
  return true;
}

// Whether every eigenvalue of the symmetric [n, n] S lies in [lo, hi].
bool eigenvalues_within(const std::vector<double>& S, int64_t n, double lo, double hi) {
  std::vector<double> below = S, above(S.size());
  for (size_t i = 0; i < S.size(); ++i) above[i] = -S[i];
  for (int64_t i = 0; i < n; ++i) below[i * n + i] -= lo, above[i * n + i] += hi;
  return positive_definite(below, n) && positive_definite(above, n);
}

// [min, max] of p^k over x in [x0, 1] (the singular values of G / |G|_F when sigma_min / |G|_F >= x0),
// on a grid of step h, widened by max|d p^k / dx| h / 2 (the chain rule along each grid point).
std::pair<double, double> ns_band(double x0, int steps, Quintic q) {
  const int n = 1000000;
  const double h = (1 - x0) / n;
  double lo = INFINITY, hi = -INFINITY, slope = 0;
  for (int i = 0; i <= n; ++i) {
    double x = x0 + h * i, d = 1;
    for (int k = 0; k < steps; ++k) {
      d *= q.a + 3 * q.b * x * x + 5 * q.c * x * x * x * x;
      x = q.a * x + q.b * x * x * x + q.c * x * x * x * x * x;
    }
    lo = std::min(lo, x), hi = std::max(hi, x), slope = std::max(slope, std::abs(d));
  }
  return {lo - slope * h / 2, hi + slope * h / 2};
}

// One Muon update with momentum 0 from zero weights, w = -scale NS_k(g), scale = 0.2 sqrt(max(rows,
// cols)), read in the wide orientation. Two assertions:
// (1) element-wise against the fixed iteration in float64, by the STYLE.md rule. The kernel
//     (optim.cpp on matmul, any BLAS) and the naive f32 loops compute the same 3k products of
//     inner length <= c; each product's rounding is at most gamma_c |A||B| in any summation order
//     or blocking, and both roundings travel through the same iteration map, so the kernel's error
//     is the naive error's size (2x for the order of the sums), plus 8 ulps for the final scaling.
// (2) the update is orthogonalised: with Q = U V^T (the polar factor of g), M = X Q^T = U p^k(S') U^T
//     is symmetric with eigenvalues in the quintic's band (computed by ns_band, not 1). The
//     kernel's error delta (|delta| <= e element-wise, e the bound (1) asserts) moves M by delta Q^T:
//     each entry by at most e sqrt(c) (Q's rows are orthonormal), each eigenvalue by at most
//     |delta|_F <= e sqrt(r c).
void expect_muon_update(const std::string& name, const std::vector<float>& g, const std::vector<float>& w,
                        int64_t rows, int64_t cols, int steps) {
  const int64_t r = std::min(rows, cols), c = std::max(rows, cols);
  const double scale = 0.2 * std::sqrt(double(c)), x0 = 0.05;
  const std::vector<double> gw = wide(g, rows, cols), ww = wide(w, rows, cols);
  const std::vector<double> x64 = ns_iterate<double>(gw, r, c, steps, kMuonNs);
  const std::vector<float> x32 = ns_iterate<float>(gw, r, c, steps, kMuonNs);
  std::vector<float> kernel(ww.size()), naive(ww.size());
  std::vector<double> oracle(ww.size()), upd(ww.size());
  for (size_t i = 0; i < ww.size(); ++i) {
    kernel[i] = float(-ww[i]), naive[i] = float(scale) * x32[i], oracle[i] = scale * x64[i];
    upd[i] = -ww[i] / scale;
  }
  testing::expect_within_rule(name, kernel, naive, oracle);
  const testing::ErrStats n = testing::max_abs_err(naive, oracle);  // e: the rule's bound, not the kernel's error
  const double e = (2 * n.max_err + 8 * FLT_EPSILON * n.max_ref) / scale + 1e-12;

  double ss = 0;
  for (double v : gw) ss += v * v;
  std::vector<double> gram = product(gw, gw, r, c, r, true);
  for (int64_t i = 0; i < r; ++i) gram[i * r + i] -= x0 * x0 * ss;
  ASSERT_TRUE(positive_definite(gram, r)) << name << ": sigma_min / |G|_F < " << x0 << ", outside ns_band's range";
  const std::vector<double> Q = ns_iterate<double>(gw, r, c, 100, kPolar), M = product(upd, Q, r, c, r, true);
  std::vector<double> sym(M.size());
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < r; ++j) {
      EXPECT_NEAR(M[i * r + j], M[j * r + i], 2 * e * std::sqrt(double(c))) << name << ": M not symmetric at " << i << "," << j;
      sym[i * r + j] = (M[i * r + j] + M[j * r + i]) / 2;
    }
  const auto [lo, hi] = ns_band(x0, steps, kMuonNs);
  const double shift = e * std::sqrt(double(r * c));
  std::printf("%s: rule bound %.2e (in update units), band [%.4f, %.4f] +- %.2e\n", name.c_str(), e, lo, hi, shift);
  EXPECT_TRUE(eigenvalues_within(sym, r, lo - shift, hi + shift))
      << name << ": the update's singular values leave the quintic's band [" << lo << ", " << hi << "]";
}

TEST(Optim, MuonUpdateIsOrthogonalised) {
  Model m = tiny_model();
  OptimSettings o;
  o.optimizer = "muon";
  o.lr = 1.0;
  o.muon_momentum = 0.0;  // the update is then NS(g) * 0.2 sqrt(max(rows, cols))
  o.clip_backbone = o.clip_indexer = 0;
  Tensor garena = Tensor::zeros({m.arena.numel()}, DType::f32);
  io::TensorMap g = arena_views(m.table, garena);
  std::mt19937_64 rng(5);
  std::normal_distribution<float> nd;
  for (int64_t i = 0; i < garena.numel(); ++i) garena.data<float>()[i] = nd(rng);
  std::fill_n(m.arena.data<float>(), m.arena.numel(), 0.f);  // w = -lr * update, exactly
  Optimizer opt(m, o, false);
  opt.step(m, g, 0);
  for (const std::string mat : {"model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight"}) {
    const Tensor& w = m.params.at(mat);  // [16, 8] (tall: NS runs on the transpose) and [8, 16]
    expect_muon_update(mat, g.at(mat).to_vector<float>(), w.to_vector<float>(), w.size(0), w.size(1), o.muon_ns_steps);
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
