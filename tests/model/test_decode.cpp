// Decoding with the latent KV cache against the full forward: every layer mode (with and without
// an attention sink, q LoRA, YaRN, an index window), a prefill chunk, a second chunk after it and
// then single tokens; dsa_sparse with s > index_topk, so the selection from the cached indexer
// keys decides the logits, and its tables must equal the forward's; MoE MLPs (docs/moe.md) from a
// layer on, whose routing of each token must not depend on how the tokens are grouped.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>

#include "hmla/model/decode.h"
#include "testing.h"
#include "tiny_config.h"

namespace hmla {
namespace {

struct Case {
  std::vector<std::string> modes;
  bool q_lora = true, sink = false, yarn = false;
  int window = 0;
  int moe_from = -1;  // >= 0: first_k_dense_replace, with a tiny DeepSeekMoE
};

ModelConfig config(const Case& k) {
  testing::TinyConfig t;
  t.q_lora = k.q_lora ? 16 : 0, t.indexer->window = k.window, t.modes = k.modes, t.sink = k.sink, t.yarn = k.yarn;
  nlohmann::json j = testing::tiny_config_json(t);
  if (k.moe_from >= 0) {
    j["first_k_dense_replace"] = k.moe_from, j["n_routed_experts"] = 8, j["n_group"] = 4, j["topk_group"] = 2;
    j["num_experts_per_tok"] = 3, j["moe_intermediate_size"] = 6, j["n_shared_experts"] = 1;
  }
  return parse_model_config(j, "decode test");
}

std::string describe(const Case& k) {
  std::string s;
  for (const auto& m : k.modes) s += m + " ";
  return s + (k.q_lora ? "q_lora " : "") + (k.sink ? "sink " : "") + (k.yarn ? "yarn " : "") +
         "window " + std::to_string(k.window) + (k.moe_from >= 0 ? " moe from " + std::to_string(k.moe_from) : "");
}

Model random_model(const ModelConfig& c, uint64_t seed) {
  std::vector<bool> idx;
  for (LayerMode m : c.layer_modes) idx.push_back(is_dsa(m));
  Model m = build_model(c, idx);
  init_model(m, seed);
  // A sink of 0 is init_model's; a random one makes the test see it.
  for (int64_t L = 0; L < c.num_hidden_layers && c.attention_sink; ++L)
    m.w.layers[L].attn.softmax_offset.copy_from(Tensor::from_vector<float>({2}, testing::randn(2, seed + L)));
  return m;
}

// The decode and the forward compute the same function through differently grouped f32 sums:
// BLAS kernels pick other blockings for one row than for s rows, mha/dsa_warmup layers attend in
// the absorbed form (W_kb folded into q, W_vb after attention: sums of Dn and Rkv terms regrouped),
// and a softmax over the cached keys of a row sums its terms in another order. A reassociated sum
// of k terms moves by at most k eps times the sum of its terms' magnitudes; with unit-scale
// activations (RMSNorm) that is k eps of the values carried. Each layer passes the residual stream
// through 8 chained sums (q, absorption, scores, values, de-absorption, o_proj, up/gate, down), the
// head through one; every sum has at most k_max = max(hidden, intermediate, Rkv + Dr, s) terms. A
// rounding change early on is carried with gain ~1 through the later layers (RMSNorm renormalises,
// the residual adds), so logits move by at most (8 L + 1) k_max eps relative to their largest.
double rounding_bound(const ModelConfig& c, int64_t s) {
  const int64_t k_max = std::max({c.hidden_size, c.intermediate_size, c.kv_lora_rank + c.qk_rope_head_dim, s});
  return double(8 * c.num_hidden_layers + 1) * double(k_max) * FLT_EPSILON;
}

TEST(Decode, EveryModeMatchesTheFullForward) {
  const std::vector<Case> cases{
      {{"mha", "mha"}, true},
      {{"mha"}, false, true, true},
      {{"mqa_full_causal", "mha"}, false, false, true},
      {{"mqa_full_causal"}, true, true, false},
      {{"dsa_warmup", "mha"}, true, true},
      {{"dsa_sparse", "dsa_sparse"}, true, false, false},
      {{"dsa_sparse", "mqa_full_causal"}, true, true, true},
      {{"mha", "dsa_sparse"}, true, false, false, 2},
      {{"dsa_sparse"}, true, true, true, 3},
      {{"mha", "dsa_sparse"}, true, false, false, 0, 1},
      {{"mha", "mha"}, true, false, false, 0, 0},
  };
  const int64_t s = 24;  // > index_topk + index_window: a dsa_sparse row sees only part of A(t)
  std::vector<int32_t> ids(s);
  std::mt19937_64 rng(3);
  for (auto& t : ids) t = int32_t(1 + rng() % 39);
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& k = cases[ci];
    const ModelConfig c = config(k);
    const Model m = random_model(c, 11 + ci);
    std::vector<Tensor> want_topk;
    const Tensor full = model_logits(m, {Tensor::from_vector<int32_t>({1, s}, ids), layout_causal(1, s)}, &want_topk);
    const int64_t V = c.vocab_size;
    const float* fl = full.data<float>();
    KvCache cache = kv_cache(m, s);
    double worst = 0;
    // A prefill of 7, a chunk of 3 after it, then one token a step.
    for (int64_t P = 0; P < s;) {
      const int64_t n = P == 0 ? 7 : P == 7 ? 3 : 1;
      std::vector<Tensor> topk;
      const Tensor got = decode_step(m, cache, std::span<const int32_t>(ids).subspan(P, n), &topk);
      ASSERT_EQ(cache.len, P + n);
      const float* want = fl + (P + n - 1) * V;
      double diff = 0, mag = 0;
      for (int64_t v = 0; v < V; ++v) {
        diff = std::max(diff, std::abs(double(got.data<float>()[v]) - want[v]));
        mag = std::max(mag, std::abs(double(want[v])));
      }
      worst = std::max(worst, diff / mag);
      EXPECT_LE(diff, rounding_bound(c, s) * mag) << describe(k) << " at position " << P + n - 1;
      for (int64_t L = 0; L < c.num_hidden_layers; ++L) {
        if (c.layer_modes[L] != LayerMode::dsa_sparse) {
          EXPECT_FALSE(topk[L].defined());
          continue;
        }
        const int64_t KW = c.index_topk + c.index_window;
        ASSERT_EQ(topk[L].shape(), Shape({n, KW}));
        const std::vector<int32_t> a = topk[L].to_vector<int32_t>(), b = want_topk[L].to_vector<int32_t>();
        EXPECT_EQ(a, std::vector<int32_t>(b.begin() + P * KW, b.begin() + (P + n) * KW))
            << describe(k) << " layer " << L << " rows " << P << ".." << P + n;
      }
      P += n;
    }
    std::printf("%-45s max |decode - forward| / max |forward| = %.2e (bound %.2e)\n", describe(k).c_str(), worst,
                rounding_bound(c, s));
  }
}

// The selection must matter in the dsa_sparse cases above: with s > K + W the sparse logits differ
// from the dense latent MQA's over the whole causal set.
TEST(Decode, TheSparseSelectionMatters) {
  Case k{{"dsa_sparse"}};
  const ModelConfig sparse = config(k);
  ModelConfig dense = sparse;
  set_all_modes(dense, LayerMode::mqa_full_causal);
  const Model ms = random_model(sparse, 5);
  Model md = build_model(dense, {true});
  md.arena.copy_from(ms.arena);
  std::vector<int32_t> ids(20);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(3 + (i * 7) % 31);
  KvCache cs = kv_cache(ms, 20), cd = kv_cache(md, 20);
  const std::vector<float> a = decode_step(ms, cs, ids).to_vector<float>(), b = decode_step(md, cd, ids).to_vector<float>();
  double diff = 0;
  for (size_t v = 0; v < a.size(); ++v) diff = std::max(diff, std::abs(double(a[v]) - b[v]));
  EXPECT_GT(diff, 1e-3);
}

TEST(Decode, TheCacheRefusesWhatItCannotHold) {
  const ModelConfig c = config({{"mha"}});
  const Model m = random_model(c, 1);
  EXPECT_THROW(kv_cache(m, 0), ShapeError);
  EXPECT_THROW(kv_cache(m, c.max_position_embeddings + 1), ShapeError);
  KvCache cache = kv_cache(m, 4);
  const std::vector<int32_t> five{1, 2, 3, 4, 5};
  EXPECT_THROW(decode_step(m, cache, five), ShapeError);
  EXPECT_EQ(cache.len, 0);
  EXPECT_THROW(decode_step(m, cache, std::span<const int32_t>()), ShapeError);
  decode_step(m, cache, std::span<const int32_t>(five).first(4));
  EXPECT_THROW(decode_step(m, cache, std::span<const int32_t>(five).first(1)), ShapeError);
}

}  // namespace
}  // namespace hmla
