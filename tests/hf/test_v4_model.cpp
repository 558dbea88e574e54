// The DeepSeek-V4 model (hmla/model/v4_model.h) against transformers 5.24 on the v4 fixture
// (tests/hf/make_v4_fixtures.py: a tiny model with every layer kind, hash and learned MoE, nonzero
// biases and sinks, YaRN on the compress RoPE, s = 36 several times the window 4 and the rates 4
// and 8, index_topk 3 below the visible entries): the checkpoint loaded as transformers saved it,
// then
// - the logits against transformers' float64 (logits_hi + lo), each CSA layer's top-k and each MoE
//   layer's experts equal;
// - the LM loss and every parameter's gradient against transformers' float64 autograd (grads of
//   the mean CE over the b (s - 1) next tokens); the indexer's parameters get exactly zero.
// Tolerances by STYLE.md's rule: twice the f32 model's error on the same tensor (logits_f32, or
// NAME_f32err for a gradient: transformers run in f32, the naive instance) plus 8 ulps of the
// tensor's largest value. The issue's own criterion for the logits (1e-4 of max|logits|) is
// checked as well.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "v4_fixture.h"

namespace hmla {
namespace {

const std::string kDir = testing::kV4Dir;
using testing::joined;
using Fixture = testing::V4Fixture;

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

TEST(V4Model, LogitsTopkAndExpertsMatchTransformers) {
  Fixture fx;
  std::vector<Tensor> topk, experts;
  const Tensor logits = model_logits(fx.m, fx.batch, &topk, Comm::self(), &experts);
  const std::vector<double>& ref = fx.ref;
  const std::vector<float> got = logits.to_vector<float>();
  ASSERT_EQ(got.size(), ref.size());
  double err = 0;
  for (size_t i = 0; i < ref.size(); ++i) err = std::max(err, std::abs(double(got[i]) - ref[i]));
  const double mag = max_abs(ref);
  std::printf("logits: max error %.3g, bound %.3g, max|logits| %.3g\n", err, fx.bound, mag);
  EXPECT_LE(err, fx.bound);
  EXPECT_LE(err, 1e-4 * mag);
  const ModelConfig& c = fx.c;
  const int64_t b = fx.batch.input_ids.size(0), s = fx.batch.input_ids.size(1);
  int csa = 0;
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) {
    const std::string key = "layer" + std::to_string(L) + ".topk";
    if (c.v4.layer_types[size_t(L)] != V4Kind::csa) {
      EXPECT_FALSE(topk[size_t(L)].defined()) << L;
      continue;
    }
    ++csa;
    const Tensor want = fx.F.at(key);  // [b, s, min(K, T)] i32, descending score, -1 pads
    ASSERT_TRUE(topk[size_t(L)].defined()) << L;
    const std::vector<int32_t> g = topk[size_t(L)].to_vector<int32_t>(), w = want.to_vector<int32_t>();
    const int64_t K = c.index_topk, kw = want.size(2);
    ASSERT_EQ(topk[size_t(L)].numel(), b * s * K);
    for (int64_t r = 0; r < b * s; ++r) {  // sets: ties inside the top-k may order either way
      std::set<int32_t> gs(g.begin() + r * K, g.begin() + (r + 1) * K), ws(w.begin() + r * kw, w.begin() + (r + 1) * kw);
      gs.erase(-1), ws.erase(-1);
      EXPECT_EQ(gs, ws) << "layer " << L << " row " << r;
    }
  }
  EXPECT_EQ(csa, 2);
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) {
    const Tensor want = fx.F.at("layer" + std::to_string(L) + ".experts");  // [b s, k], each row ascending
    std::vector<int32_t> g = experts[size_t(L)].to_vector<int32_t>();
    const std::vector<int32_t> w = want.to_vector<int32_t>();
    const int64_t k = c.moe.num_experts_per_tok;
    ASSERT_EQ(g.size(), w.size());
    for (size_t r = 0; r < g.size(); r += size_t(k)) std::sort(g.begin() + long(r), g.begin() + long(r + size_t(k)));
    EXPECT_EQ(g, w) << "layer " << L;
  }
}

// Packed documents (DESIGN.md section 10): a row holding two documents and tail padding gives each
// document's rows the logits, CSA selections and experts of that document run alone. The
// documents' lengths (13 and 19 of 36 rows) are off the rates (4, 8) and the window (4), so a
// compressor window, a CSA a-slot or a sliding window crossing the boundary changes the second
// document. Bound: both runs are f32 evaluations of the same function (the RoPE angles differ by
// the document's offset, which the relative rotation cancels exactly in real arithmetic), each
// within the fixture's rule B = 2 e_f32 + 8 ulp max|logits| of the exact values, so 2 B apart.
TEST(V4Model, PackedDocumentsEqualTheDocumentsAlone) {
  Fixture fx;
  const int64_t s = fx.batch.input_ids.size(1), V = fx.c.vocab_size, a = 13, b = 19;
  const std::vector<int32_t> ids = fx.batch.input_ids.to_vector<int32_t>();
  Batch packed;
  std::vector<int32_t> row(ids.begin(), ids.begin() + s);
  for (int64_t t = a + b; t < s; ++t) row[size_t(t)] = int32_t(fx.c.pad_token_id);
  packed.input_ids = Tensor::from_vector<int32_t>({1, s}, row);
  packed.layout = layout_from_cu_seqlens(s, {{0, a, a + b}});
  std::vector<Tensor> ptopk, pexp;
  const std::vector<float> pl = model_logits(fx.m, packed, &ptopk, Comm::self(), &pexp).to_vector<float>();
  const double B = fx.bound;
  double worst = 0;
  for (auto [start, len] : {std::pair<int64_t, int64_t>{0, a}, {a, b}}) {
    Batch alone;
    alone.input_ids = Tensor::from_vector<int32_t>({1, len}, std::vector<int32_t>(row.begin() + start, row.begin() + start + len));
    alone.layout = layout_causal(1, len);
    std::vector<Tensor> topk, exp;
    const std::vector<float> l = model_logits(fx.m, alone, &topk, Comm::self(), &exp).to_vector<float>();
    for (int64_t t = 0; t < len; ++t)
      for (int64_t v = 0; v < V; ++v)
        worst = std::max(worst, std::abs(double(l[size_t(t * V + v)]) - double(pl[size_t((start + t) * V + v)])));
    const int64_t K = fx.c.index_topk, k = fx.c.moe.num_experts_per_tok;
    for (int64_t L = 0; L < fx.c.num_hidden_layers; ++L) {
      const std::vector<int32_t> e = exp[size_t(L)].to_vector<int32_t>(), pe = pexp[size_t(L)].to_vector<int32_t>();
      EXPECT_TRUE(std::equal(e.begin(), e.end(), pe.begin() + start * k)) << "layer " << L << " experts, doc at " << start;
      if (!ptopk[size_t(L)].defined()) continue;  // a sliding or HCA layer
      const std::vector<int32_t> pg = ptopk[size_t(L)].to_vector<int32_t>();
      const std::vector<int32_t> g = topk[size_t(L)].defined() ? topk[size_t(L)].to_vector<int32_t>()
                                                                : std::vector<int32_t>(size_t(len * K), -1);  // no entries
      for (int64_t t = 0; t < len; ++t) {  // entry indices count from the row's first entry: compare sets of
        std::set<int32_t> x, y;           // entries by their rank within the document
        for (int64_t j = 0; j < K; ++j) x.insert(g[size_t(t * K + j)]), y.insert(pg[size_t((start + t) * K + j)]);
        x.erase(-1), y.erase(-1);
        const int32_t first = start == 0 ? 0 : int32_t(a / fx.c.v4.compress_rate(L));
        std::set<int32_t> ys;
        for (int32_t e2 : y) ys.insert(e2 - first);
        EXPECT_EQ(x, ys) << "layer " << L << " row " << start + t;
      }
    }
  }
  std::printf("packed vs alone: max |logits difference| %.3g, bound 2 B = %.3g\n", worst, 2 * B);
  EXPECT_LE(worst, 2 * B);
}

// A gradient's group: its layer (model.layers.L.), else the model-wide tensors.
std::string group_of(const std::string& name) {
  if (!name.starts_with("model.layers.")) return "model";
  return name.substr(0, name.find('.', std::string("model.layers.").size()) + 1);
}

TEST(V4Model, LossAndEveryGradientMatchTransformersFloat64) {
  Fixture fx;
  const io::TensorMap G = io::load_safetensors(kDir + "v4_grads/grads.safetensors");
  const int64_t b = fx.batch.input_ids.size(0), s = fx.batch.input_ids.size(1);
  ASSERT_EQ(count_lm_targets(fx.batch, fx.c.pad_token_id), b * (s - 1));  // transformers' targets
  const Tensor garena = Tensor::zeros({fx.m.arena.numel()}, DType::f32);
  io::TensorMap grads = arena_views(fx.m.table, garena);
  // The CSA layers run dsa_sparse (transformers' top-k), whose KL trains their indexers; transformers
  // trains none, so the KL's coefficient is 0 here: its gradient is then exactly 0 (test_v4_csa.cpp
  // checks the KL's own gradient).
  fx.m.cfg.indexer_loss_coeff = 0;
  const StepStats st = model_step(fx.m, fx.batch, StepOptions{}, grads);
  const double loss = joined(G, "loss")[0], loss_f32err = std::abs(double(G.at("loss_f32").to_vector<float>()[0]) - loss);
  EXPECT_NEAR(st.lm_loss, loss, 2 * loss_f32err + 8 * 0x1p-23 * loss);
  std::printf("loss %.9g, transformers float64 %.9g\n", st.lm_loss, loss);
  // The naive instance's error on one small tensor can be lucky (a scalar such as hc_scale's
  // gradient is a sum of terms that cancel to a few per cent of their size); what a gradient's
  // error is made of is the gradient reaching its layer, which every tensor of the layer shares.
  // So the rule's naive error and magnitude are the group's largest (a layer, or the model-wide
  // tensors), as the twin's check (tests/python/v4_twin_check.py) groups them.
  std::map<std::string, std::pair<double, double>> group;  // -> (largest f32 error, largest |gradient|)
  for (const ParamSpec& p : fx.m.table) {
    if (!G.count(p.name + "_hi")) continue;
    auto& [e, mag] = group[group_of(p.name)];
    e = std::max(e, double(G.at(p.name + "_f32err").to_vector<float>()[0]));
    mag = std::max(mag, max_abs(joined(G, p.name)));
  }
  double worst = 0;
  std::string worst_name;
  int checked = 0, zero = 0;
  for (const ParamSpec& p : fx.m.table) {
    const std::vector<float> g = grads.at(p.name).to_vector<float>();
    if (!G.count(p.name + "_hi")) {  // no gradient in transformers: the indexer's, and the router bias (a buffer)
      EXPECT_TRUE(p.name.find(".indexer.") != std::string::npos || p.name.ends_with(".ffn.gate.bias"))
          << p.name << " has no gradient in the fixture";
      for (float v : g) ASSERT_EQ(v, 0.f) << p.name;
      ++zero;
      continue;
    }
    const std::vector<double> ref = joined(G, p.name);
    ASSERT_EQ(g.size(), ref.size()) << p.name;
    double err = 0;
    for (size_t i = 0; i < ref.size(); ++i) err = std::max(err, std::abs(double(g[i]) - ref[i]));
    const auto [gerr, gmag] = group.at(group_of(p.name));
    const double bound = 2 * gerr + 8 * 0x1p-23 * gmag;
    EXPECT_LE(err, bound) << p.name;
    if (err / bound > worst) worst = err / bound, worst_name = p.name;
    ++checked;
  }
  std::printf("%d gradients within the rule (worst %.3g of its bound: %s); %d tensors exactly 0 (indexers, router biases)\n",
              checked, worst, worst_name.c_str(), zero);
  EXPECT_GT(zero, 0);
}

}  // namespace
}  // namespace hmla
