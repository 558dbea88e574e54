// The DSA programme's modes on a V4 stack's CSA layers (DESIGN.md section 10's table;
// docs/csa_indexer_kl.md), on the V4-Flash-like tiny stack (configs/deepseek_v4_tiny.json: sliding,
// CSA, HCA, CSA; a hash layer) with random weights and packed documents:
// - mha and mqa_full_causal: a CSA layer attends every visible entry, no indexer runs;
// - dsa_warmup: the same forward and main-path gradients as mha bit for bit, the indexers trained
//   by the dense CSA KL, and the indexer-only step (the backbone frozen) gives the same indexer
//   gradients and nothing else;
// - dsa_sparse: the indexer's top-k, its KL over the selection;
// - the indexer's gradient is the gradient of coeff x the logged KL (central differences).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "hf_fixture.h"
#include "hmla/core/layout.h"
#include "hmla/model/model.h"
#include "hmla/model/v4_tables.h"
#include "testing.h"

namespace hmla {
namespace {

const std::string kFlash = std::string(HMLA_SOURCE_DIR) + "/configs/deepseek_v4_tiny.json";

ModelConfig in_mode(LayerMode mode) {
  ModelConfig c = load_model_config(kFlash, LayerModesFrom::programme);
  set_all_modes(c, mode);
  return c;
}

// Two rows of packed documents (a CSA window straddles no boundary), row 1 ending in padding.
Batch packed(const ModelConfig& c) {
  const int64_t b = 2, s = 64;
  const std::vector<float> r = testing::randn(size_t(b * s), 17);
  std::vector<int32_t> ids;
  for (float x : r) ids.push_back(int32_t(3 + std::abs(int64_t(x * 1000)) % (c.vocab_size - 3)));
  for (int64_t t = 58; t < s; ++t) ids[size_t(s + t)] = int32_t(c.pad_token_id);
  Batch batch;
  batch.input_ids = Tensor::from_vector<int32_t>({b, s}, ids);
  batch.layout = layout_from_cu_seqlens(s, {{0, 27, 64}, {0, 37, 58}});
  return batch;
}

// The stack in `mode` with the same weights in every mode (seed 5; the CSA indexers included).
Model model(LayerMode mode) {
  const ModelConfig c = in_mode(mode);
  Model m = build_model(c, v4_indexer_layers(c));
  init_model(m, 5);
  return m;
}

struct Step {
  std::vector<float> logits;
  StepStats st;
  std::map<std::string, std::vector<float>> grads;
};

Step step(const Model& m, const Batch& batch, bool backbone = true) {
  Step r;
  r.logits = model_logits(m, batch).to_vector<float>();
  const Tensor garena = Tensor::zeros({m.arena.numel()}, DType::f32);
  io::TensorMap g = arena_views(m.table, garena);
  StepOptions o;
  o.backbone = backbone;
  r.st = model_step(m, batch, o, g);
  for (const auto& [name, t] : g) r.grads[name] = t.to_vector<float>();
  return r;
}

bool csa_indexer(const std::string& name) { return name.find(".attn.indexer.") != std::string::npos; }
bool nonzero(const std::vector<float>& v) {
  for (float x : v)
    if (x != 0.f) return true;
  return false;
}

// dsa_warmup is mha on the main path, bit for bit (a warmup that attended the top-k, or whose KL
// leaked a gradient into q, the entries or x, fails); mha trains no indexer and logs no KL, warmup
// trains every CSA indexer tensor and logs the CSA kind's KL; mqa_full_causal is mha on a stack
// without hybrid_mla layers (CSA dense in both).
TEST(V4Csa, DsaWarmupIsMhaOnTheMainPathBitForBit) {
  const Batch batch = packed(in_mode(LayerMode::mha));
  const Step mha = step(model(LayerMode::mha), batch), warm = step(model(LayerMode::dsa_warmup), batch),
             mqa = step(model(LayerMode::mqa_full_causal), batch);
  EXPECT_EQ(warm.logits, mha.logits);
  EXPECT_EQ(mqa.logits, mha.logits);
  EXPECT_EQ(warm.st.lm_loss, mha.st.lm_loss);
  EXPECT_EQ(mha.st.indexer_kl, 0.0);
  EXPECT_TRUE(std::isnan(mha.st.indexer_kl_csa));
  EXPECT_GT(warm.st.indexer_kl_csa, 0.0);
  EXPECT_EQ(warm.st.indexer_kl, warm.st.indexer_kl_csa);  // no hybrid_mla layer: the only kind
  int trained = 0;
  for (const auto& [name, g] : mha.grads) {
    if (csa_indexer(name)) {
      EXPECT_FALSE(nonzero(g)) << name << ": mha trains no indexer";
      EXPECT_TRUE(nonzero(warm.grads.at(name))) << name << ": dsa_warmup's KL trains it";
      ++trained;
      continue;
    }
    EXPECT_EQ(warm.grads.at(name), g) << name;
    EXPECT_EQ(mqa.grads.at(name), g) << name;
  }
  EXPECT_EQ(trained, 2 * 6);  // two CSA layers: wq_b, weights_proj, the compressor's wkv, wgate, ape, norm
}

// The indexer-only step (dsa_warmup's: the backbone frozen, its backward skipped) gives the full
// step's indexer gradients bit for bit and no other gradient, and the same logged KL.
TEST(V4Csa, IndexerOnlyStepIsTheFullStepsIndexerPart) {
  const Model m = model(LayerMode::dsa_warmup);
  const Batch batch = packed(m.cfg);
  const Step full = step(m, batch), only = step(m, batch, false);
  EXPECT_EQ(only.st.indexer_kl, full.st.indexer_kl);
  EXPECT_EQ(only.st.lm_loss, full.st.lm_loss);
  for (const auto& [name, g] : only.grads) {
    if (csa_indexer(name)) EXPECT_EQ(g, full.grads.at(name)) << name;
    else EXPECT_FALSE(nonzero(g)) << name << " has a gradient in an indexer-only step";
  }
}

// dsa_sparse: the CSA layers attend their indexer's top-k (a different forward from the dense
// modes: the tiny stack's s = 64 gives 16 entries per document row against index_topk 8) and train
// the indexer by the KL over it.
TEST(V4Csa, DsaSparseSelectsAndTrainsTheIndexerByItsKl) {
  const Batch batch = packed(in_mode(LayerMode::mha));
  const Step mha = step(model(LayerMode::mha), batch), sparse = step(model(LayerMode::dsa_sparse), batch);
  EXPECT_NE(sparse.logits, mha.logits);
  EXPECT_GT(sparse.st.indexer_kl_csa, 0.0);
  std::vector<Tensor> topk;
  model_logits(model(LayerMode::dsa_sparse), batch, &topk);
  EXPECT_TRUE(topk.at(1).defined() && topk.at(3).defined());
  EXPECT_FALSE(topk.at(0).defined() || topk.at(2).defined());  // sliding, HCA: no selection
  std::vector<Tensor> dense;
  model_logits(model(LayerMode::dsa_warmup), batch, &dense);
  EXPECT_FALSE(dense.at(1).defined());  // warmup attends every visible entry: no table
  for (const auto& [name, g] : sparse.grads)
    if (csa_indexer(name)) EXPECT_TRUE(nonzero(g)) << name;
}

// The CSA indexer's gradient into weights_proj (the KL's op, then the head weights' two scales and
// the product with x) is the derivative of coeff x the logged KL: along a random direction v, g . v
// against central differences at h and 2h. I is linear in weights_proj, so the KL is smooth along v
// (no relu kink: relu acts on qI . kI); the difference of the two differences estimates the h^2
// truncation (fd_h's error is about a third of it), and f32 evaluation noise is below 1e-3 of
// g . v here (the KL's terms carry relative errors ~1e-6, the step moves the KL by ~1e-2 of itself).
// A chain that drops or doubles a scale, or reads the wrong input rows, is off by a factor. The
// other indexer tensors' chain (RoPE's transpose, the compressor's backward) is the attention's
// own, checked against transformers (test_v4_model.cpp) and by the KL falling in dsa_warmup.
TEST(V4Csa, IndexerGradientIsTheKlsDerivative) {
  Model m = model(LayerMode::dsa_warmup);
  const Batch batch = packed(m.cfg);
  const Step base = step(m, batch, false);
  const double coeff = m.cfg.indexer_loss_coeff;
  const std::string n = layer_prefix(1) + "attn.indexer.weights_proj.weight";
  const std::vector<float> v = testing::randn(base.grads.at(n).size(), 23, 0.02f), w0 = m.params.at(n).to_vector<float>();
  double gv = 0;
  for (size_t i = 0; i < v.size(); ++i) gv += double(base.grads.at(n)[i]) * double(v[i]);
  // The KL of the stack's two CSA layers is the logged mean times 2; only layer 1's moves.
  auto kl_at = [&](double h) {
    std::vector<float> w = w0;
    for (size_t i = 0; i < w.size(); ++i) w[i] = float(double(w[i]) + h * double(v[i]));
    m.params.at(n).copy_from(Tensor::from_vector<float>(m.params.at(n).shape(), w));
    return 2 * coeff * step(m, batch, false).st.indexer_kl;
  };
  const double h = 0.5;
  const double fd1 = (kl_at(h) - kl_at(-h)) / (2 * h), fd2 = (kl_at(2 * h) - kl_at(-2 * h)) / (4 * h);
  std::printf("g.v %.9g, central differences %.9g (h) %.9g (2h)\n", gv, fd1, fd2);
  EXPECT_GT(std::abs(gv), 0.0);
  EXPECT_LE(std::abs(gv - fd1), std::abs(fd2 - fd1) + 1e-3 * std::abs(gv));
}

}  // namespace
}  // namespace hmla
