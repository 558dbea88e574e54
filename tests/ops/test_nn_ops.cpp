// The case table of the dense ops (hmla/ops/nn.h) and the optimizer steps (hmla/ops/optim.h),
// op_cases.h's nn_ops rows, run through the op entry points by one runner per backend of the
// build (the rows its supports() accepts: case_support.h) against float64 oracles written here by
// the STYLE.md rule (the oracle instantiated in f32 is the naive arm). Inputs are strided where
// the op takes strides (column slices of wider tensors, per-head views), so the row-stride
// handling of the entry points is what is tested, not only the kernels.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "hmla/core/cuda.h"
#include "hmla/ops/backend.h"
#include "hmla/ops/nn.h"
#include "hmla/ops/optim.h"
#include "cases_nn.h"
#include "testing.h"


namespace hmla {
namespace {

using testing::expect_within_rule;
using testing::cols;
using testing::randn;
using Vec = std::vector<float>;
using op_cases::NnCase;
using op_cases::NnOp;
using op_cases::NnShape;
template <class T>
using V = std::vector<T>;

template <class T>
V<T> cast(const Vec& v) {
  return V<T>(v.begin(), v.end());
}

// The device a row runs on, and its tensors made there: every runner is this one, per device.
struct On {
  Device dev;
  Tensor t(const Shape& s, const Vec& v) const { return Tensor::from_vector<float>(s, v).to(dev); }
  Tensor ti(const Shape& s, const V<int32_t>& v) const { return Tensor::from_vector<int32_t>(s, v).to(dev); }
  Tensor empty(const Shape& s, DType d) const { return Tensor::empty(s, d, dev); }
  Tensor zeros(const Shape& s, DType d) const { return Tensor::zeros(s, d, dev); }
  // A product's inputs: on CUDA the products round their inputs to bf16 (bf16 tensor-core math,
  // f32 accumulation; hmla/ops/nn.h), so the cases hand them bf16-valued inputs and the oracle
  // computes the same products exactly: the f32 rule then applies to the accumulation.
  Vec gin(size_t n, uint64_t seed) const {
    Vec v = randn(n, seed);
    if (dev != Device::cpu)
      for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
    return v;
  }
};
Vec vec(const Tensor& x) { return x.clone().to_vector<float>(); }

// One f32 result checked against the oracle in f64 (reference) and f32 (naive arm).
template <class Oracle>
void check(const std::string& what, const Vec& kernel, Oracle oracle, double cancelled = 0) {
  const V<float> naive = oracle(float{});
  const V<double> ref = oracle(double{});
  expect_within_rule(what, kernel, naive, ref, cancelled);
}

// ---- oracles --------------------------------------------------------------------------------
// C[M, N] = alpha op(A) op(B) + beta C0; A, B, C0 row-major, op(X)[i, k] = X[i, k] or X[k, i].
template <class T>
V<T> gemm_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const Vec& A, const Vec& B,
              double beta, const Vec& C0) {
  V<T> C(M * N);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      T acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += T(ta ? A[k * M + i] : A[i * K + k]) * T(tb ? B[j * K + k] : B[k * N + j]);
      C[i * N + j] = T(alpha) * acc + (beta != 0 ? T(beta) * T(C0[i * N + j]) : T(0));
    }
  return C;
}


// ---- the cases: one per op, on the row's shapes (op_cases.h: nn_ops) ------------------------

void matmul_case(const On& on, const NnCase& row) {
  const int64_t M = row.shape.rows, N = row.shape.cols, K = row.shape.inner;
  const bool ta = row.ta, tb = row.tb;
  const float beta = row.beta;
  const Vec A = on.gin(M * K, 1), B = on.gin(K * N, 2), C0 = randn(M * N, 3);
  Tensor a = on.t(ta ? Shape{K, M} : Shape{M, K}, A), b = on.t(tb ? Shape{N, K} : Shape{K, N}, B), c = on.t({M, N}, C0);
  matmul(a, ta ? Trans::yes : Trans::no, b, tb ? Trans::yes : Trans::no, c, 0.75f, beta);
  check("matmul", vec(c), [&](auto z) { return gemm_ref<decltype(z)>(ta, tb, M, N, K, 0.75, A, B, beta, C0); });
}

// Per-head products on [N, H, width] activations: c_h = a_h[:, 0:K] op(w_h), the MLA absorption.
void batched_case(const On& on, const NnCase& row) {
  const NnShape& sh = row.shape;
  const int64_t N = sh.rows, H = sh.heads, Wa = sh.pitch, K = sh.inner, Ncol = sh.cols;
  const Vec A = on.gin(N * H * Wa, 4), Wt = on.gin(H * K * Ncol, 5);
  Tensor a = on.t({N, H, Wa}, A), w = on.t({H, K, Ncol}, Wt), c = on.zeros({N, H, 8}, DType::f32);
  matmul(a.slice(2, 2, 2 + K).transpose(0, 1), Trans::no, w, Trans::no, c.slice(2, 1, 1 + Ncol).transpose(0, 1));
  const Vec got = vec(c);
  for (int64_t h = 0; h < H; ++h) {
    Vec ah(N * K), gh(N * Ncol), wh(Wt.begin() + h * K * Ncol, Wt.begin() + (h + 1) * K * Ncol);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t k = 0; k < K; ++k) ah[n * K + k] = A[(n * H + h) * Wa + 2 + k];
      for (int64_t j = 0; j < Ncol; ++j) gh[n * Ncol + j] = got[(n * H + h) * 8 + 1 + j];
    }
    check("batched matmul head " + std::to_string(h), gh,
          [&](auto z) { return gemm_ref<decltype(z)>(false, false, N, Ncol, K, 1, ah, wh, 0, {}); });
  }
  for (int64_t n = 0; n < N; ++n)  // columns outside the view are untouched
    for (int64_t h = 0; h < H; ++h) EXPECT_EQ(got[(n * H + h) * 8], 0.f);
}

// x is a column slice [N, in] of a [N, in + 3] tensor; dx accumulates (beta 1) into a slice.
void linear_case(const On& on, const NnCase& row) {
  const int64_t N = row.shape.rows, in = row.shape.inner, out = row.shape.cols, wide = row.shape.pitch;
  const Vec X = on.gin(N * wide, 6), Wt = on.gin(out * in, 7), DY = on.gin(N * out, 8), DX0 = randn(N * wide, 9);
  Tensor x = on.t({N, wide}, X), w = on.t({out, in}, Wt), y = on.empty({N, out}, DType::f32);
  linear_fwd(x.slice(1, 1, 1 + in), w, y);
  const Vec xs = cols(X, N, wide, 1, in);
  check("linear y", vec(y), [&](auto z) { return gemm_ref<decltype(z)>(false, true, N, out, in, 1, xs, Wt, 0, {}); });
  const Vec DW0 = randn(out * in, 30);  // weight gradients add into what is there (nn.h)
  Tensor dW = on.t({out, in}, DW0), dx = on.t({N, wide}, DX0);
  linear_bwd(on.t({N, out}, DY), x.slice(1, 1, 1 + in), w, dW, dx.slice(1, 2, 2 + in), 1.f);
  check("linear dW", vec(dW), [&](auto z) { return gemm_ref<decltype(z)>(true, false, out, in, N, 1, DY, xs, 1, DW0); });
  const Vec dx0s = cols(DX0, N, wide, 2, in);
  check("linear dx", cols(vec(dx), N, wide, 2, in),
        [&](auto z) { return gemm_ref<decltype(z)>(false, false, N, in, out, 1, DY, Wt, 1, dx0s); });
  EXPECT_EQ(vec(dx)[0], DX0[0]);  // column 0 is outside the slice
}

// dw and db start from dw0 and db0: the backward adds into them (nn.h).
template <class T>
void norm_ref(const Vec& x, const Vec& w, const Vec* b, const Vec& dy, int64_t N, int64_t D, double eps, V<T>& y,
              V<T>& dx, V<T>& dw, V<T>& db, const Vec& dw0, const Vec& db0) {
  y.assign(N * D, 0), dx.assign(N * D, 0), dw = cast<T>(dw0), db = cast<T>(db0);
  for (int64_t n = 0; n < N; ++n) {
    T mu = 0, ms = 0;
    for (int64_t d = 0; d < D; ++d) mu += T(x[n * D + d]) / T(D);
    if (!b) mu = 0;  // RMSNorm: no centring
    for (int64_t d = 0; d < D; ++d) ms += (T(x[n * D + d]) - mu) * (T(x[n * D + d]) - mu) / T(D);
    const T r = T(1) / std::sqrt(ms + T(eps));
    T m1 = 0, m2 = 0;
    for (int64_t d = 0; d < D; ++d) {
      const T xh = (T(x[n * D + d]) - mu) * r, g = T(dy[n * D + d]) * T(w[d]);
      y[n * D + d] = xh * T(w[d]) + (b ? T((*b)[d]) : T(0));
      dw[d] += T(dy[n * D + d]) * xh;
      db[d] += T(dy[n * D + d]);
      m1 += g / T(D);
      m2 += g * xh / T(D);
    }
    for (int64_t d = 0; d < D; ++d) {
      const T xh = (T(x[n * D + d]) - mu) * r, g = T(dy[n * D + d]) * T(w[d]);
      dx[n * D + d] = r * (g - (b ? m1 : T(0)) - xh * m2);
    }
  }
}

void rmsnorm_case(const On& on, const NnCase& row) {  // x and y are column slices, as the MLA layer's kv_a latent
  const int64_t N = row.shape.rows, D = row.shape.cols, wide = row.shape.pitch;
  const Vec X = randn(N * wide, 10), Wt = randn(D, 11), DY = randn(N * D, 12);
  const Vec x = cols(X, N, wide, 0, D);
  Tensor xt = on.t({N, wide}, X), y = on.zeros({N, wide}, DType::f32), rstd = on.empty({N}, DType::f32);
  rmsnorm_fwd(xt.slice(1, 0, D), on.t({D}, Wt), 1e-6f, y.slice(1, 0, D), rstd);
  const Vec DW0 = randn(D, 31);
  Tensor dx = on.empty({N, D}, DType::f32), dw = on.t({D}, DW0);
  rmsnorm_bwd(on.t({N, D}, DY), xt.slice(1, 0, D), on.t({D}, Wt), rstd, dx, dw);
  auto out = [&](int which) {
    return [&, which](auto z) {
      using T = decltype(z);
      V<T> yy, dxx, dww, dbb;
      norm_ref<T>(x, Wt, nullptr, DY, N, D, 1e-6, yy, dxx, dww, dbb, DW0, Vec(D, 0.f));
      return which == 0 ? yy : which == 1 ? dxx : dww;
    };
  };
  check("rmsnorm y", cols(vec(y), N, wide, 0, D), out(0));
  check("rmsnorm dx", vec(dx), out(1));
  check("rmsnorm dw", vec(dw), out(2));
}

// The residual step's oracle: xs = x + x2 and y = RMSNorm(xs) w, both in T.
template <class T>
V<T> add_rmsnorm_ref(const Vec& x, const Vec& x2, const Vec& w, int64_t N, int64_t D, double eps, bool want_sum) {
  V<T> xs(N * D), y(N * D);
  for (int64_t n = 0; n < N; ++n) {
    T ms = 0;
    for (int64_t d = 0; d < D; ++d) {
      xs[n * D + d] = T(x[n * D + d]) + T(x2[n * D + d]);
      ms += xs[n * D + d] * xs[n * D + d] / T(D);
    }
    const T r = T(1) / std::sqrt(ms + T(eps));
    for (int64_t d = 0; d < D; ++d) y[n * D + d] = xs[n * D + d] * r * T(w[d]);
  }
  return want_sum ? xs : y;
}

// The fused residual step: xs written over x2 (aliased, as the stream may be), y a column slice;
// and the bits of add then rmsnorm_fwd on the same backend (what keeps the model's results).
void add_rmsnorm_case(const On& on, const NnCase& row) {
  const int64_t N = row.shape.rows, D = row.shape.cols, wide = row.shape.pitch;
  const Vec X = randn(N * D, 40), X2 = randn(N * D, 41), Wt = randn(D, 42);
  Tensor x2 = on.t({N, D}, X2), y = on.zeros({N, wide}, DType::f32), rstd = on.empty({N}, DType::f32);
  add_rmsnorm_fwd(on.t({N, D}, X), x2, on.t({D}, Wt), 1e-6f, x2, y.slice(1, 0, D), rstd);
  auto ref = [&](bool sum) { return [&, sum](auto z) { return add_rmsnorm_ref<decltype(z)>(X, X2, Wt, N, D, 1e-6, sum); }; };
  check("add_rmsnorm xs", vec(x2), ref(true));
  check("add_rmsnorm y", cols(vec(y), N, wide, 0, D), ref(false));
  Tensor xs2 = on.empty({N, D}, DType::f32), y2 = on.empty({N, D}, DType::f32), rstd2 = on.empty({N}, DType::f32);
  add(on.t({N, D}, X), on.t({N, D}, X2), xs2);
  rmsnorm_fwd(xs2, on.t({D}, Wt), 1e-6f, y2, rstd2);
  EXPECT_EQ(vec(x2), vec(xs2)) << "add_rmsnorm's sum: the bits of add";
  EXPECT_EQ(cols(vec(y), N, wide, 0, D), vec(y2)) << "add_rmsnorm's norm: the bits of rmsnorm_fwd";
  EXPECT_EQ(vec(rstd), vec(rstd2));
}

void layernorm_case(const On& on, const NnCase& row) {
  const int64_t N = row.shape.rows, D = row.shape.cols;
  const Vec X = randn(N * D, 13), Wt = randn(D, 14), B = randn(D, 15), DY = randn(N * D, 16);
  Tensor y = on.empty({N, D}, DType::f32), mean = on.empty({N}, DType::f32),
         rstd = on.empty({N}, DType::f32);
  layernorm_fwd(on.t({N, D}, X), on.t({D}, Wt), on.t({D}, B), 1e-6f, y, mean, rstd);
  const Vec DW0 = randn(D, 32), DB0 = randn(D, 33);
  Tensor dx = on.empty({N, D}, DType::f32), dw = on.t({D}, DW0), db = on.t({D}, DB0);
  layernorm_bwd(on.t({N, D}, DY), on.t({N, D}, X), on.t({D}, Wt), mean, rstd, dx, dw, db);
  auto out = [&](int which) {
    return [&, which](auto z) {
      using T = decltype(z);
      V<T> yy, dxx, dww, dbb;
      norm_ref<T>(X, Wt, &B, DY, N, D, 1e-6, yy, dxx, dww, dbb, DW0, DB0);
      return which == 0 ? yy : which == 1 ? dxx : which == 2 ? dww : dbb;
    };
  };
  check("layernorm y", vec(y), out(0));
  // dx = r (g - mean g - xhat mean(g xhat)) cancels: its terms are as large as |dy w| r.
  double cancel = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t d = 0; d < D; ++d) cancel = std::max(cancel, 3.0 * std::abs(DY[n * D + d] * Wt[d]) * vec(rstd)[n]);
  check("layernorm dx", vec(dx), out(1), cancel);
  check("layernorm dw", vec(dw), out(2));
  check("layernorm db", vec(db), out(3));
}

// RoPE on heads [c0, c0 + Dr) of [b, s, H, width]; then the transpose, which with the factor
// folded into cos/sin is rotation by -angle times factor^2: the round trip scales by factor^2.
void rope_case(const On& on, const NnCase& row) {
  const RopeLayout layout = row.layout;
  const NnShape& sh = row.shape;
  const int64_t b = sh.rows, s = sh.inner, H = sh.heads, width = sh.pitch, c0 = 3, Dr = sh.cols, half = Dr / 2;
  const double factor = 1.25;
  Vec cs(s * half), sn(s * half);
  for (int64_t p = 0; p < s; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double a = p * std::pow(10000.0, -2.0 * i / Dr);
      cs[p * half + i] = float(std::cos(a) * factor);
      sn[p * half + i] = float(std::sin(a) * factor);
    }
  const Vec X = randn(b * s * H * width, 17);
  Tensor x = on.t({b, s, H, width}, X);
  rope(x.slice(3, c0, c0 + Dr), on.t({s, half}, cs), on.t({s, half}, sn), layout, false);
  const Vec got = vec(x);
  auto ref = [&](auto z) {
    using T = decltype(z);
    V<T> y(X.begin(), X.end());
    const int64_t step = layout == RopeLayout::interleaved ? 2 : 1, off = layout == RopeLayout::interleaved ? 1 : half;
    for (int64_t n = 0; n < b * s; ++n)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < half; ++i) {
          const int64_t base = (n * H + h) * width + c0, p0 = base + i * step, p1 = p0 + off;
          const T c = cs[(n % s) * half + i], si = sn[(n % s) * half + i];
          y[p0] = T(X[p0]) * c - T(X[p1]) * si;
          y[p1] = T(X[p1]) * c + T(X[p0]) * si;
        }
    return y;
  };
  check("rope", got, ref);
  rope(x.slice(3, c0, c0 + Dr), on.t({s, half}, cs), on.t({s, half}, sn), layout, true);
  // Each pass rounds two products and a sum of magnitude <= sqrt(2) factor max|x|: 16 ulps of
  // factor^2 max|x| bound the round trip.
  const Vec back = vec(x);
  double mx = 0;
  for (float v : X) mx = std::max(mx, double(std::abs(v)));
  for (size_t i = 0; i < X.size(); ++i) {
    const int64_t c = int64_t(i) % width;
    const bool rotated = c >= c0 && c < c0 + Dr;
    if (!rotated) {
      EXPECT_EQ(back[i], X[i]) << "rope touched channel " << c;
      continue;
    }
    EXPECT_NEAR(back[i], X[i] * factor * factor, 16 * FLT_EPSILON * factor * factor * mx) << "rope round trip " << i;
  }
}

// The clamped rows (limit > 0, DeepSeek-V4): G's spread (2) and U's (1) put some of both beyond the
// limit 1.5, so the clamps act in both directions and stop their gradients there.
void swiglu_case(const On& on, const NnCase& row) {
  const int64_t n = row.shape.cols;
  const double L = row.limit;
  const Vec G = randn(n, 18, 2.f), U = randn(n, 19), DY = randn(n, 20);
  Tensor y = on.empty({n}, DType::f32), dg = on.empty({n}, DType::f32), du = on.empty({n}, DType::f32);
  swiglu_fwd(on.t({n}, G), on.t({n}, U), y, row.limit);
  swiglu_bwd(on.t({n}, DY), on.t({n}, G), on.t({n}, U), dg, du, row.limit);
  int clamped_g = 0, clamped_u = 0;
  for (int64_t i = 0; i < n; ++i) clamped_g += L > 0 && G[i] > L, clamped_u += L > 0 && std::abs(U[i]) > L;
  if (L > 0) {
    EXPECT_TRUE(clamped_g > 0 && clamped_u > 0) << "the row exercises both clamps";
  }
  auto out = [&](int which) {
    return [&, which](auto z) {
      using T = decltype(z);
      V<T> o(n);
      for (int64_t i = 0; i < n; ++i) {
        const bool g_in = !(L > 0 && G[i] > L), u_in = !(L > 0 && std::abs(U[i]) > L);
        const T g = g_in ? T(G[i]) : T(L), u = u_in ? T(U[i]) : T(U[i] > 0 ? L : -L);
        const T sig = T(1) / (T(1) + std::exp(-g));
        o[i] = which == 0   ? g * sig * u
               : which == 1 ? (g_in ? T(DY[i]) * u * sig * (T(1) + g * (T(1) - sig)) : T(0))
                            : (u_in ? T(DY[i]) * g * sig : T(0));
      }
      return o;
    };
  };
  check("swiglu y", vec(y), out(0));
  check("swiglu dg", vec(dg), out(1));
  check("swiglu du", vec(du), out(2));
}

void embedding_case(const On& on, const NnCase& row) {  // repeated ids: the backward adds their rows
  const int64_t V_ = row.shape.inner, D = row.shape.cols;
  const std::vector<int32_t> ids = {3, 0, 3, 6, 3, 1};
  const int64_t N = int64_t(ids.size());
  ASSERT_EQ(N, row.shape.rows) << "the row's ids";
  const Vec E = randn(V_ * D, 21), DO = randn(N * D, 22), DE0 = randn(V_ * D, 23);
  Tensor idt = on.ti({2, 3}, ids), out = on.empty({2, 3, D}, DType::f32);
  embedding_fwd(idt, on.t({V_, D}, E), out);
  const Vec got = vec(out);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t d = 0; d < D; ++d) EXPECT_EQ(got[n * D + d], E[ids[n] * D + d]) << "embedding row " << n;
  Tensor dE = on.t({V_, D}, DE0);
  embedding_bwd(idt, on.t({2, 3, D}, DO), dE);
  check("embedding dE", vec(dE), [&](auto z) {
    V<decltype(z)> r(DE0.begin(), DE0.end());
    for (int64_t n = 0; n < N; ++n)
      for (int64_t d = 0; d < D; ++d) r[ids[n] * D + d] += DO[n * D + d];
    return r;
  });
}

void cross_entropy_case(const On& on, const NnCase& row) {  // a zero-weight row gets no loss and no gradient
  const int64_t N = row.shape.rows, V_ = row.shape.cols;
  const Vec L = randn(N * V_, 24, 3.f);
  ASSERT_TRUE(N >= 3 && N <= 6) << "the row's targets: 3 to 6 rows (row 2 has weight 0)";
  const std::vector<int32_t> all_tgt = {1, 10, 0, 5, 5, 7};
  const Vec all_w = {0.5f, 0.25f, 0.f, 1.f, 0.125f, 0.25f};
  const std::vector<int32_t> tgt(all_tgt.begin(), all_tgt.begin() + N);
  const Vec w(all_w.begin(), all_w.begin() + N);
  Tensor dl = on.empty({N, V_}, DType::f32);
  const double loss = cross_entropy(on.t({N, V_}, L), on.ti({N}, tgt), on.t({N}, w), dl);
  auto ref = [&](auto z, bool grad) {
    using T = decltype(z);
    V<T> d(N * V_, 0);
    T total = 0;
    for (int64_t n = 0; n < N; ++n) {
      if (w[n] == 0.f) continue;
      T mx = L[n * V_], zsum = 0;
      for (int64_t v = 0; v < V_; ++v) mx = std::max(mx, T(L[n * V_ + v]));
      for (int64_t v = 0; v < V_; ++v) zsum += std::exp(T(L[n * V_ + v]) - mx);
      const T lse = mx + std::log(zsum);
      total += T(w[n]) * (lse - T(L[n * V_ + tgt[n]]));
      for (int64_t v = 0; v < V_; ++v) d[n * V_ + v] = T(w[n]) * (std::exp(T(L[n * V_ + v]) - lse) - (v == tgt[n]));
    }
    return grad ? d : V<T>{total};
  };
  check("cross_entropy loss", {float(loss)}, [&](auto z) { return ref(z, false); });
  check("cross_entropy dlogits", vec(dl), [&](auto z) { return ref(z, true); });
  for (int64_t v = 0; v < V_; ++v) EXPECT_EQ(vec(dl)[2 * V_ + v], 0.f);
  // Written over the logits (as the LM head does): the same loss and gradient, bit for bit.
  const Tensor lg = on.t({N, V_}, L);
  EXPECT_EQ(cross_entropy(lg, on.ti({N}, tgt), on.t({N}, w), lg), loss) << "in place";
  EXPECT_EQ(vec(lg), vec(dl)) << "in place";
}

void axpy_case(const On& on, const NnCase& row) {  // on column slices; out aliases a
  const int64_t N = row.shape.rows, D = row.shape.cols, wide = row.shape.pitch;
  const Vec A = randn(N * wide, 25), B = randn(N * D, 26);
  Tensor a = on.t({N, wide}, A);
  axpy(a.slice(1, 3, 3 + D), -0.5f, on.t({N, D}, B), a.slice(1, 3, 3 + D));
  const Vec as = cols(A, N, wide, 3, D);
  check("axpy", cols(vec(a), N, wide, 3, D), [&](auto z) {
    V<decltype(z)> r(N * D);
    for (int64_t i = 0; i < N * D; ++i) r[i] = as[i] + decltype(z)(-0.5) * B[i];
    return r;
  });
  Tensor sc = on.empty({N, D}, DType::f32);
  scale(on.t({N, D}, B), 3.f, sc);
  for (int64_t i = 0; i < N * D; ++i) EXPECT_EQ(vec(sc)[i], 3.f * B[i]);  // one rounding: exact product
  EXPECT_EQ(vec(a)[0], A[0]);
}

// f32 -> bf16 -> f32 through strided views: each value rounded to nearest even, once.
void convert_case(const On& on, const NnCase& row) {
  const int64_t N = row.shape.rows, D = row.shape.cols, wide = row.shape.pitch;
  const Vec X = randn(N * wide, 34);
  Tensor h = on.empty({N, D}, DType::bf16), back = on.zeros({D, N}, DType::f32);
  convert(on.t({N, wide}, X).slice(1, 2, 2 + D), h);
  convert(h, back.transpose(0, 1));
  const Vec got = vec(back);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t d = 0; d < D; ++d)
      EXPECT_EQ(got[d * N + n], bf16_to_f32(f32_to_bf16(X[n * wide + 2 + d]))) << "convert " << n << ", " << d;
}

// The step's stats ops (hmla/ops/optim.h) and the updates' gate: the norms, clip scales and flag
// from set sums of squares (exact values: sqrt(16) = 4, 2 / 4 = 0.5), AdamW with its scale read
// from the buffer equal to AdamW given that scale (w_adam), a closed gate moving nothing (Muon's
// momentum zeroing u), and Muon's normalisation by the device's own sum of squares.
void stats_case(const On& on, const Vec& G, const Vec& W0, const Vec& M0, const Vec& V0, AdamWParams h,
                const Vec& w_adam) {
  const int64_t n = int64_t(G.size());
  std::vector<double> hs(kStatCount, 0.0);
  hs[kStatSsBackbone] = 16, hs[kStatSsIndexer] = 0.25, hs[kStatMbLm] = 3, hs[kStatLm] = 1;
  const Tensor st = Tensor::from_vector<double>({kStatCount}, hs).to(on.dev);
  Tensor bad = on.zeros({1}, DType::f32);
  stats_add(st, kStatLm, kStatMbLm, 2.0);
  stats_clip(st, bad, 2.0, 1.0);  // the backbone clipped (norm 4 > 2), the indexers not (0.5 <= 1)
  std::vector<double> got = st.to_vector<double>();
  EXPECT_EQ(got[kStatLm], 2.5);
  EXPECT_EQ(got[kStatNormBackbone], 4.0);
  EXPECT_EQ(got[kStatNormIndexer], 0.5);
  EXPECT_EQ(got[kStatScaleBackbone], 0.5);
  EXPECT_EQ(got[kStatScaleIndexer], 1.0);
  EXPECT_EQ(got[kStatFinite], 1.0);
  ASSERT_EQ(h.gscale, 0.5f);  // optim_case's AdamW ran with the backbone's scale
  h.gscale = 7.f;             // unused: the buffer's scale wins
  Tensor w = on.t({n}, W0), m = on.t({n}, M0), v = on.t({n}, V0);
  adamw_update(w, on.t({n}, G), m, v, h, st, kStatScaleBackbone);
  EXPECT_EQ(vec(w), w_adam) << "adamw with the buffer's clip scale";
  stats_losses(st, bad);
  EXPECT_EQ(bad.to_vector<float>()[0], 0.f);
  bad.copy_from(Tensor::from_vector<float>({1}, {1.f}));  // a rank's loss was not finite
  stats_clip(st, bad, 2.0, 1.0);
  EXPECT_EQ(st.to_vector<double>()[kStatFinite], 0.0);
  Tensor w2 = on.t({n}, W0), m2 = on.t({n}, M0), v2 = on.t({n}, V0), u = on.t({n}, G);
  adamw_update(w2, on.t({n}, G), m2, v2, h, st, kStatScaleIndexer);
  muon_momentum(on.t({n}, G), m2, u, 1.f, 0.95f, st, kStatScaleBackbone);
  muon_update(w2, on.t({n}, G), 0.02f, 1.5f, 0.1f, st);
  EXPECT_EQ(vec(w2), W0) << "a closed gate moved w";
  EXPECT_EQ(vec(m2), M0) << "a closed gate moved m";
  EXPECT_EQ(vec(v2), V0) << "a closed gate moved v";
  EXPECT_EQ(vec(u), Vec(size_t(n), 0.f)) << "muon momentum with a closed gate leaves u = 0";
  const Tensor ss = on.zeros({1}, DType::f64), x = on.empty({n}, DType::f32);
  sum_squares_into(on.t({n}, G), ss);
  muon_normalize(on.t({n}, G), ss, x);
  const float inv = float(1.0 / (std::sqrt(ss.to_vector<double>()[0]) + 1e-7));
  const Vec xs = vec(x);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(xs[i], inv * G[i]) << "muon normalize " << i;
}

void optim_case(const On& on, const NnCase& row) {
  const int64_t n = row.shape.cols;
  const Vec G = randn(n, 27), W0 = randn(n, 28), M0 = randn(n, 29, 0.1f), V0 = Vec(n, 0.01f);
  const double ss = sum_squares(on.t({n}, G), 2.0);
  double want = 2.0;
  for (float g : G) want += double(g) * g;
  EXPECT_NEAR(ss, want, 8 * DBL_EPSILON * want * n);
  AdamWParams h;
  h.gscale = 0.5f, h.lr = 0.01f, h.b1 = 0.9f, h.b2 = 0.95f, h.eps = 1e-8f, h.wd = 0.1f, h.bc1 = 0.19, h.bc2 = 0.0975;
  Tensor w = on.t({n}, W0), m = on.t({n}, M0), v = on.t({n}, V0);
  adamw_update(w, on.t({n}, G), m, v, h);
  check("adamw w", vec(w), [&](auto z) {
    using T = decltype(z);
    V<T> r(n);
    for (int64_t i = 0; i < n; ++i) {
      const T g = T(G[i]) * T(h.gscale), mm = T(h.b1) * T(M0[i]) + (1 - T(h.b1)) * g,
              vv = T(h.b2) * T(V0[i]) + (1 - T(h.b2)) * g * g;
      r[i] = T(W0[i]) - T(h.lr) * (mm / T(float(h.bc1)) / (std::sqrt(vv / T(float(h.bc2))) + T(h.eps)) + T(h.wd) * T(W0[i]));
    }
    return r;
  });
  Tensor mu = on.t({n}, M0), u = on.empty({n}, DType::f32);
  muon_momentum(on.t({n}, G), mu, u, 0.5f, 0.95f);
  check("muon u", vec(u), [&](auto z) {
    using T = decltype(z);
    V<T> r(n);
    for (int64_t i = 0; i < n; ++i) r[i] = T(G[i]) * T(0.5) + T(0.95f) * (T(0.95f) * T(M0[i]) + T(G[i]) * T(0.5));
    return r;
  });
  Tensor w2 = on.t({n}, W0);
  muon_update(w2, on.t({n}, G), 0.02f, 1.5f, 0.1f);
  check("muon w", vec(w2), [&](auto z) {
    using T = decltype(z);
    V<T> r(n);
    for (int64_t i = 0; i < n; ++i) r[i] = T(W0[i]) - T(0.02f) * (T(1.5f) * T(G[i]) + T(0.1f) * T(W0[i]));
    return r;
  });
  stats_case(on, G, W0, M0, V0, h, vec(w));
}

// ---- the runner: one per device, over the rows its backend runs ------------------------------

void run_row(const NnCase& row, Device dev) {
  const On on{dev};
  switch (row.op) {
    case NnOp::matmul: return matmul_case(on, row);
    case NnOp::matmul_per_head: return batched_case(on, row);
    case NnOp::linear: return linear_case(on, row);
    case NnOp::rmsnorm: return rmsnorm_case(on, row);
    case NnOp::add_rmsnorm: return add_rmsnorm_case(on, row);
    case NnOp::layernorm: return layernorm_case(on, row);
    case NnOp::rope: return rope_case(on, row);
    case NnOp::swiglu: return swiglu_case(on, row);
    case NnOp::embedding: return embedding_case(on, row);
    case NnOp::cross_entropy: return cross_entropy_case(on, row);
    case NnOp::axpy_scale: return axpy_case(on, row);
    case NnOp::optimizer: return optim_case(on, row);
    case NnOp::convert: return convert_case(on, row);
  }
  FAIL() << row.name << ": no case for this op";
}

class NnOps : public ::testing::TestWithParam<NnCase> {};
TEST_P(NnOps, MatchesTheOracle) { run_row(GetParam(), Device::cpu); }
INSTANTIATE_TEST_SUITE_P(Table, NnOps,
                         ::testing::ValuesIn(op_cases::run_by(&cpu_backend(), DType::f32, op_cases::nn_ops())),
                         op_cases::RowName());

// On CUDA where the build has it and a device (or the SIMT emulator: test_cuda_emu builds this
// file too). A build without CUDA has no rows here.
class NnOpsOnCuda : public ::testing::TestWithParam<NnCase> {};
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(NnOpsOnCuda);
TEST_P(NnOpsOnCuda, MatchesTheOracle) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  run_row(GetParam(), Device::cuda);
}
INSTANTIATE_TEST_SUITE_P(Table, NnOpsOnCuda,
                         ::testing::ValuesIn(op_cases::run_by(cuda_backend(), DType::f32, op_cases::nn_ops())),
                         op_cases::RowName());

// Both backends run every op of the table (their supports() say so for every row's params).
TEST(NnOps, EveryBackendRunsEveryRow) {
  EXPECT_EQ(op_cases::rows_not_run(cpu_backend(), DType::f32, op_cases::nn_ops()), "") << "not run by the CPU";
  if (cuda_backend()) {
    EXPECT_EQ(op_cases::rows_not_run(*cuda_backend(), DType::f32, op_cases::nn_ops()), "") << "not run by CUDA";
  }
}

// Bad input: one clear error naming the op and the tensor.
TEST(NnOps, BadInputIsAClearError) {
  auto expect_error = [](auto f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
    } catch (const ShapeError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const Tensor x = Tensor::zeros({4, 6}, DType::f32), w = Tensor::zeros({3, 5}, DType::f32);
  expect_error([&] { linear_fwd(x, w, Tensor::empty({4, 3}, DType::f32)); }, "do not fit W");
  expect_error([&] { rmsnorm_fwd(x.transpose(0, 1), Tensor::zeros({4}, DType::f32), 1e-6f, x.transpose(0, 1),
                                 Tensor::empty({6}, DType::f32)); },
               "must be contiguous");
  expect_error([&] { embedding_fwd(Tensor::from_vector<int32_t>({2}, {1, 9}), Tensor::zeros({4, 2}, DType::f32),
                                   Tensor::empty({2, 2}, DType::f32)); },
               "token id 9 at position 1 is outside the vocabulary [0, 4)");
  expect_error([&] { cross_entropy(Tensor::zeros({2, 3}, DType::f32), Tensor::from_vector<int32_t>({2}, {0, 3}),
                                   Tensor::from_vector<float>({2}, {1.f, 1.f})); },
               "target 3 of row 1");
  expect_error([&] { matmul(x, Trans::no, x, Trans::no, Tensor::empty({4, 6}, DType::f32)); }, "does not give c");
  expect_error([&] { rope(Tensor::zeros({1, 2, 1, 3}, DType::f32), Tensor::zeros({2, 1}, DType::f32),
                          Tensor::zeros({2, 1}, DType::f32), RopeLayout::half, false); },
               "Dr even");
}

// A stream handed to a build without CUDA is an error, not silently ignored (hmla.torch passes one
// only for CUDA tensors). Here, not in test_core: the backend's library defines it.
TEST(ScopedCudaStream, IsRefusedWithoutTheCudaBackend) {
  if (cuda_built()) GTEST_SKIP() << "this build has the CUDA backend";
  EXPECT_THROW(ScopedCudaStream{1}, Error);
}

// A device's ids and targets are not copied back to be checked (they were checked where they
// entered the model): the kernels read nothing outside the table for a bad one, and make its row
// NaN (so the loss is non-finite and a run stops) instead; the good rows are untouched, and no
// byte comes back to the host for the check.
TEST(NnOps, DeviceIdsOutsideTheVocabularyGiveNaNNotAStrayRead) {
  if (!cuda_backend() || cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const Tensor E = Tensor::from_vector<float>({3, 2}, {1, 2, 3, 4, 5, 6}).to(Device::cuda);
  const Tensor ids = Tensor::from_vector<int32_t>({3}, {2, 3, -1}).to(Device::cuda);
  const Tensor out = Tensor::empty({3, 2}, DType::f32, Device::cuda);
  const CudaCounters c0 = cuda_counters();
  embedding_fwd(ids, E, out);
  EXPECT_EQ((cuda_counters() - c0).d2h_bytes, 0);
  const std::vector<float> o = out.to_vector<float>();
  EXPECT_EQ(o[0], 5.f);
  EXPECT_EQ(o[1], 6.f);
  for (int i = 2; i < 6; ++i) EXPECT_TRUE(std::isnan(o[i])) << i;
  const Tensor dE = Tensor::zeros({3, 2}, DType::f32, Device::cuda);
  embedding_bwd(ids, Tensor::from_vector<float>({3, 2}, {1, 1, 1, 1, 1, 1}).to(Device::cuda), dE);
  EXPECT_EQ(dE.to_vector<float>(), std::vector<float>({0, 0, 0, 0, 1, 1}));  // only id 2's row
  const double loss = cross_entropy(Tensor::zeros({2, 3}, DType::f32, Device::cuda),
                                    Tensor::from_vector<int32_t>({2}, {0, 3}).to(Device::cuda),
                                    Tensor::from_vector<float>({2}, {1.f, 1.f}).to(Device::cuda));
  EXPECT_TRUE(std::isnan(loss)) << loss;
}

}  // namespace
}  // namespace hmla
