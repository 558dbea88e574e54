// The mHC ops (hmla/ops/mhc.h) on the CPU against transformers 5.24's DeepseekV4HyperConnection
// and DeepseekV4HyperHead (fixtures of tests/hf/make_v4_fixtures.py: the float64 module outputs of
// batch row 0, as hi/lo f32 pairs, and the checkpoint's hc_* weights by DeepSeek's names). Per layer
// L: attn_hc on the layer's input streams (post, comb, collapsed); the streams after attention
// rebuilt by mhc_post_fwd from the fixture's attn_hc outputs and attention output; ffn_hc on them;
// mhc_post_fwd again against the next layer's input streams; and hc_head on the last streams. The
// bound (STYLE.md): twice the f32 model's error on the same tensor (NAME_f32err, its upstream error
// included, so above the op's own) plus 8 ulps of the tensor's largest value. A separate target
// (test_hf_mhc) because it needs the I/O and the ops only, not the model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "hmla/io/json_strict.h"
#include "hmla/io/safetensors.h"
#include "hf_fixture.h"
#include "hmla/ops/mhc.h"

namespace hmla {
namespace {

const std::string kDir = std::string(HMLA_SOURCE_DIR) + "/tests/hf/fixtures/";

using testing::joined;
// The float64 tensor rounded to f32, in the fixture's shape.
Tensor rounded(const io::TensorMap& f, const std::string& name) {
  const std::vector<double> v = joined(f, name);
  std::vector<float> r(v.begin(), v.end());
  return Tensor::from_vector<float>(f.at(name + "_hi").shape(), r);
}

struct Worst {
  double ratio = 0;
};

void expect_near_fixture(const io::TensorMap& f, const std::string& name, const Tensor& got, Worst& worst) {
  const std::vector<double> ref = joined(f, name);
  const std::vector<float> g = got.to_vector<float>();
  ASSERT_EQ(g.size(), ref.size()) << name;
  double mag = 0, err = 0;
  for (double v : ref) mag = std::max(mag, std::abs(v));
  for (size_t i = 0; i < g.size(); ++i) err = std::max(err, std::abs(double(g[i]) - ref[i]));
  const double bound = 2 * double(f.at(name + "_f32err").to_vector<float>()[0]) + 8 * 0x1p-23 * mag;
  EXPECT_LE(err, bound) << name;
  std::printf("%-26s max error %.3g bound %.3g\n", name.c_str(), err, bound);
  worst.ratio = std::max(worst.ratio, err / bound);
}

TEST(HfMhc, HyperConnectionsAndTheHeadMatchTransformers) {
  const nlohmann::json c = io::load_json(kDir + "v4/config.json");
  const io::TensorMap W = io::load_safetensors(kDir + "v4/model.safetensors");
  const io::TensorMap M = io::load_safetensors(kDir + "v4_modules/modules.safetensors");
  const int64_t n = c.at("hc_mult").get<int64_t>(), iters = c.at("hc_sinkhorn_iters").get<int64_t>();
  const int64_t layers = c.at("num_hidden_layers").get<int64_t>();
  const float eps = float(c.at("rms_norm_eps").get<double>()), hc_eps = float(c.at("hc_eps").get<double>());
  const Tensor X0 = rounded(M, "layer0.streams");
  const int64_t N = X0.size(0), D = X0.size(2);
  ASSERT_EQ(X0.size(1), n);
  Worst worst;
  auto mixer = [&](const std::string& p) { return MhcWeights{W.at(p + "_fn"), W.at(p + "_base"), W.at(p + "_scale")}; };
  auto entry = [&](const std::string& weights, const std::string& out, const Tensor& X) {
    const Tensor y = Tensor::zeros({N, D}, DType::f32), post = Tensor::zeros({N, n}, DType::f32);
    const Tensor comb = Tensor::zeros({N, n, n}, DType::f32);
    const MhcSaved s{Tensor::zeros({N}, DType::f32), Tensor::zeros({N, (2 + n) * n}, DType::f32)};
    mhc_pre_fwd(X, mixer(weights), iters, eps, hc_eps, y, post, comb, s);
    expect_near_fixture(M, out + ".post", post, worst);
    expect_near_fixture(M, out + ".comb", comb, worst);
    expect_near_fixture(M, out + ".collapsed", y, worst);
  };
  for (int64_t L = 0; L < layers; ++L) {
    const std::string l = "layer" + std::to_string(L);
    entry("model.layers." + std::to_string(L) + ".hc_attn", l + ".attn_hc", rounded(M, l + ".streams"));
    const Tensor X1 = Tensor::zeros({N, n, D}, DType::f32);
    mhc_post_fwd(rounded(M, l + ".streams"), rounded(M, l + ".attn_out"), rounded(M, l + ".attn_hc.post"),
                 rounded(M, l + ".attn_hc.comb"), X1);
    entry("model.layers." + std::to_string(L) + ".hc_ffn", l + ".ffn_hc", X1);
    const Tensor X2 = Tensor::zeros({N, n, D}, DType::f32);
    mhc_post_fwd(X1, rounded(M, l + ".mlp_out"), rounded(M, l + ".ffn_hc.post"), rounded(M, l + ".ffn_hc.comb"), X2);
    expect_near_fixture(M, "layer" + std::to_string(L + 1) + ".streams", X2, worst);
  }
  const Tensor y = Tensor::zeros({N, D}, DType::f32);
  const MhcSaved s{Tensor::zeros({N}, DType::f32), Tensor::zeros({N, n}, DType::f32)};
  mhc_head_fwd(rounded(M, "layer" + std::to_string(layers) + ".streams"), mixer("model.hc_head.hc"), eps, hc_eps, y, s);
  expect_near_fixture(M, "hc_head", y, worst);
  std::printf("worst error / bound: %.3g\n", worst.ratio);
}

}  // namespace
}  // namespace hmla
