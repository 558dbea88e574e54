// hmla's hybrid_mla layers inside DeepSeek-V4 stacks (DESIGN.md section 10; docs/deepseek_v4.md,
// "hybrid_mla layers"): the config (keys, legacy -2, the MTP entry, one-line errors), the parameter
// table and init, and the model against the float64 oracle (tests/python/v4_oracle.py's hybrid_mla
// layer, written from DESIGN.md; fixture tests/hf/fixtures/v4_hybrid by
// tests/python/v4_hybrid_fixture.py: layers [HCA, hybrid_mla, CSA, hybrid_mla], s = 36 several times
// the window 4 and hybrid_mla_index_topk 5), then DESIGN.md section 1's invariants inside the stack.
// Tolerances by STYLE.md's rule: twice the float32 instance's error on the same tensor (the oracle run
// with every op in float32; for a gradient the largest of its layer, as test_v4_model.cpp argues) plus
// 8 ulps of its largest value.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "v4_fixture.h"
#include "hmla/core/error.h"
#include "hmla/io/json_strict.h"
#include "hmla/model/decode.h"
#include "hmla/model/indexer.h"
#include "hmla/model/model.h"
#include "hmla/model/v4_tables.h"
#include "testing.h"
#include "v4_internal.h"

namespace hmla {
namespace {

using nlohmann::json;
using testing::joined;

const std::string kDir = std::string(HMLA_SOURCE_DIR) + "/tests/hf/fixtures/v4_hybrid/";
const std::string kTiny = std::string(HMLA_SOURCE_DIR) + "/configs/deepseek_v4_tiny_hybrid.json";
constexpr double kUlp = 0x1p-23;

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// The config with the hybrid layers in `mode`, the CSA layers over their indexer's top-k as the
// oracle computes them (dsa_sparse), the others mha.
ModelConfig in_mode(ModelConfig c, LayerMode mode) {
  for (int64_t L = 0; L < c.num_hidden_layers; ++L)
    c.layer_modes[size_t(L)] = c.v4.is_hybrid_mla(L)                  ? mode
                               : c.v4.layer_types[size_t(L)] == V4Kind::csa ? LayerMode::dsa_sparse
                                                                            : LayerMode::mha;
  return c;
}

// The layers with an indexer: the CSA layers, and the hybrid ones where `hybrid`.
std::vector<bool> indexers(const ModelConfig& c, bool hybrid) {
  std::vector<bool> h;
  for (int64_t L = 0; L < c.num_hidden_layers; ++L)
    h.push_back(c.v4.layer_types[size_t(L)] == V4Kind::csa || (hybrid && c.v4.is_hybrid_mla(L)));
  return h;
}
std::vector<bool> hybrid_layers(const ModelConfig& c) { return indexers(c, true); }

// The oracle's fixture: config, weights (the hybrid layers' indexers included), input_ids.
struct Fixture {
  ModelConfig c = load_model_config(kDir + "config.json");
  io::TensorMap F = io::load_safetensors(kDir + "fixture.safetensors");
  io::TensorMap w = io::load_safetensors(kDir + "model.safetensors");
  Batch batch;
  Fixture() {
    batch = testing::causal_batch(F.at("input_ids"));
  }
  Model model(LayerMode mode) const {
    Model m = build_model(in_mode(c, mode), hybrid_layers(c));
    load_into_model(m, w, "v4_hybrid fixture");
    return m;
  }
  double bound(const std::string& name) const { return testing::fixture_f32_bound(F, name); }
};

struct StepResult {
  std::vector<float> logits;
  StepStats st;
  std::map<std::string, std::vector<float>> grads;
};

StepResult step(const Model& m, const Batch& batch) {
  StepResult r;
  r.logits = model_logits(m, batch).to_vector<float>();
  const Tensor garena = Tensor::zeros({m.arena.numel()}, DType::f32);
  io::TensorMap g = arena_views(m.table, garena);
  r.st = model_step(m, batch, StepOptions{}, g);
  for (const auto& [name, t] : g) r.grads[name] = t.to_vector<float>();
  return r;
}

double max_err(const std::vector<float>& got, const std::vector<double>& ref) {
  EXPECT_EQ(got.size(), ref.size());
  double e = 0;
  for (size_t i = 0; i < std::min(got.size(), ref.size()); ++i) e = std::max(e, std::abs(double(got[i]) - ref[i]));
  return e;
}

bool is_indexer(const std::string& name) { return name.find(".self_attn.indexer.") != std::string::npos; }
// A CSA layer's indexer: trained by its own KL in dsa_sparse (the oracle has none; tests/hf/test_v4_csa.cpp
// checks it), so out of these comparisons.
bool csa_indexer(const std::string& name) { return name.find(".attn.indexer.") != std::string::npos; }

std::string group_of(const std::string& name) {
  if (!name.starts_with("model.layers.")) return "model";
  return name.substr(0, name.find('.', std::string("model.layers.").size()) + 1);
}

// Every gradient of `r` against the fixture's `mode` gradients (fixture name "mode.grad.NAME"),
// those `which` accepts; the rule's naive error and magnitude the group's largest (test_v4_model.cpp).
// Returns the worst err / bound.
double expect_grads(const Fixture& fx, const StepResult& r, const std::string& mode,
                    bool (*which)(const std::string&)) {
  std::map<std::string, std::pair<double, double>> group;  // -> (largest f32 error, largest |gradient|)
  for (const auto& [name, g] : r.grads) {
    const std::string key = mode + ".grad." + name;
    if (!which(name) || csa_indexer(name) || !fx.F.count(key + "_hi")) continue;
    auto& [e, mag] = group[group_of(name)];
    e = std::max(e, double(fx.F.at(key + "_f32err").to_vector<float>()[0]));
    mag = std::max(mag, max_abs(joined(fx.F, key)));
  }
  double worst = 0;
  std::string worst_name;
  int checked = 0;
  for (const auto& [name, g] : r.grads) {
    if (!which(name) || csa_indexer(name)) continue;
    const std::string key = mode + ".grad." + name;
    if (!fx.F.count(key + "_hi")) {  // the router biases (no gradient) only
      EXPECT_TRUE(name.ends_with(".ffn.gate.bias")) << mode << ": the fixture has no gradient of " << name;
      continue;
    }
    const auto [gerr, gmag] = group.at(group_of(name));
    // The rounding term scales with what enters (STYLE.md): a weight's gradient sums the batch's N
    // rows, which a sequential f32 sum (the built-in sgemm, hmla's CPU without BLAS) rounds about
    // sqrt(N) times where the oracle's f32 run (torch's blocked sums) rounds a few times; the terms
    // are bounded by the group's largest gradient. Without BLAS, 8 ulp alone measured 1.15 of the
    // bound (layer 0's wq_a); a wrong chain is off by O(1) of the gradient.
    const double rows = double(fx.batch.input_ids.numel());
    const double bound = 2 * gerr + 8 * kUlp * gmag * std::sqrt(rows), err = max_err(g, joined(fx.F, key));
    EXPECT_LE(err, bound) << mode << ": " << name;
    if (err / bound > worst) worst = err / bound, worst_name = name;
    ++checked;
  }
  std::printf("%s: %d gradients within the rule (worst %.3g of its bound: %s)\n", mode.c_str(), checked, worst,
              worst_name.c_str());
  EXPECT_GT(checked, 0);
  return worst;
}

bool backbone(const std::string& n) { return !is_indexer(n); }
bool indexer_only(const std::string& n) { return is_indexer(n); }
bool every(const std::string&) { return true; }

// --- the config --------------------------------------------------------------------------------

json tiny_json() { return io::load_json(kTiny); }

void expect_config_error(const json& j, const std::string& needle) {
  try {
    parse_model_config(j, "cfg");
    ADD_FAILURE() << "accepted: " << needle;
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(needle), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

TEST(V4Hybrid, ConfigReadsWritesAndRefusesInOneLine) {
  const ModelConfig c = load_model_config(kTiny);
  ASSERT_EQ(c.v4.layer_types[1], V4Kind::hybrid_mla);
  EXPECT_TRUE(c.v4.has_hybrid_mla());
  EXPECT_EQ(c.v4.compress_rate(1), 0);
  EXPECT_EQ(c.v4.hybrid.num_attention_heads, 4);
  EXPECT_EQ(c.v4.hybrid.index_topk, 16);
  // The derived config the MLA layer runs with.
  const ModelConfig h = hybrid_mla_config(c, 3);
  EXPECT_EQ(h.num_attention_heads, 4);
  EXPECT_EQ(h.q_lora_rank, 64);
  EXPECT_EQ(h.kv_lora_rank, 32);
  EXPECT_EQ(h.qk_nope_head_dim, 16);
  EXPECT_EQ(h.qk_rope_head_dim, 8);
  EXPECT_EQ(h.v_head_dim, 16);
  EXPECT_EQ(h.index_topk, 16);
  EXPECT_EQ(h.index_window, c.v4.sliding_window);  // the forced window
  EXPECT_TRUE(h.attention_sink);
  EXPECT_EQ(h.index_n_heads, c.index_n_heads);
  EXPECT_EQ(h.index_head_dim, c.index_head_dim);
  EXPECT_EQ(h.rope.theta, c.rope.theta);               // the main RoPE
  EXPECT_THROW(hybrid_mla_config(c, 2), ConfigError);  // a CSA layer
  // hmla's write reads back the same, and is a fixed point; it keeps the geometry.
  const json w = model_config_to_json(c);
  EXPECT_EQ(w["layer_types"][1], "hybrid_mla");
  EXPECT_EQ(w["hybrid_mla_kv_lora_rank"], 32);
  EXPECT_EQ(model_config_to_json(parse_model_config(w, "back")), w);
  // Legacy compress_ratios: -2 is hybrid_mla, for the MTP layer's entry too.
  json j = tiny_json();
  j.erase("layer_types");
  j["compress_ratios"] = {128, -2, 4, -2, -2};
  j["num_nextn_predict_layers"] = 1;
  const ModelConfig r = parse_model_config(j, "ratios");
  EXPECT_EQ(r.v4.layer_types, c.v4.layer_types);
  ASSERT_EQ(r.v4.mtp_types.size(), 1u);
  EXPECT_EQ(r.v4.mtp_types[0], V4Kind::hybrid_mla);
  EXPECT_EQ(model_config_to_json(r)["layer_types"].size(), 5u);  // the MTP layer's kind written back
  // An MTP entry alone makes the geometry required.
  json m = tiny_json();
  m["layer_types"] = {"heavily_compressed_attention", "sliding_attention", "compressed_sparse_attention",
                      "sliding_attention", "hybrid_mla"};
  m["num_nextn_predict_layers"] = 1;
  EXPECT_TRUE(parse_model_config(m, "mtp").v4.has_hybrid_mla());
  m.erase("hybrid_mla_v_head_dim");
  expect_config_error(m, "hybrid_mla_v_head_dim is required");
  // One-line errors naming the field.
  auto with = [](const char* k, json v) {
    json t = tiny_json();
    if (v.is_null())
      t.erase(k);
    else
      t[k] = v;
    return t;
  };
  expect_config_error(with("hybrid_mla_num_attention_heads", nullptr), "hybrid_mla_num_attention_heads is required");
  expect_config_error(with("hybrid_mla_qk_rope_head_dim", 7), "hybrid_mla_qk_rope_head_dim = 7 is odd");
  expect_config_error(with("hybrid_mla_qk_rope_head_dim", 40), "index_head_dim = 32");
  expect_config_error(with("hybrid_mla_q_lora_rank", 0), "hybrid_mla_q_lora_rank = 0");
  expect_config_error(with("hybrid_mla_index_topk", 0), "hybrid_mla_index_topk = 0");
  expect_config_error(with("index_window", 3), "index_window = 3");
  expect_config_error(with("attention_sink", false), "attention_sink = false");
  json bad = tiny_json();
  bad.erase("layer_types");
  bad["compress_ratios"] = {128, -3, 4, -2};
  expect_config_error(bad, "compress_ratios[1] = -3");
  // Modes: any, on every layer (the CSA and hybrid layers follow theirs, DESIGN.md section 10).
  json modes = tiny_json();
  modes["hmla_layer_modes"] = {"mha", "dsa_sparse", "dsa_warmup", "dsa_warmup"};
  EXPECT_EQ(parse_model_config(modes, "modes").layer_modes[1], LayerMode::dsa_sparse);
  EXPECT_EQ(parse_model_config(modes, "modes").layer_modes[2], LayerMode::dsa_warmup);
}

// --- the table and init ------------------------------------------------------------------------

// Names are the same in every mode but for the hybrid layers' five indexer tensors (DESIGN.md
// section 1); the hybrid layers' attention is self_attn.* in DESIGN.md section 2's names and shapes,
// with the sink, and no attn.*. Planted bug caught: a table that depends on the mode (a sink only in
// some modes, the indexer's tensors in mha).
TEST(V4Hybrid, TableNamesAreTheSameInEveryModeButTheIndexer) {
  const ModelConfig c = load_model_config(kTiny);
  const int64_t n = c.num_hidden_layers;
  std::map<LayerMode, std::set<std::string>> names;
  for (LayerMode mode : {LayerMode::mha, LayerMode::mqa_full_causal, LayerMode::dsa_warmup, LayerMode::dsa_sparse}) {
    const std::vector<bool> idx = indexers(c, is_dsa(mode));
    const Model m = build_model(in_mode(c, mode), idx);
    for (const ParamSpec& p : m.table) names[mode].insert(p.name);
    EXPECT_EQ(m.has_indexer, (std::vector<bool>{false, is_dsa(mode), true, is_dsa(mode)})) << mode_name(mode);
  }
  EXPECT_EQ(names[LayerMode::mha], names[LayerMode::mqa_full_causal]);
  EXPECT_EQ(names[LayerMode::dsa_warmup], names[LayerMode::dsa_sparse]);
  std::set<std::string> extra;
  std::set_difference(names[LayerMode::dsa_warmup].begin(), names[LayerMode::dsa_warmup].end(),
                      names[LayerMode::mha].begin(), names[LayerMode::mha].end(), std::inserter(extra, extra.end()));
  std::set<std::string> want;
  for (int L : {1, 3})
    for (const char* t : {"wq_b.weight", "wk.weight", "k_norm.weight", "k_norm.bias", "weights_proj.weight"})
      want.insert(layer_prefix(L) + "self_attn.indexer." + t);
  EXPECT_EQ(extra, want);
  EXPECT_TRUE(std::includes(names[LayerMode::dsa_warmup].begin(), names[LayerMode::dsa_warmup].end(),
                            names[LayerMode::mha].begin(), names[LayerMode::mha].end()));
  // Layer 1's attention: the MLA names and shapes, nothing of V4's attn.*.
  const Model m = build_model(in_mode(c, LayerMode::mha), indexers(c, false));
  std::map<std::string, Shape> l1;
  for (const ParamSpec& p : m.table)
    if (p.name.starts_with(layer_prefix(1)) && !p.name.starts_with(layer_prefix(1) + "ffn.")) l1[p.name] = p.shape;
  const std::string a = layer_prefix(1) + "self_attn.";
  const std::map<std::string, Shape> want1 = {
      {a + "q_a_proj.weight", {64, 128}},    {a + "q_a_layernorm.weight", {64}},
      {a + "q_b_proj.weight", {4 * 24, 64}}, {a + "kv_a_proj_with_mqa.weight", {40, 128}},
      {a + "kv_a_layernorm.weight", {32}},   {a + "kv_b_proj.weight", {4 * 32, 32}},
      {a + "o_proj.weight", {128, 64}},      {a + "softmax_offset", {4}}};
  for (const auto& [name, shape] : want1) EXPECT_EQ(l1.count(name) ? l1.at(name) : Shape{}, shape) << name;
  for (const auto& [name, shape] : l1) EXPECT_TRUE(want1.count(name) || !name.starts_with(a)) << "unexpected " << name;
  for (const auto& [name, shape] : l1) EXPECT_EQ(name.find(".attn."), std::string::npos) << name;
  // The memory plan counts the table.
  MemoryPlan plan;
  plan_parameters(plan, c, hybrid_layers(c), false, DType::f32);
  EXPECT_EQ(plan.items().front().bytes, 4 * table_numel(model_param_table(c, hybrid_layers(c))));
}

// init_model: the hybrid layers' MLA tensors as the MLA model's (N(0, initializer_range) matrices,
// ones for the norms, 0 for the sink; the indexer's k_norm 1 and 0).
TEST(V4Hybrid, InitIsTheMlaModels) {
  const ModelConfig c = in_mode(load_model_config(kTiny), LayerMode::dsa_warmup);
  Model m = build_model(c, hybrid_layers(c));
  init_model(m, 7);
  const std::string a = layer_prefix(1) + "self_attn.";
  for (const char* ones : {"q_a_layernorm.weight", "kv_a_layernorm.weight", "indexer.k_norm.weight"})
    for (float v : m.params.at(a + ones).to_vector<float>()) ASSERT_EQ(v, 1.f) << ones;
  for (const char* zeros : {"softmax_offset", "indexer.k_norm.bias"})
    for (float v : m.params.at(a + zeros).to_vector<float>()) ASSERT_EQ(v, 0.f) << zeros;
  for (const char* mat : {"q_b_proj.weight", "kv_b_proj.weight", "o_proj.weight", "indexer.wq_b.weight"}) {
    const std::vector<float> v = m.params.at(a + mat).to_vector<float>();
    double ss = 0;
    for (float x : v) ss += double(x) * x;
    const double sd = std::sqrt(ss / double(v.size()));
    EXPECT_NEAR(sd, c.initializer_range, 0.15 * c.initializer_range) << mat;  // >= 2048 draws: ~2% off
  }
}

// --- the model against the oracle ----------------------------------------------------------------

TEST(V4Hybrid, LogitsLossKlAndEveryGradientMatchTheOracle) {
  Fixture fx;
  const int64_t b = fx.batch.input_ids.size(0), s = fx.batch.input_ids.size(1);
  for (LayerMode mode : {LayerMode::mha, LayerMode::dsa_warmup, LayerMode::dsa_sparse}) {
    const std::string M = mode_name(mode);
    const Model m = fx.model(mode);
    const StepResult r = step(m, fx.batch);
    const double lerr = max_err(r.logits, joined(fx.F, M + ".logits")), lb = fx.bound(M + ".logits");
    std::printf("%s: logits error %.3g, bound %.3g\n", M.c_str(), lerr, lb);
    EXPECT_LE(lerr, lb) << M;
    EXPECT_LE(std::abs(r.st.lm_loss - joined(fx.F, M + ".loss")[0]), fx.bound(M + ".loss")) << M;
    if (is_dsa(mode)) {  // StepStats::indexer_kl_hybrid: the mean over the hybrid layers of sum_t kl / valid_rows
      const std::vector<double> kl = joined(fx.F, M + ".kl");
      const double want = (kl[0] + kl[1]) / 2, err = std::abs(r.st.indexer_kl_hybrid - want);
      std::printf("%s: indexer_kl_hybrid %.9g, oracle %.9g (error %.3g, bound %.3g)\n", M.c_str(), r.st.indexer_kl_hybrid,
                  want, err, fx.bound(M + ".kl"));
      EXPECT_LE(err, fx.bound(M + ".kl")) << M;
    }
    // dsa_warmup's backbone gradients are mha's in the oracle (only its indexer's are stored).
    if (mode == LayerMode::dsa_warmup) {
      expect_grads(fx, r, "mha", backbone);
      expect_grads(fx, r, M, indexer_only);
    } else {
      expect_grads(fx, r, M, mode == LayerMode::mha ? backbone : every);
    }
    for (const auto& [name, g] : r.grads) {  // mha trains no indexer (the fixture's tensors are there, idle)
      if (mode != LayerMode::mha || !is_indexer(name)) continue;
      for (float v : g) ASSERT_EQ(v, 0.f) << name;
    }
  }
  // dsa_sparse's selections S(t): the first hybrid_mla_index_topk entries of each row's table.
  const Model m = fx.model(LayerMode::dsa_sparse);
  std::vector<Tensor> topk;
  model_logits(m, fx.batch, &topk);
  const int64_t K = fx.c.v4.hybrid.index_topk, W = fx.c.v4.sliding_window;
  for (int L : {1, 3}) {
    ASSERT_TRUE(topk[size_t(L)].defined()) << L;
    ASSERT_EQ(topk[size_t(L)].shape(), (Shape{b, s, K + W}));
    const std::vector<int32_t> got = topk[size_t(L)].to_vector<int32_t>(),
                               want = fx.F.at("dsa_sparse.selected." + std::to_string(L)).to_vector<int32_t>();
    for (int64_t row = 0; row < b * s; ++row) {
      std::set<int32_t> g(got.begin() + row * (K + W), got.begin() + row * (K + W) + K),
          w(want.begin() + row * K, want.begin() + (row + 1) * K);
      g.erase(-1), w.erase(-1);
      EXPECT_EQ(g, w) << "layer " << L << " row " << row;
      const int64_t t = row % s;  // then the window's keys ascending, -1 pads
      for (int64_t i = 0; i < W; ++i) {
        const int64_t j = t - std::min<int64_t>(t + 1, W) + 1 + i;
        EXPECT_EQ(got[size_t(row * (K + W) + K + i)], j <= t ? int32_t(j) : -1) << "layer " << L << " row " << row;
      }
    }
  }
}

// DESIGN.md section 1: mqa_full_causal equals mha up to reassociation, forward and every gradient.
// Bound: each is within the rule's B of the oracle's mha values (the same function), so 2 B apart.
// Planted bug caught: a wrong absorption in the latent form (W_kb or W_vb of the wrong head, a
// transposed W_kb), the latent core's scale 1/sqrt(Rkv + Dr) instead of the MLA one.
TEST(V4Hybrid, MqaFullCausalEqualsMhaWithinTheRule) {
  Fixture fx;
  const StepResult mha = step(fx.model(LayerMode::mha), fx.batch),
                   mqa = step(fx.model(LayerMode::mqa_full_causal), fx.batch);
  std::vector<double> ml(mha.logits.begin(), mha.logits.end());
  const double lerr = max_err(mqa.logits, ml), lb = 2 * fx.bound("mha.logits");
  std::printf("mqa_full_causal vs mha: logits %.3g, bound %.3g\n", lerr, lb);
  EXPECT_LE(lerr, lb);
  EXPECT_GT(lerr, 0);  // a different computation: not the mha path again
  EXPECT_LE(std::abs(mqa.st.lm_loss - mha.st.lm_loss), 2 * fx.bound("mha.loss"));
  std::map<std::string, std::pair<double, double>> group;
  for (const auto& [name, g] : mha.grads) {
    const std::string key = "mha.grad." + name;
    if (!fx.F.count(key + "_hi")) continue;
    auto& [e, mag] = group[group_of(name)];
    e = std::max(e, double(fx.F.at(key + "_f32err").to_vector<float>()[0]));
    mag = std::max(mag, max_abs(joined(fx.F, key)));
  }
  double worst = 0;
  for (const auto& [name, g] : mha.grads) {
    if (!fx.F.count("mha.grad." + name + "_hi")) continue;
    const auto [e, mag] = group.at(group_of(name));
    const double bound = 2 * (2 * e + 8 * kUlp * mag);
    const double err = max_err(mqa.grads.at(name), std::vector<double>(g.begin(), g.end()));
    EXPECT_LE(err, bound) << name;
    worst = std::max(worst, err / bound);
  }
  std::printf("mqa_full_causal vs mha: every gradient within 2 B (worst %.3g of its bound)\n", worst);
}

// A packed batch (two documents in a row, tail padding) of the tiny config at s = 64 > K + W, so
// dsa_sparse selects.
Batch packed_batch(const ModelConfig& c) {
  const int64_t b = 2, s = 64;
  const std::vector<float> r = testing::randn(size_t(b * s), 11);
  std::vector<int32_t> ids;
  for (float x : r) ids.push_back(int32_t(3 + std::abs(int64_t(x * 1000)) % (c.vocab_size - 3)));
  for (int64_t t = 60; t < s; ++t) ids[size_t(s + t)] = int32_t(c.pad_token_id);  // row 1's tail padding
  Batch batch;
  batch.input_ids = Tensor::from_vector<int32_t>({b, s}, ids);
  batch.layout = layout_from_cu_seqlens(s, {{0, 23, 64}, {0, 41, 60}});
  return batch;
}

Model tiny_model(LayerMode mode, uint64_t seed = 3) {
  const ModelConfig c = in_mode(load_model_config(kTiny), mode);
  Model m = build_model(c, hybrid_layers(c));  // the same tensors in every mode
  init_model(m, seed);
  for (auto& [name, t] : m.params)  // sinks and norms off their init, so a sink or norm mix-up shows
    if (name.ends_with("softmax_offset") || name.ends_with("layernorm.weight")) {
      std::vector<float> v = testing::randn(size_t(t.numel()), std::hash<std::string>{}(name), 0.5f);
      for (float& x : v) x += name.ends_with("weight") ? 1.f : 0.f;
      t.copy_from(Tensor::from_vector<float>(t.shape(), v));
    }
  return m;
}

// DESIGN.md section 1: dsa_warmup's logits and main-path gradients are bit-identical to mha's for
// the whole stack (it runs mha's core unchanged; the indexer reads detached inputs), and its
// indexer gets a gradient (from its KL) where mha's gets none. Planted bug caught: the indexer's
// gradient leaking into the backbone (cq or x not detached), warmup running the latent core, the KL
// coefficient applied to the LM gradient.
TEST(V4Hybrid, DsaWarmupIsMhaBitForBit) {
  const Model mha = tiny_model(LayerMode::mha), warm = tiny_model(LayerMode::dsa_warmup);
  const Batch batch = packed_batch(mha.cfg);
  const StepResult a = step(mha, batch), w = step(warm, batch);
  EXPECT_EQ(a.logits, w.logits);
  EXPECT_EQ(a.st.lm_loss, w.st.lm_loss);
  EXPECT_GT(w.st.indexer_kl, 0);
  int indexer = 0;
  for (const auto& [name, g] : a.grads) {
    if (is_indexer(name)) {
      for (float v : g) ASSERT_EQ(v, 0.f) << name;
      const std::vector<float>& wg = w.grads.at(name);
      EXPECT_TRUE(std::any_of(wg.begin(), wg.end(), [](float v) { return v != 0.f; })) << name;
      ++indexer;
      continue;
    }
    EXPECT_EQ(g, w.grads.at(name)) << name;
  }
  EXPECT_EQ(indexer, 10);
}

// dsa_sparse on the packed batch: each hybrid layer's table holds S(t) of its own document only,
// then its window (the last sliding_window keys of the document up to t), and a step runs.
TEST(V4Hybrid, DsaSparseSelectsInsideTheDocumentWithTheForcedWindow) {
  const Model m = tiny_model(LayerMode::dsa_sparse);
  const Batch batch = packed_batch(m.cfg);
  std::vector<Tensor> topk;
  model_logits(m, batch, &topk);
  const int64_t s = 64, K = m.cfg.v4.hybrid.index_topk, W = m.cfg.v4.sliding_window;
  const std::vector<int32_t> st = batch.layout.doc_start.to_vector<int32_t>();
  int selected = 0;
  for (int L : {1, 3}) {
    const std::vector<int32_t> t4 = topk[size_t(L)].to_vector<int32_t>();
    for (int64_t row = 0; row < 2 * s; ++row) {
      const int64_t t = row % s, start = st[size_t(row)];
      if (start > t) continue;  // padding
      const int64_t nwin = std::min<int64_t>(t - start + 1, W), ncand = std::max<int64_t>(t - start + 1 - W, 0);
      for (int64_t i = 0; i < K; ++i) {
        const int32_t j = t4[size_t(row * (K + W) + i)];
        if (i < std::min(K, ncand)) {
          EXPECT_TRUE(j >= start && j <= t - W) << "layer " << L << " row " << row << " entry " << i << ": " << j;
          ++selected;
        } else {
          EXPECT_EQ(j, -1);
        }
      }
      for (int64_t i = 0; i < W; ++i)
        EXPECT_EQ(t4[size_t(row * (K + W) + K + i)], i < nwin ? int32_t(t - nwin + 1 + i) : -1) << "row " << row;
    }
  }
  EXPECT_GT(selected, 0);
  const StepResult r = step(m, batch);
  EXPECT_TRUE(std::isfinite(r.st.lm_loss) && std::isfinite(r.st.indexer_kl) && r.st.indexer_kl > 0);
}

// A checkpoint of each mode loads into the later ones: mha's (no indexer) into mqa_full_causal
// (same logits within the rule's reassociation) and, with its indexers initialised as the trainer
// does, into dsa_warmup; dsa_warmup's (a trained indexer) into dsa_sparse, its indexer kept bit for
// bit. Planted bug caught: a mode-dependent name, an indexer re-initialised over a loaded one.
TEST(V4Hybrid, ACheckpointOfOneModeLoadsIntoALaterOne) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "hmla_v4_hybrid_ck";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "mha");
  std::filesystem::create_directories(dir / "warm");
  const ModelConfig c = load_model_config(kTiny);
  const int64_t n = c.num_hidden_layers;
  Model mha = build_model(in_mode(c, LayerMode::mha), indexers(c, false));
  init_model(mha, 5);
  save_model_weights((dir / "mha").string(), mha);
  const Batch batch = packed_batch(c);
  // -> mqa_full_causal
  const ModelConfig mqa_c = in_mode(c, LayerMode::mqa_full_causal);
  CheckpointTensors ck = read_checkpoint((dir / "mha").string(), mqa_c);
  Model mqa = build_model(mqa_c, indexers(c, false));
  load_checkpoint_into_model(mqa, std::move(ck), "mha checkpoint");
  const std::vector<float> la = model_logits(mha, batch).to_vector<float>(),
                           lq = model_logits(mqa, batch).to_vector<float>();
  double diff = 0, mag = 0;
  for (size_t i = 0; i < la.size(); ++i)
    diff = std::max(diff, double(std::abs(la[i] - lq[i]))), mag = std::max(mag, double(std::abs(la[i])));
  EXPECT_LE(diff, 1e-4 * mag);  // DESIGN.md section 7's equivalence check (f32: equivalence_rtol 1e-4)
  // -> dsa_warmup: the indexers are new (initialised from a seed, as the trainer's rebuild does)
  const ModelConfig warm_c = in_mode(c, LayerMode::dsa_warmup);
  Model warm = build_model(warm_c, hybrid_layers(c));
  std::vector<std::string> missing;
  for (int L : {1, 3}) {
    io::TensorMap w;
    indexer_init_missing(w, hybrid_mla_config(warm_c, L), 100 + uint64_t(L));
    for (const auto& [name, t] : w) {
      missing.push_back(layer_prefix(L) + "self_attn." + name);
      warm.params.at(missing.back()).copy_from(t);
    }
  }
  EXPECT_EQ(missing.size(), 10u);
  ck = read_checkpoint((dir / "mha").string(), warm_c);
  load_into_model(warm, ck.tensors, "mha checkpoint", missing);
  EXPECT_EQ(model_logits(warm, batch).to_vector<float>(), la);                               // warmup is mha
  warm.params.at(layer_prefix(1) + "self_attn.indexer.wk.weight").data<float>()[0] += 0.5f;  // "trained"
  save_model_weights((dir / "warm").string(), warm);
  // -> dsa_sparse: the checkpoint's indexers, as they were
  const ModelConfig sparse_c = in_mode(c, LayerMode::dsa_sparse);
  ck = read_checkpoint((dir / "warm").string(), sparse_c);
  const std::vector<bool> has = checkpoint_indexers(sparse_c, ck.tensors);
  EXPECT_EQ(has, (std::vector<bool>{false, true, true, true}));
  Model sparse = build_model(sparse_c, has);
  load_checkpoint_into_model(sparse, std::move(ck), "warm checkpoint");
  for (const auto& [name, t] : warm.params)
    EXPECT_EQ(t.to_vector<float>(), sparse.params.at(name).to_vector<float>()) << name;
  std::filesystem::remove_all(dir);
}

// --- the pieces around the step ------------------------------------------------------------------

// The V4 indexer-only step (StepOptions::backbone = false, the other V4 kinds' work) plugs in:
// the hybrid sublayer's backward without the backbone gives the indexer's gradient of the full
// backward bit for bit, touches no backbone gradient and returns the same KL sum.
TEST(V4Hybrid, IndexerOnlyBackwardIsTheFullOnesIndexerPart) {
  const Model m = tiny_model(LayerMode::dsa_warmup);
  const Batch batch = packed_batch(m.cfg);
  const int64_t b = 2, s = 64, D = m.cfg.hidden_size;
  const V4Tensors w = v4_tensors(m.params, m.cfg);
  const Tensor x = Tensor::from_vector<float>({b, s, D}, testing::randn(size_t(b * s * D), 21));
  const Tensor dy = Tensor::from_vector<float>({b * s, D}, testing::randn(size_t(b * s * D), 22));
  std::vector<float> rw(size_t(b * s), 1.f / float(b * s));
  const Tensor row_weight = Tensor::from_vector<float>({b, s}, rw);
  std::map<bool, std::map<std::string, std::vector<float>>> grads;
  std::map<bool, double> kl;
  for (bool full : {true, false}) {
    V4HybridSaved sv;
    Tensor y = Tensor::empty({b * s, D}, DType::f32);
    v4_hybrid_fwd(m.cfg, 1, w.layers[1].mla, x, batch.layout, sv, y);
    const Tensor garena = Tensor::zeros({m.arena.numel()}, DType::f32);
    const io::TensorMap gm = arena_views(m.table, garena);
    const V4Tensors g = v4_tensors(gm, m.cfg);
    Tensor dx = Tensor::empty({b * s, D}, DType::f32);
    kl[full] = v4_hybrid_bwd(sv, w.layers[1].mla, g.layers[1].mla, x, batch.layout, full ? dy : Tensor(),
                             full ? dx : Tensor(), V4HybridBackward{full, row_weight, Tensor()});
    for (const auto& [name, t] : gm) grads[full][name] = t.to_vector<float>();
  }
  EXPECT_EQ(kl[true], kl[false]);
  EXPECT_GT(kl[true], 0);
  for (const auto& [name, g] : grads[true]) {
    const bool ind = name.starts_with(layer_prefix(1) + "self_attn.indexer.");
    if (ind) {
      EXPECT_EQ(g, grads[false].at(name)) << name;
    } else {
      for (float v : grads[false].at(name)) ASSERT_EQ(v, 0.f) << name;
    }
  }
}

// Decoding refuses a hybrid_mla layer in one line; the activation plan counts the hybrid layers'
// saved tensors (mla_fields in their mode).
TEST(V4Hybrid, DecodeRefusesAndThePlanCountsTheLayer) {
  const Model m = tiny_model(LayerMode::mha);
  try {
    kv_cache(m, 32);
    ADD_FAILURE() << "a V4 stack with hybrid_mla layers decoded";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1 is hybrid_mla"), std::string::npos) << e.what();
  }
  MemoryPlan plan;
  EXPECT_THROW(plan_decode(plan, m.cfg, {"positions", 32}), ConfigError);
  auto planned = [](const ModelConfig& c) {
    MemoryPlan p;
    plan_v4_activations(p, c, {"rows", 1}, {"s", 1}, DType::f32);
    return p.total();
  };
  const ModelConfig c = load_model_config(kTiny);
  int64_t fields = 0;  // dsa_sparse keeps more per row than mha: the indexer's, qabs, the table, lse_c
  for (int L : {1, 3}) {
    for (const MlaField& f :
         mla_fields(hybrid_mla_config(in_mode(c, LayerMode::dsa_sparse), L), L, 1, 1, 1, DType::f32, false))
      fields += shape_numel(f.shape);
    for (const MlaField& f : mla_fields(hybrid_mla_config(in_mode(c, LayerMode::mha), L), L, 1, 1, 1, DType::f32, false))
      fields -= shape_numel(f.shape);
  }
  EXPECT_EQ(planned(in_mode(c, LayerMode::dsa_sparse)) - planned(in_mode(c, LayerMode::mha)), 4 * fields);
  EXPECT_NE(fields, 0);
}

}  // namespace
}  // namespace hmla
