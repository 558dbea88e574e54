// bf16 activations in the norms, RoPE and SwiGLU on CUDA (hmla/ops/nn.h, DESIGN.md section 4). For
// each op and each combination of its bf16-able operands: (1) the kernel given bf16 tensors gives
// the bits of the same kernel given f32 tensors holding the same (bf16-representable) values, its
// bf16 outputs rounded once to nearest even; (2) it agrees with a float64 oracle on those values
// within the f32 rule (testing.h) plus, for a bf16 output, that one rounding. And the CPU backend,
// f32 only, refuses bf16 with its error. Built into test_cuda_emu (label emu) and test_cuda (gpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "hmla/core/cuda.h"
#include "hmla/ops/backend.h"
#include "hmla/ops/nn.h"
#include "testing.h"

namespace hmla {
namespace {

using testing::cols;
using testing::randn;
using Vec = std::vector<float>;
template <class T>
using V = std::vector<T>;
constexpr DType F = DType::f32, B = DType::bf16;

// Each value rounded to nearest even in bf16 (the inputs both runs share; a bf16 output's one rounding).
Vec rne(Vec v) {
  for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
  return v;
}

Tensor on_cuda(const Shape& s, const Vec& v, DType dt) {
  if (dt == F) return Tensor::from_vector<float>(s, v).to(Device::cuda);
  V<bf16> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
  return Tensor::from_vector<bf16>(s, h).to(Device::cuda);
}

Vec host(const Tensor& t) {
  const Tensor c = t.clone();
  if (c.dtype() == F) return c.to_vector<float>();
  Vec o;
  for (bf16 h : c.to_vector<bf16>()) o.push_back(bf16_to_f32(h));
  return o;
}

std::string combo(std::initializer_list<std::pair<const char*, DType>> ops) {
  std::string s;
  for (auto [name, dt] : ops) s += std::string(s.empty() ? "" : ", ") + name + " " + dtype_name(dt);
  return s;
}

// Property (1): bit for bit (a NaN or a signed zero would show).
void expect_same_bits(const std::string& what, const Vec& got, const Vec& want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int shown = 0;
  for (size_t i = 0; i < got.size() && shown < 5; ++i) {
    if (std::bit_cast<uint32_t>(got[i]) == std::bit_cast<uint32_t>(want[i])) continue;
    ADD_FAILURE() << what << " [" << i << "]: " << got[i] << ", the f32 kernel's " << want[i];
    ++shown;
  }
}

// Property (2). The f32 rule bounds the f32 kernel's result R: |R - ref| <= E, E = 2 (naive f32
// error) + 8 ulps of the magnitudes (testing.h). A bf16 output is R rounded once to nearest even:
// |out - R| <= 2^-8 |R| (bf16 keeps 8 significant bits; half an ulp is 2^-8 of the leading power
// of two) and |R| <= |ref| + E, so |out - ref| <= E + 2^-8 (|ref| + E).
template <class Oracle>
void expect_oracle(const std::string& what, const Vec& got, DType out_dtype, Oracle oracle, double cancelled = 0) {
  const V<float> naive = oracle(float{});
  const V<double> ref = oracle(double{});
  if (out_dtype == F) {
    testing::expect_within_rule(what, got, naive, ref, cancelled);
    return;
  }
  const testing::ErrStats n = testing::max_abs_err(naive, ref);
  const double E = 2.0 * n.max_err + 8.0 * FLT_EPSILON * std::max(n.max_ref, cancelled);
  ASSERT_EQ(got.size(), ref.size()) << what;
  int shown = 0;
  for (size_t i = 0; i < got.size() && shown < 5; ++i) {
    const double bound = E + std::ldexp(std::abs(ref[i]) + E, -8);
    if (std::abs(double(got[i]) - ref[i]) <= bound) continue;
    ADD_FAILURE() << what << " [" << i << "]: " << got[i] << " vs the oracle's " << ref[i] << " (bound " << bound
                  << ")";
    ++shown;
  }
}

// ---- oracles (T = double: the reference; T = float: the naive arm of the rule) ---------------

template <class T>
struct NormRef {
  V<T> y, mean, rstd, dx, dw, db;
};

// RMSNorm (no b) or LayerNorm of x [N, D]; with dy, the backward adding into dw0 (and db0).
template <class T>
NormRef<T> norm_ref(const Vec& x, const Vec& w, const Vec* b, const Vec* dy, int64_t N, int64_t D, double eps,
                        const Vec& dw0 = {}, const Vec& db0 = {}) {
  NormRef<T> o;
  o.y.assign(N * D, 0), o.dx.assign(N * D, 0), o.mean.assign(N, 0), o.rstd.assign(N, 0);
  o.dw.assign(dw0.begin(), dw0.end()), o.db.assign(db0.begin(), db0.end());
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x.data() + n * D;
    T mu = 0, ms = 0;
    if (b)
      for (int64_t d = 0; d < D; ++d) mu += T(xr[d]) / T(D);
    for (int64_t d = 0; d < D; ++d) ms += (T(xr[d]) - mu) * (T(xr[d]) - mu) / T(D);
    const T r = T(1) / std::sqrt(ms + T(eps));
    o.mean[n] = mu, o.rstd[n] = r;
    for (int64_t d = 0; d < D; ++d) o.y[n * D + d] = (T(xr[d]) - mu) * r * T(w[d]) + (b ? T((*b)[d]) : T(0));
    if (!dy) continue;
    T m1 = 0, m2 = 0;
    for (int64_t d = 0; d < D; ++d) {
      const T g = T((*dy)[n * D + d]) * T(w[d]), xh = (T(xr[d]) - mu) * r;
      o.dw[d] += T((*dy)[n * D + d]) * xh;
      if (b) o.db[d] += T((*dy)[n * D + d]);
      m1 += g / T(D);
      m2 += g * xh / T(D);
    }
    for (int64_t d = 0; d < D; ++d) {
      const T g = T((*dy)[n * D + d]) * T(w[d]), xh = (T(xr[d]) - mu) * r;
      o.dx[n * D + d] = r * (g - (b ? m1 : T(0)) - xh * m2);
    }
  }
  return o;
}

// dx = r (g - m1 - xhat m2) cancels: the magnitude of its terms, max over rows of r (|g| + |m1| +
// |xhat m2|) from the f64 arm's row statistics.
double dx_terms(const Vec& x, const Vec& w, const Vec& dy, int64_t N, int64_t D, bool centred, double eps) {
  double mx = 0;
  for (int64_t n = 0; n < N; ++n) {
    double mu = 0, ms = 0, m1 = 0, m2 = 0;
    if (centred)
      for (int64_t d = 0; d < D; ++d) mu += x[n * D + d] / double(D);
    for (int64_t d = 0; d < D; ++d) ms += (x[n * D + d] - mu) * (x[n * D + d] - mu) / double(D);
    const double r = 1 / std::sqrt(ms + eps);
    for (int64_t d = 0; d < D; ++d) {
      const double g = double(dy[n * D + d]) * w[d];
      m1 += g / double(D), m2 += g * (x[n * D + d] - mu) * r / double(D);
    }
    for (int64_t d = 0; d < D; ++d)
      mx = std::max(mx, r * (std::abs(double(dy[n * D + d]) * w[d]) + (centred ? std::abs(m1) : 0.0) +
                             std::abs((x[n * D + d] - mu) * r * m2)));
  }
  return mx;
}


bool have_device() { return cuda_backend() && cuda_device_count() > 0; }

constexpr float kEps = 1e-6f;
// Rows of more than one thread's stride (256) and, for the backward's column sums, more than one
// chunk of rows (128): every loop of the kernels runs more than once.
constexpr int64_t kN = 131, kD = 300;

// ---- the cases ---------------------------------------------------------------------------------

// x and y column slices of wider tensors (row strides in elements of their own dtype).
TEST(NnBf16, RmsnormForward) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const int64_t N = kN, D = kD, wx = D + 5, wy = D + 3;
  const Vec X = rne(randn(N * wx, 101)), W = randn(D, 102);
  auto run = [&](DType xt, DType yt) {
    Tensor y = on_cuda({N, wy}, Vec(N * wy, 0.f), yt), rstd = Tensor::empty({N}, F, Device::cuda);
    rmsnorm_fwd(on_cuda({N, wx}, X, xt).slice(1, 1, 1 + D), on_cuda({D}, W, F), kEps, y.slice(1, 2, 2 + D), rstd);
    return std::pair{host(y), host(rstd)};
  };
  const auto [y32, r32] = run(F, F);
  const Vec x = cols(X, N, wx, 1, D);
  for (auto [xt, yt] : {std::pair{B, F}, {F, B}, {B, B}}) {
    const std::string c = combo({{"x", xt}, {"y", yt}});
    const auto [y, r] = run(xt, yt);
    expect_same_bits("rmsnorm y, " + c, y, yt == B ? rne(y32) : y32);
    expect_same_bits("rmsnorm rstd, " + c, r, r32);
    expect_oracle("rmsnorm y, " + c, cols(y, N, wy, 2, D), yt,
                  [&](auto z) { return norm_ref<decltype(z)>(x, W, nullptr, nullptr, N, D, kEps).y; });
    expect_oracle("rmsnorm rstd, " + c, r, F,
                  [&](auto z) { return norm_ref<decltype(z)>(x, W, nullptr, nullptr, N, D, kEps).rstd; });
  }
}

// xs = x + x2 written over x (the residual stream, f32); x2 a column slice in its dtype.
TEST(NnBf16, AddRmsnormForward) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const int64_t N = kN, D = kD, w2 = D + 4;
  const Vec X = randn(N * D, 111), X2 = rne(randn(N * w2, 112)), W = randn(D, 113);
  auto run = [&](DType x2t, DType yt) {
    Tensor x = on_cuda({N, D}, X, F), y = on_cuda({N, D}, Vec(N * D, 0.f), yt), rstd = Tensor::empty({N}, F, Device::cuda);
    add_rmsnorm_fwd(x, on_cuda({N, w2}, X2, x2t).slice(1, 3, 3 + D), on_cuda({D}, W, F), kEps, x, y, rstd);
    return std::vector<Vec>{host(x), host(y), host(rstd)};
  };
  const std::vector<Vec> ref32 = run(F, F);
  const Vec x2 = cols(X2, N, w2, 3, D);
  for (auto [x2t, yt] : {std::pair{B, F}, {F, B}, {B, B}}) {
    const std::string c = combo({{"x2", x2t}, {"y", yt}});
    const std::vector<Vec> got = run(x2t, yt);
    expect_same_bits("add_rmsnorm xs, " + c, got[0], ref32[0]);
    expect_same_bits("add_rmsnorm y, " + c, got[1], yt == B ? rne(ref32[1]) : ref32[1]);
    expect_same_bits("add_rmsnorm rstd, " + c, got[2], ref32[2]);
    auto sum = [&](auto z) {
      V<decltype(z)> s(N * D);
      for (int64_t i = 0; i < N * D; ++i) s[i] = decltype(z)(X[i]) + decltype(z)(x2[i]);
      return s;
    };
    expect_oracle("add_rmsnorm xs, " + c, got[0], F, sum);
    // y normalises xs = x + x2, which the kernel rounds to f32 before the norm: the oracle
    // normalises that f32 sum (its own rounding is the rule's for xs, checked above).
    Vec xs32(N * D);
    for (int64_t i = 0; i < N * D; ++i) xs32[i] = X[i] + x2[i];
    expect_oracle("add_rmsnorm y, " + c, got[1], yt,
                  [&](auto z) { return norm_ref<decltype(z)>(xs32, W, nullptr, nullptr, N, D, kEps).y; });
  }
}

// x bf16 (the saved activation) with dy, dx, dw f32; rstd the f32 forward's; dw added into.
TEST(NnBf16, RmsnormBackward) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const int64_t N = kN, D = kD, wx = D + 5;
  const Vec X = rne(randn(N * wx, 121)), W = randn(D, 122), DY = randn(N * D, 123), DW0 = randn(D, 124);
  const Vec x = cols(X, N, wx, 1, D);
  Tensor rstd = Tensor::empty({N}, F, Device::cuda), y = Tensor::empty({N, D}, F, Device::cuda);
  rmsnorm_fwd(on_cuda({N, D}, x, F), on_cuda({D}, W, F), kEps, y, rstd);
  auto run = [&](DType xt) {
    Tensor dx = Tensor::empty({N, D}, F, Device::cuda), dw = on_cuda({D}, DW0, F);
    rmsnorm_bwd(on_cuda({N, D}, DY, F), on_cuda({N, wx}, X, xt).slice(1, 1, 1 + D), on_cuda({D}, W, F), rstd, dx, dw);
    return std::pair{host(dx), host(dw)};
  };
  const auto [dx32, dw32] = run(F);
  const auto [dx, dw] = run(B);
  expect_same_bits("rmsnorm dx, x bf16", dx, dx32);
  expect_same_bits("rmsnorm dw, x bf16", dw, dw32);
  auto ref = [&](auto z) { return norm_ref<decltype(z)>(x, W, nullptr, &DY, N, D, kEps, DW0, Vec(D, 0.f)); };
  expect_oracle("rmsnorm dx, x bf16", dx, F, [&](auto z) { return ref(z).dx; }, dx_terms(x, W, DY, N, D, false, kEps));
  expect_oracle("rmsnorm dw, x bf16", dw, F, [&](auto z) { return ref(z).dw; });
}

TEST(NnBf16, LayernormForward) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const int64_t N = kN, D = kD;
  Vec X = randn(N * D, 131, 2.f);
  for (float& v : X) v += 0.5f;  // off-centre rows: the mean matters
  X = rne(X);
  const Vec W = randn(D, 132), Bi = randn(D, 133);
  auto run = [&](DType xt, DType yt) {
    Tensor y = Tensor::empty({N, D}, yt, Device::cuda), mean = Tensor::empty({N}, F, Device::cuda),
           rstd = Tensor::empty({N}, F, Device::cuda);
    layernorm_fwd(on_cuda({N, D}, X, xt), on_cuda({D}, W, F), on_cuda({D}, Bi, F), kEps, y, mean, rstd);
    return std::vector<Vec>{host(y), host(mean), host(rstd)};
  };
  const std::vector<Vec> ref32 = run(F, F);
  for (auto [xt, yt] : {std::pair{B, F}, {F, B}, {B, B}}) {
    const std::string c = combo({{"x", xt}, {"y", yt}});
    const std::vector<Vec> got = run(xt, yt);
    expect_same_bits("layernorm y, " + c, got[0], yt == B ? rne(ref32[0]) : ref32[0]);
    expect_same_bits("layernorm mean, " + c, got[1], ref32[1]);
    expect_same_bits("layernorm rstd, " + c, got[2], ref32[2]);
    auto ref = [&](auto z) { return norm_ref<decltype(z)>(X, W, &Bi, nullptr, N, D, kEps); };
    expect_oracle("layernorm y, " + c, got[0], yt, [&](auto z) { return ref(z).y; });
    expect_oracle("layernorm mean, " + c, got[1], F, [&](auto z) { return ref(z).mean; });
    expect_oracle("layernorm rstd, " + c, got[2], F, [&](auto z) { return ref(z).rstd; });
  }
}

TEST(NnBf16, LayernormBackward) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const int64_t N = kN, D = kD;
  Vec X = randn(N * D, 141, 2.f);
  for (float& v : X) v += 0.5f;
  X = rne(X);
  const Vec W = randn(D, 142), Bi = randn(D, 143), DY = randn(N * D, 144), DW0 = randn(D, 145), DB0 = randn(D, 146);
  Tensor y = Tensor::empty({N, D}, F, Device::cuda), mean = Tensor::empty({N}, F, Device::cuda),
         rstd = Tensor::empty({N}, F, Device::cuda);
  layernorm_fwd(on_cuda({N, D}, X, F), on_cuda({D}, W, F), on_cuda({D}, Bi, F), kEps, y, mean, rstd);
  auto run = [&](DType xt) {
    Tensor dx = Tensor::empty({N, D}, F, Device::cuda), dw = on_cuda({D}, DW0, F), db = on_cuda({D}, DB0, F);
    layernorm_bwd(on_cuda({N, D}, DY, F), on_cuda({N, D}, X, xt), on_cuda({D}, W, F), mean, rstd, dx, dw, db);
    return std::vector<Vec>{host(dx), host(dw), host(db)};
  };
  const std::vector<Vec> ref32 = run(F), got = run(B);
  expect_same_bits("layernorm dx, x bf16", got[0], ref32[0]);
  expect_same_bits("layernorm dw, x bf16", got[1], ref32[1]);
  expect_same_bits("layernorm db, x bf16", got[2], ref32[2]);
  auto ref = [&](auto z) { return norm_ref<decltype(z)>(X, W, &Bi, &DY, N, D, kEps, DW0, DB0); };
  expect_oracle("layernorm dx, x bf16", got[0], F, [&](auto z) { return ref(z).dx; },
                dx_terms(X, W, DY, N, D, true, kEps));
  expect_oracle("layernorm dw, x bf16", got[1], F, [&](auto z) { return ref(z).dw; });
  expect_oracle("layernorm db, x bf16", got[2], F, [&](auto z) { return ref(z).db; });
}

// In place on channels [c0, c0 + Dr) of [b, s, H, width] in x's dtype, both layouts, forward and
// transposed; the other channels are untouched (bits).
TEST(NnBf16, Rope) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const int64_t b = 2, s = 5, H = 3, width = 13, c0 = 3, Dr = 8, half = Dr / 2;
  Vec cs(s * half), sn(s * half);
  for (int64_t p = 0; p < s; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double a = p * std::pow(10000.0, -2.0 * i / Dr);
      cs[p * half + i] = float(std::cos(a) * 1.25), sn[p * half + i] = float(std::sin(a) * 1.25);
    }
  const Vec X = rne(randn(b * s * H * width, 151));
  for (RopeLayout layout : {RopeLayout::interleaved, RopeLayout::half})
    for (bool transpose : {false, true}) {
      const std::string c = std::string(layout == RopeLayout::half ? "half" : "interleaved") +
                            (transpose ? " transposed" : "") + ", x bf16";
      auto run = [&](DType xt) {
        Tensor x = on_cuda({b, s, H, width}, X, xt);
        rope(x.slice(3, c0, c0 + Dr), on_cuda({s, half}, cs, F), on_cuda({s, half}, sn, F), layout, transpose);
        return host(x);
      };
      const Vec got = run(B);
      expect_same_bits("rope " + c, got, rne(run(F)));
      expect_oracle("rope " + c, got, B, [&](auto z) {
        using T = decltype(z);
        V<T> y(X.begin(), X.end());
        const int64_t step = layout == RopeLayout::interleaved ? 2 : 1, off = step == 2 ? 1 : half;
        for (int64_t n = 0; n < b * s; ++n)
          for (int64_t h = 0; h < H; ++h)
            for (int64_t i = 0; i < half; ++i) {
              const int64_t p0 = (n * H + h) * width + c0 + i * step, p1 = p0 + off;
              const T co = cs[(n % s) * half + i], si = transpose ? -T(sn[(n % s) * half + i]) : T(sn[(n % s) * half + i]);
              y[p0] = T(X[p0]) * co - T(X[p1]) * si;
              y[p1] = T(X[p1]) * co + T(X[p0]) * si;
            }
        return y;
      });
    }
}

TEST(NnBf16, Swiglu) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const int64_t n = 1031;
  const Vec G = rne(randn(n, 161, 2.f)), U = rne(randn(n, 162)), DY = randn(n, 163);
  auto run = [&](DType t) {
    Tensor y = Tensor::empty({n}, t, Device::cuda), dg = Tensor::empty({n}, F, Device::cuda),
           du = Tensor::empty({n}, F, Device::cuda);
    const Tensor g = on_cuda({n}, G, t), u = on_cuda({n}, U, t);
    swiglu_fwd(g, u, y);
    swiglu_bwd(on_cuda({n}, DY, F), g, u, dg, du);
    return std::vector<Vec>{host(y), host(dg), host(du)};
  };
  const std::vector<Vec> ref32 = run(F), got = run(B);
  expect_same_bits("swiglu y, g u y bf16", got[0], rne(ref32[0]));
  expect_same_bits("swiglu dg, g u bf16", got[1], ref32[1]);
  expect_same_bits("swiglu du, g u bf16", got[2], ref32[2]);
  auto ref = [&](int which) {
    return [&, which](auto z) {
      using T = decltype(z);
      V<T> o(n);
      for (int64_t i = 0; i < n; ++i) {
        const T g = G[i], sig = T(1) / (T(1) + std::exp(-g));
        o[i] = which == 0   ? g * sig * T(U[i])
               : which == 1 ? T(DY[i]) * T(U[i]) * sig * (T(1) + g * (T(1) - sig))
                            : T(DY[i]) * g * sig;
      }
      return o;
    };
  };
  expect_oracle("swiglu y, bf16", got[0], B, ref(0));
  expect_oracle("swiglu dg, bf16", got[1], F, ref(1));
  expect_oracle("swiglu du, bf16", got[2], F, ref(2));
}

// ---- refusals --------------------------------------------------------------------------------

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// The CPU stays the f32 reference: every bf16 operand is refused by its supports(), with the
// dispatcher's error naming the op and the backend.
TEST(NnBf16, TheCpuBackendRefusesBf16) {
  auto t = [](const Shape& s, DType dt) { return Tensor::zeros(s, dt); };
  const Tensor x = t({4, 6}, F), xb = t({4, 6}, B), w = t({6}, F), r = t({4}, F), dw = t({6}, F);
  const std::string no = ": the cpu backend does not run";
  expect_error([&] { rmsnorm_fwd(xb, w, kEps, t({4, 6}, F), t({4}, F)); }, "rmsnorm" + no);
  expect_error([&] { rmsnorm_fwd(x, w, kEps, t({4, 6}, B), t({4}, F)); }, "rmsnorm" + no);
  expect_error([&] { add_rmsnorm_fwd(x, xb, w, kEps, x, t({4, 6}, F), t({4}, F)); }, "add_rmsnorm" + no);
  expect_error([&] { add_rmsnorm_fwd(x, x, w, kEps, x, t({4, 6}, B), t({4}, F)); }, "add_rmsnorm" + no);
  expect_error([&] { rmsnorm_bwd(x, xb, w, r, t({4, 6}, F), dw); }, "rmsnorm backward" + no);
  expect_error([&] { layernorm_fwd(xb, w, w, kEps, t({4, 6}, B), t({4}, F), t({4}, F)); }, "layernorm" + no);
  expect_error([&] { layernorm_bwd(x, xb, w, r, r, t({4, 6}, F), dw, t({6}, F)); }, "layernorm backward" + no);
  expect_error([&] { rope(t({1, 2, 1, 4}, B), t({2, 2}, F), t({2, 2}, F), RopeLayout::half, false); }, "rope" + no);
  expect_error([&] { swiglu_fwd(xb, xb, t({4, 6}, B)); }, "swiglu" + no);
  expect_error([&] { swiglu_bwd(x, xb, xb, t({4, 6}, F), t({4, 6}, F)); }, "swiglu backward" + no);
}

// The entry points take f32 or bf16 for the activations only, with the existing clear errors.
TEST(NnBf16, OnlyTheActivationsMayBeBf16) {
  auto t = [](const Shape& s, DType dt) { return Tensor::zeros(s, dt); };
  const Tensor x = t({4, 6}, F), xb = t({4, 6}, B), w = t({6}, F), r = t({4}, F);
  expect_error([&] { rmsnorm_fwd(t({4, 6}, DType::i32), w, kEps, x, r); }, "rmsnorm: x must be f32 or bf16");
  expect_error([&] { rmsnorm_fwd(x, t({6}, B), kEps, x, r); }, "rmsnorm: w must be f32");
  expect_error([&] { add_rmsnorm_fwd(xb, x, w, kEps, x, x, r); }, "add_rmsnorm: x must be f32");
  expect_error([&] { add_rmsnorm_fwd(x, x, w, kEps, xb, x, r); }, "add_rmsnorm: xs must be f32");
  expect_error([&] { rmsnorm_bwd(xb, x, w, r, x, w); }, "rmsnorm backward: dy must be f32");
  expect_error([&] { rmsnorm_bwd(x, x, w, r, xb, w); }, "rmsnorm backward: dx must be f32");
  expect_error([&] { layernorm_fwd(x, w, w, kEps, x, t({4}, B), r); }, "layernorm: mean must be f32");
  expect_error([&] { swiglu_fwd(xb, x, xb); }, "swiglu: u must be bf16");
  expect_error([&] { swiglu_bwd(x, xb, xb, xb, x); }, "swiglu backward: dg must be f32");
  expect_error([&] { rope(t({1, 2, 1, 4}, DType::f64), t({2, 2}, F), t({2, 2}, F), RopeLayout::half, false); },
               "rope: x must be f32 or bf16");
}

}  // namespace
}  // namespace hmla
