// hmla against Hugging Face transformers (fixtures from tests/hf/make_fixtures.py, committed;
// no pip needed here): checkpoints as transformers saves them load as they are; logits match the
// float64 transformers run by the STYLE.md rule (twice the float32 transformers error plus 8 ulps);
// every layer's selection matches transformers' top-k as a set wherever the K-th and (K+1)-th
// scores are apart, and every MoE layer's chosen experts equal transformers' (the fixture's seed
// has no router decision within 1e-4 of a tie). Cases: dense (s <= index_topk), sparse
// (s > index_topk), YaRN, moe (layer 0 dense, layers 1-2 DeepSeekMoE: 8 experts in 4 groups, top-2
// groups, top-2 experts, a shared expert, a nonzero e_score_correction_bias), glm (GLM-5's
// glm_moe_dsa: interleaved indexer RoPE, indexer_types full/shared/shared/full, v_head_dim 12 !=
// qk_nope_head_dim 8, the moe case's routing on layers 1-3). A shared layer's table is its
// source's (the fixture has none for it). Every case is then saved by hmla and must hold the
// tensors transformers saved: the same names, shapes and dtypes.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include <filesystem>

#include "hmla/io/json_strict.h"
#include "hmla/io/safetensors.h"
#include "hf_fixture.h"
#include "hmla/model/model.h"
#include "testing.h"

namespace hmla {
namespace {

using testing::joined;

// Layer L's selection `mine` [b, s, K + W] against transformers' top-k as a set, wherever the K-th
// and (K+1)-th scores are apart; most rows must be compared.
void expect_same_selection(const io::TensorMap& f, const Tensor& topk, int64_t L, int64_t b, int64_t s, int64_t K) {
  auto hf = f.at("layer" + std::to_string(L) + ".topk").to_vector<int32_t>();
  const int64_t hk = f.at("layer" + std::to_string(L) + ".topk").size(2);
  auto scores = joined(f, "layer" + std::to_string(L) + ".index_scores");
  auto mine = topk.to_vector<int32_t>();
  const int64_t kw = topk.size(2);
  int compared = 0;
  for (int64_t r = 0; r < b * s; ++r) {
    const double* sc = &scores[r * s];
    std::vector<double> allowed;
    for (int64_t j = 0; j < s; ++j)
      if (!std::isinf(sc[j])) allowed.push_back(sc[j]);
    std::sort(allowed.rbegin(), allowed.rend());
    if (int64_t(allowed.size()) > K && allowed[K - 1] - allowed[K] < 1e-4) continue;  // a near-tie: either is right
    std::set<int32_t> a, e;
    for (int64_t i = 0; i < hk; ++i)
      if (!std::isinf(sc[hf[r * hk + i]])) e.insert(hf[r * hk + i]);
    for (int64_t i = 0; i < K; ++i)
      if (mine[r * kw + i] >= 0) a.insert(mine[r * kw + i]);
    EXPECT_EQ(a, e) << "layer " << L << " row " << r;
    if (a != e) {
      for (int64_t j = 0; j < s; ++j) std::printf("%lld:%.4f ", (long long)j, sc[j]);
      std::printf("\n");
    }
    ++compared;
  }
  EXPECT_GT(compared, b * s * 3 / 4);
}

class HfFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(HfFixture, LogitsAndSelectionsMatchTransformers) {
  const std::string dir = std::string(HMLA_SOURCE_DIR) + "/tests/hf/fixtures/" + GetParam();
  ModelConfig c = load_model_config(dir + "/config.json");
  for (LayerMode m : c.layer_modes) EXPECT_EQ(m, LayerMode::dsa_sparse);  // as transformers runs it
  io::TensorMap w = io::load_checkpoint_tensors(dir);
  Model m = build_model(c, std::vector<bool>(c.num_hidden_layers, true));
  load_into_model(m, w, dir);
  io::TensorMap f = io::load_safetensors(dir + "/fixture.safetensors");
  std::vector<int32_t> ids;
  for (int64_t v : f.at("input_ids").to_vector<int64_t>()) ids.push_back(int32_t(v));
  const int64_t b = f.at("input_ids").size(0), s = f.at("input_ids").size(1);
  Batch batch{Tensor::from_vector<int32_t>({b, s}, ids), layout_causal(b, s)};
  std::vector<Tensor> topk, experts;
  Tensor logits = model_logits(m, batch, &topk, Comm::self(), &experts);
  const double err = testing::expect_within_rule("logits", logits.to_vector<float>(), f.at("logits_f32").to_vector<float>(),
                                                 joined(f, "logits"));
  std::printf("%s: max |hmla - transformers f64| = %.3e\n", GetParam().c_str(), err);

  const int64_t K = c.index_topk;
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) {
    if (c.indexer_shared(L)) {  // IndexShare: the source's table, the same rows; the fixture has none
      const int64_t src = c.indexer_source(L);
      EXPECT_TRUE(src < L && !c.indexer_shared(src)) << GetParam() << " layer " << L;
      EXPECT_EQ(f.count("layer" + std::to_string(L) + ".topk"), 0u) << GetParam() << " layer " << L;
      EXPECT_EQ(topk[L].to_vector<int32_t>(), topk[src].to_vector<int32_t>()) << GetParam() << " layer " << L;
    } else {
      expect_same_selection(f, topk[L], L, b, s, K);
    }
    const std::string routed = "layer" + std::to_string(L) + ".experts";
    ASSERT_EQ(c.is_moe_layer(L), f.count(routed) > 0) << GetParam() << " layer " << L;
    if (!c.is_moe_layer(L)) continue;
    std::vector<int32_t> chosen = experts[L].to_vector<int32_t>();
    const int64_t k = experts[L].size(1);
    for (int64_t r = 0; r < b * s; ++r) std::sort(chosen.begin() + r * k, chosen.begin() + (r + 1) * k);
    EXPECT_EQ(chosen, f.at(routed).to_vector<int32_t>()) << GetParam() << " layer " << L << ": the chosen experts";
  }

  // Saved by hmla (as save_final_model writes it), the checkpoint holds what transformers saved.
  const std::string out = ::testing::TempDir() + "hf_fixture_" + GetParam();
  std::filesystem::create_directories(out);
  io::save_safetensors(out + "/model.safetensors", m.params, {{"format", "pt"}}, m.kept);
  save_model_config(out + "/config.json", m.cfg);
  const io::TensorMap back = io::load_checkpoint_tensors(out);
  ASSERT_EQ(back.size(), w.size()) << GetParam();
  for (const auto& [name, t] : w) {
    ASSERT_TRUE(back.count(name)) << GetParam() << ": hmla did not write '" << name << "'";
    EXPECT_EQ(back.at(name).shape(), t.shape()) << name;
    EXPECT_EQ(back.at(name).dtype(), t.dtype()) << name;
  }
  const ModelConfig again = load_model_config(out + "/config.json");
  EXPECT_EQ(again.family, c.family);
  EXPECT_EQ(again.indexer_types, c.indexer_types);
  EXPECT_EQ(io::load_json(out + "/config.json").value("model_type", ""), io::load_json(dir + "/config.json").value("model_type", ""));
}

INSTANTIATE_TEST_SUITE_P(Cases, HfFixture, ::testing::Values("dense", "sparse", "yarn", "moe", "glm"));

}  // namespace
}  // namespace hmla
