// The MLA layer: mha and mqa_full_causal against the float64 oracle by the STYLE.md rule
// (forward and every gradient, so the two forms are equivalent), the
// kv_b_proj split round trip, and weight-table checks. The PyTorch twin (tests/python/
// mla_twin.py) checks each mode against autograd.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "forwarding_backend.h"
#include "hmla/model/indexer.h"
#include "hmla/model/mla_layer.h"
#include "hmla/ops/backend.h"
#include "hmla/ops/index_table.h"
#include "mla_layer_ref.h"
#include "testing.h"
#include "tiny_config.h"

namespace hmla {
namespace {

ModelConfig config(bool q_lora, bool yarn, bool sink, bool indexer = false) {
  testing::TinyConfig t;
  t.hidden = 48, t.heads = 4, t.layers = 1, t.q_lora = q_lora ? 20 : 0, t.kv_lora = 24;
  t.nope = 12, t.rope = 8, t.v = 10;
  t.vocab = std::nullopt, t.intermediate = std::nullopt, t.init_range = std::nullopt;
  t.indexer = std::nullopt, t.modes = {};
  if (indexer) t.indexer = testing::TinyIndexer{4, 16, 6, 2}, t.modes = {"mha"};
  t.sink = sink, t.yarn = yarn;
  return testing::tiny_config(t, "test");
}

io::TensorMap random_weights(const ModelConfig& c, uint64_t seed) {
  io::TensorMap w;
  for (const ParamSpec& p : mla_param_table(c, false)) {
    const float sd = p.shape.size() == 2 ? 1.f / std::sqrt(float(p.shape[1])) : 0.3f;
    auto v = testing::randn(shape_numel(p.shape), seed++, sd);
    if (p.name.find("layernorm") != std::string::npos)
      for (auto& x : v) x += 1.f;
    w[p.name] = Tensor::from_vector<float>(p.shape, v);
  }
  return w;
}

struct LayerRun {
  Tensor y;
  MlaGrads g;
  io::TensorMap dw;  // g.dweights by name
};

LayerRun run(const ModelConfig& c, const io::TensorMap& w, bool split, const Tensor& x, const Tensor& dy,
        const DocLayout& layout) {
  MlaLayer L{&c, 0, split, attn_tensors(w)};
  if (split) split_kv_b_proj(L.w, c);
  MlaSaved sv;
  LayerRun r;
  r.y = mla_forward(L, x, layout, sv);
  r.g = mla_backward(L, x, layout, sv, dy);
  if (split) fold_kv_b_proj(r.g.dweights, c);
  r.dw = attn_tensor_map(r.g.dweights);
  return r;
}

double max_rel(const Tensor& a, const Tensor& b) {
  auto x = a.to_vector<float>(), y = b.to_vector<float>();
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num = std::max(num, std::abs(double(x[i]) - y[i]));
    den = std::max(den, std::abs(double(y[i])));
  }
  return den > 0 ? num / den : num;
}

// The float64 mha oracle (src/oracles/mla_layer_ref) and its naive float32 instance, on the
// layer's weights, RoPE tables, softmax scale and eps as the f32 layer reads them (its inputs).
struct LayerOracle {
  ref::MlaRefResult<double> f64;
  ref::MlaRefResult<float> f32;
};

template <class T>
std::vector<T> values(const Tensor& t) {
  const std::vector<float> v = t.to_vector<float>();
  return {v.begin(), v.end()};
}

// The oracle's weight fields by the layer's tensor names.
template <class T>
std::vector<std::pair<std::string, std::vector<T>*>> named(ref::MlaRefWeights<T>& w) {
  return {{"q_proj.weight", &w.q_proj},           {"q_a_proj.weight", &w.q_a_proj},
          {"q_a_layernorm.weight", &w.q_a_layernorm}, {"q_b_proj.weight", &w.q_b_proj},
          {"kv_a_proj_with_mqa.weight", &w.kv_a_proj_with_mqa}, {"kv_a_layernorm.weight", &w.kv_a_layernorm},
          {"kv_b_proj.weight", &w.kv_b_proj},     {"o_proj.weight", &w.o_proj},
          {"softmax_offset", &w.softmax_offset}};
}

template <class T>
ref::MlaRefResult<T> run_oracle(const ModelConfig& c, const io::TensorMap& w, const Tensor& x, const Tensor& dy,
                                const DocLayout& layout) {
  const ref::MlaDims d{x.size(0), x.size(1), c.hidden_size, c.num_attention_heads, c.qk_nope_head_dim,
                       c.qk_rope_head_dim, c.v_head_dim, c.q_lora_rank, c.kv_lora_rank};
  ref::MlaRefWeights<T> rw;
  for (auto& [name, field] : named(rw))
    if (w.count(name)) *field = values<T>(w.at(name));
  const RopeCache rc = rope_cache(c, d.s);
  return ref::mla_layer_ref<T>(d, rw, values<T>(x), values<T>(rc.cos), values<T>(rc.sin),
                               layout.doc_start.to_vector<int32_t>(), T(float(softmax_scale(c))),
                               T(float(c.rms_norm_eps)), values<T>(dy));
}

LayerOracle layer_oracle(const ModelConfig& c, const io::TensorMap& w, const Tensor& x, const Tensor& dy,
                         const DocLayout& layout) {
  return {run_oracle<double>(c, w, x, dy, layout), run_oracle<float>(c, w, x, dy, layout)};
}

// The STYLE.md rule (testing.h) on the output, the hidden-state gradient and every backbone
// weight gradient of one run (dw: by name; the indexer's are not the oracle's); `what` names the form.
void expect_layer_within_rule(const std::string& what, const Tensor& y, const Tensor& dx, const io::TensorMap& dw,
                              LayerOracle& o) {
  testing::expect_within_rule(what + " output", y.to_vector<float>(), o.f32.y, o.f64.y);
  testing::expect_within_rule(what + " grad.hidden_states", dx.to_vector<float>(), o.f32.dx, o.f64.dx);
  auto n64 = named(o.f64.dw);
  auto n32 = named(o.f32.dw);
  size_t checked = 0;
  for (size_t i = 0; i < n64.size(); ++i) {
    if (n64[i].second->empty()) continue;
    ASSERT_TRUE(dw.count(n64[i].first)) << what << ": no gradient for " << n64[i].first;
    testing::expect_within_rule(what + " grad." + n64[i].first, dw.at(n64[i].first).to_vector<float>(),
                                *n32[i].second, *n64[i].second);
    ++checked;
  }
  const auto backbone =
      std::count_if(dw.begin(), dw.end(), [](const auto& kv) { return kv.first.rfind("indexer.", 0) != 0; });
  EXPECT_EQ(checked, size_t(backbone)) << what << ": a weight gradient the oracle does not have";
}

// DESIGN.md section 1: mqa_full_causal equals mha up to reassociation, output and gradients. Both
// forms are held to the float64 oracle by the STYLE.md rule (at most twice the naive f32 error
// plus 8 ulps), so they equal each other within the sum of their bounds.
TEST(MlaLayer, MqaFullCausalEqualsMha) {
  for (bool q_lora : {true, false})
    for (bool yarn_sink : {false, true}) {
      ModelConfig mha = config(q_lora, yarn_sink, yarn_sink), mqa = mha;
      set_all_modes(mqa, LayerMode::mqa_full_causal);
      io::TensorMap w = random_weights(mha, 10);
      const int64_t b = 2, s = 33;
      Tensor x = Tensor::from_vector<float>({b, s, 48}, testing::randn(b * s * 48, 1));
      Tensor dy = Tensor::from_vector<float>({b, s, 48}, testing::randn(b * s * 48, 2));
      DocLayout layout = layout_from_end_rows(b, s, [&] {
        std::vector<int64_t> e(b * s);
        for (int64_t t = 0; t < s; ++t) e[t] = t < 12 ? 12 : t == 12 ? 13 : t < 30 ? 30 : 0;  // 1-token doc, pad
        for (int64_t t = 0; t < s; ++t) e[s + t] = s;
        return e;
      }());
      LayerOracle o = layer_oracle(mha, w, x, dy, layout);
      const std::string form = std::string(q_lora ? "q_lora" : "q_proj") + (yarn_sink ? " yarn+sink " : " ");
      const LayerRun a = run(mha, w, false, x, dy, layout), m = run(mqa, w, false, x, dy, layout);
      expect_layer_within_rule(form + "mha", a.y, a.g.dx, a.dw, o);
      expect_layer_within_rule(form + "mqa_full_causal", m.y, m.g.dx, m.dw, o);
    }
}

TEST(MlaLayer, SplitKvBProjRoundTripIsBitExact) {
  ModelConfig c = config(true, false, false);
  io::TensorMap w = random_weights(c, 3);
  AttnTensors s = attn_tensors(w);
  split_kv_b_proj(s, c);
  EXPECT_FALSE(s.kv_b_proj.defined());
  EXPECT_EQ(s.k_b_proj.shape(), Shape({4, 24, 12}));
  EXPECT_EQ(s.v_b_proj.shape(), Shape({4, 10, 24}));
  // k_b_proj[h] is W_kb_h^T: entry (r, i) is kv_b_proj row h(Dn+Dv)+i, column r.
  EXPECT_EQ(s.k_b_proj.data<float>()[(1 * 24 + 5) * 12 + 3], w.at("kv_b_proj.weight").data<float>()[(1 * 22 + 3) * 24 + 5]);
  fold_kv_b_proj(s, c);
  EXPECT_FALSE(s.k_b_proj.defined() || s.v_b_proj.defined());
  const Tensor &a = s.kv_b_proj, &b = w.at("kv_b_proj.weight");
  ASSERT_EQ(a.shape(), b.shape());
  EXPECT_EQ(0, std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()));
}

TEST(MlaLayer, SplitFormComputesTheSameLayer) {
  ModelConfig c = config(true, false, true);
  set_all_modes(c, LayerMode::mqa_full_causal);
  io::TensorMap w = random_weights(c, 5);
  Tensor x = Tensor::from_vector<float>({1, 20, 48}, testing::randn(20 * 48, 8));
  Tensor dy = Tensor::from_vector<float>({1, 20, 48}, testing::randn(20 * 48, 9));
  DocLayout layout = layout_causal(1, 20);
  LayerRun a = run(c, w, false, x, dy, layout), b = run(c, w, true, x, dy, layout);
  // The forms differ only in how the products with W_kb / W_vb group their Rkv-long sums (separate
  // GEMMs vs one fused one, in whatever order the BLAS kernels take): a reassociation of sums of
  // Rkv terms moves each by at most Rkv * eps of their magnitudes; x4 for the two products a
  // gradient passes through and the magnitude/result ratio.
  const double tol = 4.0 * double(c.kv_lora_rank) * FLT_EPSILON;
  EXPECT_LE(max_rel(b.y, a.y), tol);
  for (const auto& [name, t] : a.dw) EXPECT_LE(max_rel(b.dw.at(name), t), tol) << name;
}

TEST(MlaLayer, WeightTableAndModeChecks) {
  ModelConfig c = config(true, false, false);
  io::TensorMap w = random_weights(c, 1);
  EXPECT_NO_THROW(check_mla_weights(w, c, false, false, "w"));
  io::TensorMap missing = w;
  missing.erase("o_proj.weight");
  EXPECT_THROW(check_mla_weights(missing, c, false, false, "w"), ConfigError);
  io::TensorMap extra = w;
  extra["softmax_offset"] = Tensor::zeros({4}, DType::f32);
  EXPECT_THROW(check_mla_weights(extra, c, false, false, "w"), ConfigError);  // no attention_sink
  io::TensorMap bad = w;
  bad["q_b_proj.weight"] = Tensor::zeros({4, 4}, DType::f32);
  EXPECT_THROW(check_mla_weights(bad, c, false, false, "w"), ConfigError);
  // Non-finite weights are refused as every checkpoint loader refuses them (check_finite_weight).
  for (float v : {NAN, INFINITY}) {
    io::TensorMap nonfinite = w;
    nonfinite["o_proj.weight"] = w.at("o_proj.weight").clone();
    nonfinite["o_proj.weight"].data<float>()[7] = v;
    EXPECT_THROW(check_mla_weights(nonfinite, c, false, false, "w"), IoError);
  }
  // The split form is only for latent modes.
  MlaLayer L{&c, 0, true, attn_tensors(w)};
  split_kv_b_proj(L.w, c);
  MlaSaved sv;
  Tensor x = Tensor::zeros({1, 4, 48}, DType::f32);
  DocLayout layout = layout_causal(1, 4);
  EXPECT_THROW(mla_forward(L, x, layout, sv), ConfigError);
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// DESIGN.md section 1: dsa_warmup's output and main-path gradients are mha's, bit for bit; the
// indexer adds its own gradients (from the KL only) and nothing else.
TEST(MlaLayer, DsaWarmupMainPathIsBitIdenticalToMha) {
  for (bool sink : {false, true}) {
    ModelConfig mha = config(true, true, sink, true), warm = mha;
    set_all_modes(warm, LayerMode::dsa_warmup);
    io::TensorMap w = random_weights(mha, 20), wi = w;
    EXPECT_EQ(indexer_init_missing(wi, warm, 5), 5);
    EXPECT_EQ(indexer_init_missing(wi, warm, 6), 0);  // a present indexer is never re-initialised
    const int64_t b = 1, s = 40;
    Tensor x = Tensor::from_vector<float>({b, s, 48}, testing::randn(b * s * 48, 3));
    Tensor dy = Tensor::from_vector<float>({b, s, 48}, testing::randn(b * s * 48, 4));
    DocLayout layout = layout_from_cu_seqlens(s, {{0, 15, 16, 37}});
    LayerRun a = run(mha, w, false, x, dy, layout);
    MlaLayer L{&warm, 0, false, attn_tensors(wi)};
    MlaSaved sv;
    Tensor y = mla_forward(L, x, layout, sv);
    MlaBackwardOptions opt;
    opt.row_weight = loss_row_weights(layout, nullptr, 0);
    MlaGrads g = mla_backward(L, x, layout, sv, dy, opt);
    const io::TensorMap dw = attn_tensor_map(g.dweights);
    EXPECT_TRUE(same_bytes(y, a.y));
    EXPECT_TRUE(same_bytes(g.dx, a.g.dx));
    for (const auto& [name, t] : a.dw) EXPECT_TRUE(same_bytes(dw.at(name), t)) << name;
    EXPECT_EQ(dw.size(), a.dw.size() + 5);
    EXPECT_GT(g.indexer_loss, 0.0);
    EXPECT_EQ(sv.topk.shape(), Shape({b, s, 6 + 2}));

    // train_indexer_only: the same indexer gradients, no backbone backward at all.
    opt.backbone = false;
    MlaGrads gi = mla_backward(L, x, layout, sv, dy, opt);
    EXPECT_FALSE(gi.dx.defined());
    const io::TensorMap dwi = attn_tensor_map(gi.dweights);
    EXPECT_EQ(dwi.size(), 5u);
    for (const auto& [name, t] : dwi) EXPECT_TRUE(same_bytes(t, dw.at(name))) << name;
    EXPECT_EQ(gi.indexer_loss, g.indexer_loss);
  }
}

struct DsaRun {
  Tensor y;
  MlaGrads g;
  io::TensorMap dw;  // g.dweights by name
  Tensor topk;
};

DsaRun run_dsa(const ModelConfig& c, const io::TensorMap& w, const Tensor& x, const Tensor& dy, const DocLayout& layout,
               bool split = false) {
  MlaLayer L{&c, 0, split, attn_tensors(w)};
  if (split) split_kv_b_proj(L.w, c);
  MlaSaved sv;
  DsaRun r;
  r.y = mla_forward(L, x, layout, sv);
  MlaBackwardOptions opt;
  opt.row_weight = loss_row_weights(layout, nullptr, 0);
  r.g = mla_backward(L, x, layout, sv, dy, opt);
  if (split) fold_kv_b_proj(r.g.dweights, c);
  r.dw = attn_tensor_map(r.g.dweights);
  r.topk = sv.topk;
  return r;
}

// DESIGN.md / issue: with K >= the longest document and W = 0, dsa_sparse is mqa_full_causal: held
// to the same float64 oracle by the STYLE.md rule.
TEST(MlaLayer, DsaSparseWithFullTopkEqualsMqaFullCausal) {
  for (bool sink : {false, true}) {
    ModelConfig mqa = config(true, true, sink, true);
    nlohmann::json j = model_config_to_json(mqa);
    j["index_topk"] = 40;
    j["index_window"] = 0;
    mqa = parse_model_config(j, "t");
    set_all_modes(mqa, LayerMode::mqa_full_causal);
    ModelConfig sp = mqa;
    set_all_modes(sp, LayerMode::dsa_sparse);
    io::TensorMap w = random_weights(mqa, 30), wi = w;
    indexer_init_missing(wi, sp, 1);
    const int64_t s = 40;
    Tensor x = Tensor::from_vector<float>({1, s, 48}, testing::randn(s * 48, 6));
    Tensor dy = Tensor::from_vector<float>({1, s, 48}, testing::randn(s * 48, 7));
    DocLayout layout = layout_from_cu_seqlens(s, {{0, 15, 16, 37}});
    DsaRun b = run_dsa(sp, wi, x, dy, layout, sink);  // also through the split form
    LayerOracle o = layer_oracle(mqa, w, x, dy, layout);  // dense over each document: all of its keys
    expect_layer_within_rule(sink ? "dsa_sparse (split, sink)" : "dsa_sparse", b.y, b.g.dx, b.dw, o);
  }
}

// A selection kernel that lists a key twice: row 20's second slot repeats its first.
class DuplicatingTopk : public testing::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  void indexer_topk(const IndexerTopkParams& p) const override {
    inner_.indexer_topk(p);
    const int64_t KW = p.K + p.W;
    p.table[20 * KW + 1] = p.table[20 * KW];
  }
};

// The layer trusts its own indexer's table (index_table.h: no check per op), so a selection bug
// passes unnoticed; the debug option (HMLA_CHECK_TABLES=1, here its test seam) checks every table
// again and names the row at the first op that reads it.
TEST(MlaLayer, OwnTablesAreCheckedOnlyUnderTheDebugOption) {
  ModelConfig c = config(true, false, false, true);
  set_all_modes(c, LayerMode::dsa_sparse);
  io::TensorMap w = random_weights(c, 50);
  indexer_init_missing(w, c, 3);
  const int64_t s = 30;
  Tensor x = Tensor::from_vector<float>({1, s, 48}, testing::randn(s * 48, 11));
  Tensor dy = Tensor::from_vector<float>({1, s, 48}, testing::randn(s * 48, 12));
  DocLayout layout = layout_from_cu_seqlens(s, {{0, 11, 30}});  // row 20 ranks 8 keys, lists 6
  const DsaRun good = run_dsa(c, w, x, dy, layout);
  ASSERT_GE(good.topk.to_vector<int32_t>()[20 * good.topk.size(2) + 1], 0);
  const DuplicatingTopk dup(backend(Device::cpu));
  const ScopedBackendOverride use(dup);
  EXPECT_NO_THROW(run_dsa(c, w, x, dy, layout));
  const bool was = set_check_all_tables(true);
  try {
    run_dsa(c, w, x, dy, layout);
    ADD_FAILURE() << "a table listing a key twice ran under HMLA_CHECK_TABLES";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("sparse attention: row 20 of batch 0 lists key"), std::string::npos)
        << e.what();
  }
  set_check_all_tables(was);
}

// The LM gradient never reaches the indexer; the KL gradient never reaches the backbone.
TEST(MlaLayer, DsaSparseGradientsStayInTheirLanes) {
  ModelConfig c = config(true, false, true, true);
  set_all_modes(c, LayerMode::dsa_sparse);
  io::TensorMap w = random_weights(c, 40);
  indexer_init_missing(w, c, 2);
  const int64_t s = 30;
  Tensor x = Tensor::from_vector<float>({1, s, 48}, testing::randn(s * 48, 8));
  Tensor dy = Tensor::from_vector<float>({1, s, 48}, testing::randn(s * 48, 9));
  Tensor dy2 = Tensor::from_vector<float>({1, s, 48}, testing::randn(s * 48, 10));
  DocLayout layout = layout_from_cu_seqlens(s, {{0, 11, 30}});
  DsaRun a = run_dsa(c, w, x, dy, layout), b = run_dsa(c, w, x, dy2, layout);
  ModelConfig c0 = c;
  c0.indexer_loss_coeff = 0.5;
  DsaRun k = run_dsa(c0, w, x, dy, layout);
  EXPECT_EQ(a.topk.to_vector<int32_t>(), b.topk.to_vector<int32_t>());
  for (const auto& [name, t] : a.dw) {
    const bool indexer = name.rfind("indexer.", 0) == 0;
    if (indexer) {
      EXPECT_TRUE(same_bytes(t, b.dw.at(name))) << name << " depends on grad_output";
      EXPECT_FALSE(same_bytes(t, k.dw.at(name))) << name << " ignores the coefficient";
    } else {
      EXPECT_TRUE(same_bytes(t, k.dw.at(name))) << name << " depends on the indexer loss";
      EXPECT_FALSE(same_bytes(t, b.dw.at(name))) << name << " ignores grad_output";
    }
  }
  EXPECT_TRUE(same_bytes(a.g.dx, k.g.dx));
  EXPECT_GT(a.g.indexer_loss, 0.0);
}

TEST(LossRows, MaskAndValidRows) {
  DocLayout l = layout_from_cu_seqlens(6, {{0, 2, 5}});  // row 5 padding
  Tensor ids = Tensor::from_vector<int64_t>({1, 6}, {4, 0, 7, 8, 9, 0});
  auto w = loss_row_weights(l, &ids, 0).to_vector<float>();
  EXPECT_EQ(w, (std::vector<float>{0.25f, 0.f, 0.25f, 0.25f, 0.25f, 0.f}));
  // A row the layout marks as padding is no loss row whatever its token (3 here, not the pad id).
  Tensor tail = Tensor::from_vector<int64_t>({1, 6}, {4, 0, 7, 8, 9, 3});
  EXPECT_EQ(loss_row_weights(l, &tail, 0).to_vector<float>(), w);
  EXPECT_EQ(loss_row_count(l, &tail, 0), 4);
  auto all = loss_row_weights(l, nullptr, 0).to_vector<float>();  // every row, global count
  for (float v : all) EXPECT_EQ(v, 1.f / 6.f);
  auto global = loss_row_weights(l, &ids, 0, 10).to_vector<float>();
  EXPECT_EQ(global[0], 0.1f);
  Tensor pads = Tensor::from_vector<int64_t>({1, 6}, std::vector<int64_t>(6, 0));
  EXPECT_EQ(loss_row_weights(l, &pads, 0).to_vector<float>(), std::vector<float>(6, 0.f));  // max(0, 1)
}

}  // namespace
}  // namespace hmla
