// DeepSeek-V4's routing on the MoE ops (moe_route_fwd with sqrtsoftplus scores, one group, hash
// routing by tid2eid, no correction bias on hash layers) against transformers 5.24: from each
// layer's MLP input of the v4 fixture (the float64 ffn_hc collapsed streams of batch row 0, through
// ffn_norm), the experts every token chose and their gating weights. A float64 router written
// here from transformers' formulas first reproduces the fixture (its choice exactly, its weights
// within two float64 evaluations' difference); hmla's f32 router then chooses the same experts and
// weighs them within the STYLE.md rule (twice the naive float instance's error plus 8 ulps).
#include <gtest/gtest.h>

#include <cmath>

#include "hmla/io/safetensors.h"
#include "hf_fixture.h"
#include "hmla/model/config.h"
#include "hmla/ops/moe.h"

namespace hmla {
namespace {

const std::string kDir = std::string(HMLA_SOURCE_DIR) + "/tests/hf/fixtures/";

using testing::joined;

// The router of one layer over rows x [N, D] (the MLP input), in T: logits x W^T, s =
// sqrt(softplus(u)) (torch's threshold 20), the experts (hash: given; else top-k of s + bias, ties
// to the smaller index), weights = s / (sum s + 1e-20) x scaling.
template <class T>
void route_ref(const std::vector<T>& x, const std::vector<float>& W, const std::vector<float>* bias,
               const std::vector<int32_t>* fixed, int64_t N, int64_t D, int64_t E, int64_t k, double scaling,
               std::vector<int32_t>& idx, std::vector<T>& weight) {
  idx.assign(size_t(N * k), 0);
  weight.assign(size_t(N * k), T(0));
  std::vector<T> s(static_cast<size_t>(E));
  for (int64_t t = 0; t < N; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      T u = 0;
      for (int64_t d = 0; d < D; ++d) u += x[size_t(t * D + d)] * T(W[size_t(e * D + d)]);
      s[size_t(e)] = std::sqrt(u > T(20) ? u : std::log1p(std::exp(u)));
    }
    for (int64_t j = 0; j < k; ++j) {
      if (fixed) {
        idx[size_t(t * k + j)] = (*fixed)[size_t(t * k + j)];
        continue;
      }
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) taken |= idx[size_t(t * k + i)] == e;
        const T c = s[size_t(e)] + T((*bias)[size_t(e)]);
        if (!taken && (best < 0 || c > s[size_t(best)] + T((*bias)[size_t(best)]))) best = e;
      }
      idx[size_t(t * k + j)] = int32_t(best);
    }
    T sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += s[size_t(idx[size_t(t * k + j)])];
    for (int64_t j = 0; j < k; ++j) weight[size_t(t * k + j)] = s[size_t(idx[size_t(t * k + j)])] / (sum + T(1e-20)) * T(scaling);
  }
}

// transformers' RMSNorm of the rows, in T (f32 in transformers; the oracle's double here).
template <class T>
std::vector<T> rmsnorm_rows(const std::vector<double>& x, const std::vector<float>& w, int64_t N, int64_t D, double eps) {
  std::vector<T> out(x.size());
  for (int64_t t = 0; t < N; ++t) {
    T ss = 0;
    for (int64_t d = 0; d < D; ++d) ss += T(x[size_t(t * D + d)]) * T(x[size_t(t * D + d)]);
    const T r = T(1) / std::sqrt(ss / T(D) + T(eps));
    for (int64_t d = 0; d < D; ++d) out[size_t(t * D + d)] = T(x[size_t(t * D + d)]) * r * T(w[size_t(d)]);
  }
  return out;
}

TEST(V4Router, ChoosesAndWeighsAsTransformers) {
  const ModelConfig c = load_model_config(kDir + "v4/config.json");
  const io::TensorMap W = io::load_safetensors(kDir + "v4/model.safetensors");
  const io::TensorMap F = io::load_safetensors(kDir + "v4/fixture.safetensors");
  const io::TensorMap M = io::load_safetensors(kDir + "v4_modules/modules.safetensors");
  const int64_t s = F.at("input_ids").size(1), D = c.hidden_size, E = c.moe.n_routed_experts, k = c.moe.num_experts_per_tok;
  const std::vector<int64_t> ids = F.at("input_ids").to_vector<int64_t>();  // row 0: the first s
  int hash_layers = 0, learned_layers = 0;
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) {
    const std::string at = "model.layers." + std::to_string(L) + ".", l = "layer" + std::to_string(L);
    const std::vector<float> gate = W.at(at + "ffn.gate.weight").to_vector<float>();
    const bool hash = c.v4.hash[size_t(L)];
    hash_layers += hash, learned_layers += !hash;
    std::vector<float> bias;
    std::vector<int32_t> fixed;
    if (hash) {
      const std::vector<int64_t> table = W.at(at + "ffn.gate.tid2eid").to_vector<int64_t>();
      for (int64_t t = 0; t < s; ++t)
        for (int64_t j = 0; j < k; ++j) fixed.push_back(int32_t(table[size_t(ids[size_t(t)] * k + j)]));
    } else {
      bias = W.at(at + "ffn.gate.bias").to_vector<float>();
    }
    const std::vector<double> x64 = joined(M, l + ".ffn_hc.collapsed");
    const std::vector<float> nw = W.at(at + "ffn_norm.weight").to_vector<float>();
    // The float64 router reproduces transformers' (row 0's tokens are the fixture's first s rows).
    std::vector<int32_t> ref_idx, f_idx;
    std::vector<double> ref_w;
    std::vector<float> f_w;
    route_ref<double>(rmsnorm_rows<double>(x64, nw, s, D, c.rms_norm_eps), gate, &bias, hash ? &fixed : nullptr, s, D,
                      E, k, c.moe.routed_scaling_factor, ref_idx, ref_w);
    // The fixture lists each token's experts ascending, with their weights in that order.
    const std::vector<int32_t> hf_idx = F.at(l + ".experts").to_vector<int32_t>();
    const std::vector<double> hf_w = joined(F, l + ".expert_weights");
    for (int64_t t = 0; t < s; ++t)
      for (int64_t j = 0; j < k; ++j) {
        int64_t at_ref = -1;
        for (int64_t i = 0; i < k; ++i)
          if (ref_idx[size_t(t * k + i)] == hf_idx[size_t(t * k + j)]) at_ref = i;
        ASSERT_GE(at_ref, 0) << l << " token " << t << ": transformers chose expert " << hf_idx[size_t(t * k + j)];
        EXPECT_NEAR(ref_w[size_t(t * k + at_ref)], hf_w[size_t(t * k + j)], 1e-12) << l << " token " << t;  // two float64 evaluations
      }
    // hmla's router (f32, on the f32 rounding of the same input) against the float64 one.
    const std::vector<float> xf = rmsnorm_rows<float>(x64, nw, s, D, c.rms_norm_eps);
    route_ref<float>(xf, gate, &bias, hash ? &fixed : nullptr, s, D, E, k, c.moe.routed_scaling_factor, f_idx, f_w);
    Tensor logits = Tensor::empty({s, E}, DType::f32);
    {
      std::vector<float> u(size_t(s * E));
      for (int64_t t = 0; t < s; ++t)
        for (int64_t e = 0; e < E; ++e) {
          float acc = 0;
          for (int64_t d = 0; d < D; ++d) acc += xf[size_t(t * D + d)] * gate[size_t(e * D + d)];
          u[size_t(t * E + e)] = acc;
        }
      logits = Tensor::from_vector<float>({s, E}, u);
    }
    const MoeRouting r{Tensor::empty({s, k}, DType::i32), Tensor::empty({s, k}, DType::f32), Tensor::empty({s, k}, DType::f32)};
    moe_route_fwd(logits, hash ? Tensor() : Tensor::from_vector<float>({E}, bias),
                  {1, 1, true, float(c.moe.routed_scaling_factor), MoeScore::sqrtsoftplus}, r,
                  hash ? Tensor::from_vector<int32_t>({s, k}, fixed) : Tensor());
    const std::vector<int32_t> got_idx = r.idx.to_vector<int32_t>();
    const std::vector<float> got_w = r.weight.to_vector<float>();
    for (int64_t i = 0; i < s * k; ++i) {
      EXPECT_EQ(got_idx[size_t(i)], ref_idx[size_t(i)]) << l << " slot " << i;
      const double ref = ref_w[size_t(i)];
      const double tol = 2 * std::abs(double(f_w[size_t(i)]) - ref) + 8 * std::ldexp(std::abs(ref), -23);
      EXPECT_NEAR(got_w[size_t(i)], ref, tol) << l << " slot " << i;
    }
  }
  EXPECT_GT(hash_layers, 0);
  EXPECT_GT(learned_layers, 0);
}

}  // namespace
}  // namespace hmla
