// The mHC oracle's gradients against central differences of its own forward (float64), and the
// errors against the oracle per tensor on each device (the rows also run in test_case_rows.cpp).
// Central differences with step h on a float64 function of O(1) values: truncation ~h^2 |f'''|
// ~1e-12 and cancellation ~2^-53 |L| / h ~1e-10 for h = 1e-6, so 1e-7 of the gradient's scale is
// far above the differences' own error and far below a wrong term (eps alone moves the big-eps
// case's gradients by more than 1e-3 of their scale).
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "hmla/core/cuda.h"
#include "cases_mhc.h"

namespace hmla {
namespace {

using op_cases::MhcDims;

double fd_tolerance(const std::vector<double>& g) {
  double mx = 1;
  for (double v : g) mx = std::max(mx, std::abs(v));
  return 1e-7 * mx;
}

// d loss / d v[i] by central differences for every i, against the analytic g.
void expect_fd(const char* what, std::vector<double>& v, const std::vector<double>& g,
               const std::function<double()>& loss) {
  ASSERT_EQ(v.size(), g.size()) << what;
  const double tol = fd_tolerance(g), h = 1e-6;
  for (size_t i = 0; i < v.size(); ++i) {
    const double v0 = v[i];
    v[i] = v0 + h;
    const double lp = loss();
    v[i] = v0 - h;
    const double lm = loss();
    v[i] = v0;
    EXPECT_NEAR((lp - lm) / (2 * h), g[i], tol) << what << "[" << i << "]";
  }
}

std::vector<double> values(int64_t count, double seed, double scale, double shift = 0) {
  std::vector<double> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) v[size_t(i)] = shift + scale * std::sin(double(i) * 1.3 + seed);
  return v;
}

void fd_mix(const MhcDims& d, bool head) {
  const int64_t K = d.n * d.D, m = head ? d.n : (2 + d.n) * d.n;
  std::vector<double> x = values(d.N * K, 0.1, 1.0), fn = values(m * K, 0.7, 0.8), base = values(m, 1.9, 0.5);
  std::vector<double> scale = head ? std::vector<double>{1.2} : std::vector<double>{0.9, 1.1, 1.6};
  const std::vector<double> dy = values(d.N * d.D, 2.9, 1.0), dpost = values(d.N * d.n, 3.3, 1.0);
  const std::vector<double> dcomb = values(d.N * d.n * d.n, 4.7, 1.0);
  auto loss = [&] {
    const auto r = op_cases::mhc_mix_ref<double>(d, head, x, fn, base, scale);
    double l = 0;
    for (size_t i = 0; i < r.y.size(); ++i) l += r.y[i] * dy[i];
    for (size_t i = 0; i < r.post.size(); ++i) l += r.post[i] * dpost[i];
    for (size_t i = 0; i < r.comb.size(); ++i) l += r.comb[i] * dcomb[i];
    return l;
  };
  const auto g = op_cases::mhc_mix_ref<double>(d, head, x, fn, base, scale, &dy, &dpost, &dcomb);
  expect_fd("dx", x, g.dx, loss);
  expect_fd("dfn", fn, g.dfn, loss);
  expect_fd("dbase", base, g.dbase, loss);
  expect_fd("dscale", scale, g.dscale, loss);
}

TEST(MhcOracle, EntryGradientsMatchCentralDifferences) {
  fd_mix({2, 3, 4, 3, 0.5, 0.05}, false);   // every eps visible, rows and columns both divided
  fd_mix({2, 4, 3, 20, 1e-6, 1e-6}, false); // V4's n and iterations
  fd_mix({3, 1, 5, 2, 1e-6, 0.1}, false);   // one stream
}

TEST(MhcOracle, HeadGradientsMatchCentralDifferences) { fd_mix({3, 4, 3, 1, 0.3, 0.05}, true); }

TEST(MhcOracle, ExitGradientsMatchCentralDifferences) {
  const MhcDims d{2, 3, 4, 1, 0, 0};
  std::vector<double> x = values(24, 0.2, 1.0), y = values(8, 0.4, 1.0), post = values(6, 0.6, 0.9, 1.0);
  std::vector<double> comb = values(18, 0.8, 0.5, 0.5);
  const std::vector<double> dout = values(24, 1.0, 1.0);
  auto loss = [&] {
    const auto r = op_cases::mhc_post_ref<double>(d, x, y, post, comb);
    double l = 0;
    for (size_t i = 0; i < r.out.size(); ++i) l += r.out[i] * dout[i];
    return l;
  };
  const auto g = op_cases::mhc_post_ref<double>(d, x, y, post, comb, &dout);
  expect_fd("dx", x, g.dx, loss);
  expect_fd("dy", y, g.dy, loss);
  expect_fd("dpost", post, g.dpost, loss);
  expect_fd("dcomb", comb, g.dcomb, loss);
}

// Every row on the CPU and, where there is one (the emulator's in test_cuda_emu), the CUDA device,
// printing each tensor's worst error and its bound (the registry's driver checks the rows too).
TEST(MhcRows, WithinTheRulePrintingTheirErrors) {
  std::vector<Device> devices{Device::cpu};
  if (cuda_backend() && cuda_device_count() > 0) devices.push_back(Device::cuda);
  for (Device dev : devices)
    for (const op_cases::MhcCase& c : op_cases::mhc_cases()) {
      std::vector<op_cases::MhcErr> report;
      EXPECT_EQ(op_cases::mhc_check(c, dev, &report), "") << c.name << " on " << device_name(dev);
      for (const op_cases::MhcErr& e : report)
        std::printf("%s %s %-12s error %.3g bound %.3g\n", device_name(dev), c.name.c_str(), e.name.c_str(), e.err,
                    e.bound);
    }
}

// The entry points' checks: the bound on n, a shape and the iterations, each named.
TEST(MhcOps, BadShapesAreRefusedWithTheirName) {
  const Tensor x = Tensor::zeros({2, 9, 4}, DType::f32);
  const MhcWeights w{Tensor::zeros({9, 36}, DType::f32), Tensor::zeros({9}, DType::f32), Tensor::zeros({1}, DType::f32)};
  const MhcSaved s{Tensor::zeros({2}, DType::f32), Tensor::zeros({2, 9}, DType::f32)};
  try {
    mhc_head_fwd(x, w, 1e-6f, 1e-6f, Tensor::zeros({2, 4}, DType::f32), s);
    FAIL() << "n = 9 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hc_mult = 9"), std::string::npos) << e.what();
  }
  const Tensor x2 = Tensor::zeros({2, 2, 4}, DType::f32);
  const MhcWeights w2{Tensor::zeros({2, 8}, DType::f32), Tensor::zeros({2}, DType::f32), Tensor::zeros({3}, DType::f32)};
  try {
    mhc_head_fwd(x2, w2, 1e-6f, 1e-6f, Tensor::zeros({2, 4}, DType::f32), {Tensor::zeros({2}, DType::f32), Tensor::zeros({2, 2}, DType::f32)});
    FAIL() << "a head scale of 3 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hc_head's scale"), std::string::npos) << e.what();
  }
  const int64_t m = 8;  // (2 + n) n for n = 2
  const MhcWeights w3{Tensor::zeros({m, 8}, DType::f32), Tensor::zeros({m}, DType::f32), Tensor::zeros({3}, DType::f32)};
  try {
    mhc_pre_fwd(x2, w3, 0, 1e-6f, 1e-6f, Tensor::zeros({2, 4}, DType::f32), Tensor::zeros({2, 2}, DType::f32),
                Tensor::zeros({2, 2, 2}, DType::f32), {Tensor::zeros({2}, DType::f32), Tensor::zeros({2, m}, DType::f32)});
    FAIL() << "0 Sinkhorn iterations accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hc_sinkhorn_iters = 0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hmla
