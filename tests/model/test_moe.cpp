// DeepSeekMoE (docs/moe.md): the config's MoE fields and layer kinds as transformers 5.24 reads
// them; the MoE MLP's forward and gradients against a float64 oracle written here, per token,
// without the dispatch (the STYLE.md rule, its naive f32 instance the same code in float); a
// tiny MoE model's training steps on the CPU. The router's rule and the dispatch:
// tests/ops/test_moe_ops.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <functional>
#include <random>

#include "hmla/dist/comm.h"
#include "hmla/model/mlp.h"
#include "hmla/model/model.h"
#include "hmla/ops/moe.h"
#include "hmla/train/optim.h"
#include "testing.h"
#include "tiny_config.h"

namespace hmla {
namespace {

using nlohmann::json;

// ---- config -------------------------------------------------------------------------------------

json moe_json(int layers = 2) {
  testing::TinyConfig t;
  t.modes = std::vector<std::string>(size_t(layers), "mha");
  json j = testing::tiny_config_json(t);
  j["first_k_dense_replace"] = 1;
  j["n_routed_experts"] = 8, j["n_group"] = 4, j["topk_group"] = 2, j["num_experts_per_tok"] = 3;
  j["moe_intermediate_size"] = 6, j["n_shared_experts"] = 2, j["routed_scaling_factor"] = 2.5;
  j["norm_topk_prob"] = true;
  return j;
}

std::string config_error(const json& j) {
  try {
    parse_model_config(j, "cfg");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "accepted";
}

TEST(MoeConfig, LayerKindsAsTransformersReadsThem) {
  json j = moe_json(4);
  j.erase("first_k_dense_replace");  // transformers' default: 3 dense layers
  ModelConfig c = parse_model_config(j, "cfg");
  EXPECT_EQ(std::vector<bool>({c.is_moe_layer(0), c.is_moe_layer(1), c.is_moe_layer(2), c.is_moe_layer(3)}),
            std::vector<bool>({false, false, false, true}));
  j["first_k_dense_replace"] = 9;  // more than the layers: all dense (min with num_hidden_layers)
  EXPECT_FALSE(parse_model_config(j, "cfg").has_moe_layers());
  j["first_k_dense_replace"] = 0;
  EXPECT_TRUE(parse_model_config(j, "cfg").is_moe_layer(0));
  j["mlp_layer_types"] = {"sparse", "dense", "sparse", "dense"};  // wins over first_k_dense_replace
  c = parse_model_config(j, "cfg");
  EXPECT_EQ(std::vector<bool>({c.is_moe_layer(0), c.is_moe_layer(1), c.is_moe_layer(2), c.is_moe_layer(3)}),
            std::vector<bool>({true, false, true, false}));
  EXPECT_EQ(c.moe.n_routed_experts, 8);
  EXPECT_EQ(c.moe.n_group, 4);
  EXPECT_EQ(c.moe.topk_group, 2);
  EXPECT_EQ(c.moe.num_experts_per_tok, 3);
  EXPECT_EQ(c.moe.shared_intermediate(), 12);
  EXPECT_DOUBLE_EQ(c.moe.routed_scaling_factor, 2.5);
  // Written back as read: the per-layer types and the fields; parsed again, the same model.
  const json w = model_config_to_json(c);
  EXPECT_EQ(w["mlp_layer_types"], json({"sparse", "dense", "sparse", "dense"}));
  EXPECT_EQ(w["n_group"], 4);
  const ModelConfig again = parse_model_config(w, "written");
  EXPECT_EQ(again.mlp_layer_types, c.mlp_layer_types);
  EXPECT_EQ(again.moe.num_experts_per_tok, 3);
  EXPECT_EQ(again.moe.norm_topk_prob, true);
  // transformers' defaults and its backward-compatible name num_experts.
  j = moe_json(2);
  for (const char* k : {"n_group", "topk_group", "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts",
                        "routed_scaling_factor", "norm_topk_prob", "n_routed_experts"})
    j.erase(k);
  c = parse_model_config(j, "cfg");
  EXPECT_EQ(c.moe.n_routed_experts, 256);
  EXPECT_EQ(c.moe.n_group, 8);
  EXPECT_EQ(c.moe.topk_group, 4);
  EXPECT_EQ(c.moe.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe.moe_intermediate_size, 2048);
  EXPECT_EQ(c.moe.n_shared_experts, 1);
  EXPECT_DOUBLE_EQ(c.moe.routed_scaling_factor, 2.5);
  j["num_experts"] = 16;
  EXPECT_EQ(parse_model_config(j, "cfg").moe.n_routed_experts, 16);
}

TEST(MoeConfig, ADenseConfigIsWrittenAsBefore) {
  json j = moe_json(2);
  j["first_k_dense_replace"] = 2;
  j["scoring_func"] = "softmax";  // no MoE layer reads it: not an error, kept verbatim
  const ModelConfig c = parse_model_config(j, "cfg");
  EXPECT_FALSE(c.has_moe_layers());
  const json w = model_config_to_json(c);
  EXPECT_EQ(w["first_k_dense_replace"], 2);
  EXPECT_EQ(w["mlp_layer_types"], json({"dense", "dense"}));
  EXPECT_EQ(w["scoring_func"], "softmax");
}

TEST(MoeConfig, AnUnsupportedRoutingFieldIsRefusedByName) {
  const std::vector<std::pair<std::function<void(json&)>, std::string>> cases{
      {[](json& j) { j["scoring_func"] = "softmax"; }, "cfg: scoring_func = \"softmax\": hmla supports only \"sigmoid\""},
      {[](json& j) { j["topk_method"] = "greedy"; }, "cfg: topk_method = \"greedy\": hmla supports only \"noaux_tc\""},
      {[](json& j) { j["n_group"] = 3; }, "cfg: n_group = 3 does not divide n_routed_experts = 8"},
      {[](json& j) { j["n_group"] = 8; }, "cfg: n_group = 8 leaves 1 expert per group"},
      {[](json& j) { j["topk_group"] = 5; }, "cfg: topk_group = 5 exceeds n_group = 4"},
      {[](json& j) { j["num_experts_per_tok"] = 5; }, "cfg: num_experts_per_tok = 5 exceeds the 4 experts"},
      {[](json& j) { j["n_routed_experts"] = 0; }, "cfg: n_routed_experts = 0: it must be at least 1"},
      {[](json& j) { j["n_shared_experts"] = -1; }, "cfg: n_shared_experts = -1: it must be >= 0"},
      {[](json& j) { j["routed_scaling_factor"] = -1.0; }, "cfg: routed_scaling_factor = -1: it must be finite and positive"},
      {[](json& j) { j["norm_topk_prob"] = 1; }, "cfg: norm_topk_prob must be true or false"},
  };
  for (const auto& [edit, needle] : cases) {
    json j = moe_json(2);
    edit(j);
    const std::string e = config_error(j);
    EXPECT_NE(e.find(needle), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  json ok = moe_json(2);
  ok["scoring_func"] = "sigmoid", ok["topk_method"] = "noaux_tc";
  EXPECT_EQ(config_error(ok), "accepted");
}

// ---- the float64 oracle -------------------------------------------------------------------------

struct Dims {
  int64_t N, H, E, k, G, TG, I, Is;
  bool norm;
  double rsf;
};

// The layer's weights as read from a model's params (double).
struct MoeW {
  std::vector<double> gate, bias, eg, eu, ed, sg, su, sd;  // [E,H] [E] [E,I,H] [E,I,H] [E,H,I] [Is,H] [Is,H] [H,Is]
};

std::vector<double> read(const Tensor& t) { return testing::to_f64(t.to_vector<float>()); }

MoeW weights_of(const Model& m, const Dims& d) {
  MoeW w;
  const MoeTensors& t = m.w.layers[0].moe;
  w.gate = read(t.gate), w.bias = read(t.e_score_correction_bias);
  for (int64_t e = 0; e < d.E; ++e)
    for (auto [dst, src] : {std::pair{&w.eg, &t.experts[e].gate_proj}, std::pair{&w.eu, &t.experts[e].up_proj},
                            std::pair{&w.ed, &t.experts[e].down_proj}}) {
      const std::vector<double> v = read(*src);
      dst->insert(dst->end(), v.begin(), v.end());
    }
  if (d.Is) w.sg = read(t.shared.gate_proj), w.su = read(t.shared.up_proj), w.sd = read(t.shared.down_proj);
  return w;
}

// The router in float64: each token's chosen experts (a set), and the smallest margin any
// decision had (the kept groups' last score over the first dropped one, the chosen experts'
// last choice value over the first unchosen one in the kept groups).
struct Choice {
  std::vector<std::vector<int64_t>> experts;
  double margin = INFINITY;
};

Choice route64(const MoeW& w, const std::vector<double>& x, const Dims& d) {
  Choice ch;
  const int64_t per = d.E / d.G;
  for (int64_t t = 0; t < d.N; ++t) {
    std::vector<double> c(d.E);
    for (int64_t e = 0; e < d.E; ++e) {
      double u = 0;
      for (int64_t i = 0; i < d.H; ++i) u += w.gate[e * d.H + i] * x[t * d.H + i];
      c[e] = 1 / (1 + std::exp(-u)) + w.bias[e];
    }
    std::vector<std::pair<double, int64_t>> gs;
    for (int64_t g = 0; g < d.G; ++g) {
      std::vector<double> v(c.begin() + g * per, c.begin() + (g + 1) * per);
      std::sort(v.rbegin(), v.rend());
      gs.push_back({v[0] + v[1], g});
    }
    std::sort(gs.begin(), gs.end(), [](auto a, auto b) { return a.first > b.first; });
    if (d.TG < d.G) ch.margin = std::min(ch.margin, gs[d.TG - 1].first - gs[d.TG].first);
    std::vector<std::pair<double, int64_t>> cand;
    for (int64_t r = 0; r < d.TG; ++r)
      for (int64_t e = gs[r].second * per; e < (gs[r].second + 1) * per; ++e) cand.push_back({c[e], e});
    std::sort(cand.begin(), cand.end(), [](auto a, auto b) { return a.first > b.first; });
    if (int64_t(cand.size()) > d.k) ch.margin = std::min(ch.margin, cand[d.k - 1].first - cand[d.k].first);
    std::vector<int64_t> set;
    for (int64_t j = 0; j < d.k; ++j) set.push_back(cand[j].second);
    std::sort(set.begin(), set.end());
    ch.experts.push_back(set);
  }
  return ch;
}

template <class T>
struct Ref {
  std::vector<T> y, dx, dgate, deg, deu, ded, dsg, dsu, dsd;
};

// One SwiGLU in T: o = Wd (silu(Wg x) * (Wu x)); the backward adds w * ... into the weights'
// gradients and dx, for the output gradient w * dy (w: the gating weight, 1 for shared experts),
// and returns dy . o (the gating weight's gradient).
template <class T>
T swiglu_ref(const double* Wg, const double* Wu, const double* Wd, int64_t H, int64_t I, const T* x, const T* dy, T w,
             T* y, T* dWg, T* dWu, T* dWd, T* dx) {
  std::vector<T> g(I), u(I), a(I), sg(I), da(I, T(0));
  for (int64_t r = 0; r < I; ++r) {
    g[r] = u[r] = 0;
    for (int64_t i = 0; i < H; ++i) g[r] += T(Wg[r * H + i]) * x[i], u[r] += T(Wu[r * H + i]) * x[i];
    sg[r] = T(1) / (T(1) + std::exp(-g[r]));
    a[r] = g[r] * sg[r] * u[r];
  }
  T dw = 0;
  for (int64_t h = 0; h < H; ++h) {
    T o = 0;
    for (int64_t r = 0; r < I; ++r) o += T(Wd[h * I + r]) * a[r];
    y[h] += w * o;
    dw += dy[h] * o;
    for (int64_t r = 0; r < I; ++r) dWd[h * I + r] += w * dy[h] * a[r], da[r] += T(Wd[h * I + r]) * w * dy[h];
  }
  for (int64_t r = 0; r < I; ++r) {
    const T dg = da[r] * u[r] * sg[r] * (T(1) + g[r] * (T(1) - sg[r])), du = da[r] * g[r] * sg[r];
    for (int64_t i = 0; i < H; ++i) {
      dWg[r * H + i] += dg * x[i], dWu[r * H + i] += du * x[i];
      dx[i] += T(Wg[r * H + i]) * dg + T(Wu[r * H + i]) * du;
    }
  }
  return dw;
}

// y = sum_j w_j expert_j(x) + shared(x) per token with the given choice, and the gradients of
// sum(dy * y): the experts', the shared experts', the gate's (through w only) and x's.
template <class T>
Ref<T> moe_ref(const MoeW& W, const std::vector<double>& x64, const std::vector<double>& dy64, const Choice& ch,
               const Dims& d) {
  const int64_t H = d.H, I = d.I;
  Ref<T> r;
  r.y.assign(d.N * H, 0), r.dx.assign(d.N * H, 0), r.dgate.assign(d.E * H, 0);
  r.deg.assign(d.E * I * H, 0), r.deu.assign(d.E * I * H, 0), r.ded.assign(d.E * H * I, 0);
  r.dsg.assign(d.Is * H, 0), r.dsu.assign(d.Is * H, 0), r.dsd.assign(H * d.Is, 0);
  const std::vector<T> x(x64.begin(), x64.end()), dy(dy64.begin(), dy64.end());
  for (int64_t t = 0; t < d.N; ++t) {
    const T* xt = &x[t * H];
    const std::vector<int64_t>& es = ch.experts[t];
    std::vector<T> s(d.k), w(d.k), dw(d.k);
    T den = 0;
    for (int64_t j = 0; j < d.k; ++j) {
      T u = 0;
      for (int64_t i = 0; i < H; ++i) u += T(W.gate[es[j] * H + i]) * xt[i];
      s[j] = T(1) / (T(1) + std::exp(-u));
      den += s[j];
    }
    for (int64_t j = 0; j < d.k; ++j) w[j] = (d.norm ? s[j] / den : s[j]) * T(d.rsf);
    for (int64_t j = 0; j < d.k; ++j) {
      const int64_t e = es[j];
      dw[j] = swiglu_ref<T>(&W.eg[e * I * H], &W.eu[e * I * H], &W.ed[e * H * I], H, I, xt, &dy[t * H], w[j],
                            &r.y[t * H], &r.deg[e * I * H], &r.deu[e * I * H], &r.ded[e * H * I], &r.dx[t * H]);
    }
    if (d.Is)
      swiglu_ref<T>(W.sg.data(), W.su.data(), W.sd.data(), H, d.Is, xt, &dy[t * H], T(1), &r.y[t * H], r.dsg.data(),
                    r.dsu.data(), r.dsd.data(), &r.dx[t * H]);
    // w_j = rsf s_j / den: dL/ds_j = rsf dw_j / den - rsf sum_i dw_i s_i / den^2 (normalised).
    T q = 0;
    for (int64_t i = 0; i < d.k; ++i) q += dw[i] * s[i];
    for (int64_t j = 0; j < d.k; ++j) {
      const T ds = d.norm ? T(d.rsf) * (dw[j] / den - q / (den * den)) : T(d.rsf) * dw[j];
      const T du = ds * s[j] * (T(1) - s[j]);
      for (int64_t i = 0; i < H; ++i) {
        r.dgate[es[j] * H + i] += du * xt[i];
        r.dx[t * H + i] += du * T(W.gate[es[j] * H + i]);
      }
    }
  }
  return r;
}

// ---- hmla's MoE MLP on a one-layer model's weights -----------------------------------------------

json mlp_json(const Dims& d) {
  json j = moe_json(1);
  j["hidden_size"] = d.H, j["first_k_dense_replace"] = 0;
  j["n_routed_experts"] = d.E, j["n_group"] = d.G, j["topk_group"] = d.TG, j["num_experts_per_tok"] = d.k;
  j["moe_intermediate_size"] = d.I, j["n_shared_experts"] = d.Is / d.I, j["norm_topk_prob"] = d.norm;
  j["routed_scaling_factor"] = d.rsf;
  return j;
}

struct Harness {
  ModelConfig c;
  Model m;
  Tensor garena;
  io::TensorMap grads;
  ModelTensors g;
  explicit Harness(const Dims& d, uint64_t seed) : c(parse_model_config(mlp_json(d), "moe")), m(build_model(c, {false})) {
    init_model(m, seed);
    const std::vector<float> b = testing::randn(size_t(d.E), seed + 1, 0.1f);  // a nonzero correction bias
    m.params.at("model.layers.0.mlp.gate.e_score_correction_bias").copy_from(Tensor::from_vector<float>({d.E}, b));
    garena = Tensor::zeros({m.arena.numel()}, DType::f32);
    grads = arena_views(m.table, garena);
    g = model_tensors(grads, 1, false);
  }
  // Forward then backward over x [N, H]: y, dx, and the routing hmla chose.
  void run(const Dims& d, const std::vector<float>& x, const std::vector<float>& dy, std::vector<float>& y,
           std::vector<float>& dx, std::vector<std::vector<int64_t>>& chosen) {
    const std::unique_ptr<Mlp> mlp = make_mlp(c, 0, m.w.layers[0], &g.layers[0]);
    std::vector<Tensor> sv;
    for (const ActField& f : mlp->fields())
      sv.push_back(Tensor::empty(f.width ? Shape{d.N, f.width} : Shape{d.N}, field_dtype(f, DType::f32)));
    const Tensor X = Tensor::from_vector<float>({d.N, d.H}, x), Y = Tensor::empty({d.N, d.H}, DType::f32);
    const Tensor DY = Tensor::from_vector<float>({d.N, d.H}, dy), DX = Tensor::empty({d.N, d.H}, DType::f32);
    mlp->forward(X, sv, Y);
    mlp->backward(DY, X, sv, DX);
    y = Y.to_vector<float>(), dx = DX.to_vector<float>();
    const std::vector<int32_t> idx = sv[0].to_vector<int32_t>();
    chosen.clear();
    for (int64_t t = 0; t < d.N; ++t) {
      std::vector<int64_t> set(idx.begin() + t * d.k, idx.begin() + (t + 1) * d.k);
      std::sort(set.begin(), set.end());
      chosen.push_back(set);
    }
  }
  std::vector<float> grad(const std::string& name) const { return grads.at(name).to_vector<float>(); }
};

std::vector<float> concat(const Harness& h, int64_t E, const char* proj) {
  std::vector<float> v;
  for (int64_t e = 0; e < E; ++e) {
    const std::vector<float> g = h.grad("model.layers.0.mlp.experts." + std::to_string(e) + "." + proj + ".weight");
    v.insert(v.end(), g.begin(), g.end());
  }
  return v;
}

// Forward and every gradient against the oracle, in two routings: group-limited with normalised
// weights and shared experts, and one group without normalisation or shared experts.
TEST(MoeMlp, ForwardAndGradientsMatchTheFloat64Oracle) {
  for (const Dims& d : {Dims{24, 32, 8, 3, 4, 2, 6, 12, true, 2.5}, Dims{20, 16, 6, 2, 1, 1, 5, 0, false, 1.5}}) {
    SCOPED_TRACE("E = " + std::to_string(d.E) + ", n_group = " + std::to_string(d.G));
    Harness h(d, 11);
    const std::vector<float> x = testing::randn(size_t(d.N * d.H), 5), dy = testing::randn(size_t(d.N * d.H), 6);
    const std::vector<double> x64 = testing::to_f64(x), dy64 = testing::to_f64(dy);
    const MoeW W = weights_of(h.m, d);
    const Choice ch = route64(W, x64, d);
    // hmla's choice values carry the f32 rounding of u (at most H eps sum |W x| for a dot product of
    // H terms), through sigmoid (slope <= 1/4), plus a few ulps of values below 2 for the sigmoid and
    // the bias add; a group score adds two. A decision whose float64 margin exceeds twice that
    // cannot flip, so the chosen sets must be equal.
    double dot_mag = 0;
    for (int64_t t = 0; t < d.N; ++t)
      for (int64_t e = 0; e < d.E; ++e) {
        double m = 0;
        for (int64_t i = 0; i < d.H; ++i) m += std::abs(W.gate[e * d.H + i] * x64[t * d.H + i]);
        dot_mag = std::max(dot_mag, m);
      }
    const double c_err = 0.25 * d.H * FLT_EPSILON * dot_mag + 8 * FLT_EPSILON;
    ASSERT_GT(ch.margin, 2 * 2 * c_err) << "the data has a near-tie; pick another seed";
    std::vector<float> y, dx;
    std::vector<std::vector<int64_t>> chosen;
    h.run(d, x, dy, y, dx, chosen);
    EXPECT_EQ(chosen, ch.experts);
    const Ref<double> o = moe_ref<double>(W, x64, dy64, ch, d);
    const Ref<float> n = moe_ref<float>(W, x64, dy64, ch, d);
    testing::expect_within_rule("y", y, n.y, o.y);
    testing::expect_within_rule("dx", dx, n.dx, o.dx);
    testing::expect_within_rule("gate", h.grad("model.layers.0.mlp.gate.weight"), n.dgate, o.dgate);
    testing::expect_within_rule("experts gate_proj", concat(h, d.E, "gate_proj"), n.deg, o.deg);
    testing::expect_within_rule("experts up_proj", concat(h, d.E, "up_proj"), n.deu, o.deu);
    testing::expect_within_rule("experts down_proj", concat(h, d.E, "down_proj"), n.ded, o.ded);
    if (d.Is) {
      testing::expect_within_rule("shared gate_proj", h.grad("model.layers.0.mlp.shared_experts.gate_proj.weight"),
                                  n.dsg, o.dsg);
      testing::expect_within_rule("shared up_proj", h.grad("model.layers.0.mlp.shared_experts.up_proj.weight"), n.dsu,
                                  o.dsu);
      testing::expect_within_rule("shared down_proj", h.grad("model.layers.0.mlp.shared_experts.down_proj.weight"),
                                  n.dsd, o.dsd);
    }
    // The gate's gradient is not zero (the test would not see it missing otherwise) ...
    double gate_norm = 0;
    for (double v : o.dgate) gate_norm += v * v;
    EXPECT_GT(gate_norm, 1e-6);
    // ... and the bias gets none.
    for (float v : h.grad("model.layers.0.mlp.gate.e_score_correction_bias")) EXPECT_EQ(v, 0.f);
  }
}

// The oracle's own gradients against central differences of sum(dy * y) (float64, the routing
// held: it is piecewise constant in the weights), so that the reference above is a gradient.
TEST(MoeMlp, TheOraclesGradientsAreFiniteDifferences) {
  const Dims d{6, 8, 4, 2, 2, 1, 3, 3, true, 2.5};
  Harness h(d, 21);
  MoeW W = weights_of(h.m, d);
  std::vector<double> x = testing::to_f64(testing::randn(size_t(d.N * d.H), 7));
  const std::vector<double> dy = testing::to_f64(testing::randn(size_t(d.N * d.H), 8));
  const Choice ch = route64(W, x, d);
  const Ref<double> g = moe_ref<double>(W, x, dy, ch, d);
  auto loss = [&] {
    const Ref<double> r = moe_ref<double>(W, x, dy, ch, d);
    double l = 0;
    for (size_t i = 0; i < r.y.size(); ++i) l += dy[i] * r.y[i];
    return l;
  };
  testing::expect_fd_gradient(x, g.dx, loss, "dx", 1e-6, 1e-6);
  testing::expect_fd_gradient(W.gate, g.dgate, loss, "gate", 1e-6, 1e-6);
  testing::expect_fd_gradient(W.eg, g.deg, loss, "experts gate_proj", 1e-6, 1e-6);
  testing::expect_fd_gradient(W.ed, g.ded, loss, "experts down_proj", 1e-6, 1e-6);
  testing::expect_fd_gradient(W.su, g.dsu, loss, "shared up_proj", 1e-6, 1e-6);
}

// ---- load balancing in the step (docs/moe.md "Load balancing") -----------------------------------

// A 3-layer model (MoE layers 1 and 2) and a batch whose first row ends in padding (pad 0).
struct BalanceCase {
  ModelConfig c = parse_model_config(moe_json(3), "tiny moe");
  Model m = build_model(c, {false, false, false});
  Batch bt;
  BalanceCase() {
    init_model(m, 5);
    std::mt19937_64 rng(8);
    std::vector<int32_t> ids(2 * 16);
    for (auto& v : ids) v = int32_t(1 + rng() % 39);
    ids[13] = ids[14] = ids[15] = 0;
    bt = {Tensor::from_vector<int32_t>({2, 16}, ids), layout_from_cu_seqlens(16, {{0, 16}, {0, 7, 16}})};
  }
  // The gradient arena of one model_step with these options.
  std::vector<float> grads(StepOptions o) {
    Tensor garena = Tensor::zeros({m.arena.numel()}, DType::f32);
    io::TensorMap g = arena_views(m.table, garena);
    model_step(m, bt, o, g);
    return garena.to_vector<float>();
  }
};

TEST(MoeBalance, CountingAndACoefficientOfZeroLeaveTodaysStepBitIdentical) {
  BalanceCase b;
  const std::vector<float> today = b.grads({});
  StepOptions o;
  o.expert_load = Tensor::zeros({2, 8}, DType::f64);
  o.aux_loss = Tensor::zeros({2}, DType::f64);
  o.aux_sequences = 2;  // moe_aux_coeff 0: off
  EXPECT_EQ(b.grads(o), today);
  EXPECT_EQ(o.aux_loss.to_vector<double>(), std::vector<double>({0, 0}));
  // The load is the count of the chosen experts (model_logits') over the loss rows: not the 3 pad
  // tokens of row 0 (DESIGN.md section 3's mask), so 29 tokens x 3 slots per layer.
  std::vector<Tensor> experts;
  model_logits(b.m, b.bt, nullptr, Comm::self(), &experts);
  const std::vector<int32_t> ids = b.bt.input_ids.to_vector<int32_t>();
  std::vector<double> want(16, 0.0);
  for (int j = 0; j < 2; ++j) {
    const std::vector<int32_t> e = experts[size_t(j + 1)].to_vector<int32_t>();
    for (size_t t = 0; t < ids.size(); ++t)
      for (int i = 0; i < 3 && ids[t] != 0; ++i) want[size_t(j * 8 + e[t * 3 + size_t(i)])] += 1;
  }
  EXPECT_EQ(o.expert_load.to_vector<double>(), want);
  double total = 0;
  for (double v : want) total += v;
  EXPECT_EQ(total, 2 * 29 * 3);
}

TEST(MoeBalance, TheBalanceLossMovesOnlyTheRoutersPath) {
  BalanceCase b;
  const std::vector<float> today = b.grads({});
  StepOptions o;
  o.aux_loss = Tensor::zeros({2}, DType::f64);
  o.moe_aux_coeff = 0.5, o.aux_sequences = 2;
  const std::vector<float> with = b.grads(o);
  // The loss reaches the gates and, through x, everything before them; never the last layer's
  // experts or the head, which it does not read.
  auto differs = [&](const std::string& name) {
    for (const ParamSpec& p : b.m.table) {
      if (p.name != name) continue;
      const int64_t off = b.m.params.at(name).data<float>() - b.m.arena.data<float>(), n = shape_numel(p.shape);
      return !std::equal(today.begin() + off, today.begin() + off + n, with.begin() + off);
    }
    ADD_FAILURE() << name;
    return false;
  };
  EXPECT_TRUE(differs("model.layers.1.mlp.gate.weight"));
  EXPECT_TRUE(differs("model.layers.2.mlp.gate.weight"));
  EXPECT_TRUE(differs("model.layers.0.mlp.up_proj.weight"));  // through x
  EXPECT_FALSE(differs("model.layers.2.mlp.experts.3.up_proj.weight"));
  EXPECT_FALSE(differs("lm_head.weight"));
  EXPECT_FALSE(differs("model.layers.2.mlp.gate.e_score_correction_bias"));
  for (double l : o.aux_loss.to_vector<double>()) EXPECT_GT(l, 0);
}

// ---- a tiny MoE model trains on the CPU -----------------------------------------------------------

TEST(MoeModel, ATinyMoeModelTrainsOnTheCpu) {
  const ModelConfig c = parse_model_config(moe_json(2), "tiny moe");
  ASSERT_FALSE(c.is_moe_layer(0));
  ASSERT_TRUE(c.is_moe_layer(1));
  Model m = build_model(c, {false, false});
  init_model(m, 4);
  const std::string bias = "model.layers.1.mlp.gate.e_score_correction_bias";
  m.params.at(bias).copy_from(Tensor::from_vector<float>({8}, testing::randn(8, 9, 0.1f)));
  const std::vector<float> bias0 = m.params.at(bias).to_vector<float>();
  const std::vector<float> gate0 = m.params.at("model.layers.1.mlp.gate.weight").to_vector<float>();
  std::mt19937_64 rng(3);
  std::vector<int32_t> ids(2 * 16);
  for (auto& v : ids) v = int32_t(1 + rng() % 39);
  const Batch bt{Tensor::from_vector<int32_t>({2, 16}, ids), layout_from_cu_seqlens(16, {{0, 16}, {0, 7, 16}})};
  OptimSettings o;
  o.lr = 1e-2, o.total_steps = 6, o.weight_decay = 0.1;
  Optimizer opt(m, o, false);
  Tensor garena = Tensor::zeros({m.arena.numel()}, DType::f32);
  io::TensorMap grads = arena_views(m.table, garena);
  std::vector<double> losses;
  auto norm = [&](const std::string& name) {
    double n = 0;
    for (float v : grads.at(name).to_vector<float>()) n += double(v) * v;
    return n;
  };
  for (int64_t step = 0; step < 6; ++step) {
    garena.fill_zero();
    losses.push_back(model_step(m, bt, {}, grads).lm_loss);
    ASSERT_TRUE(std::isfinite(losses.back()));
    // The step's gradient reaches the gate (through the weights), the routed and the shared
    // experts, and never the bias.
    for (const char* t : {"gate.weight", "shared_experts.gate_proj.weight"})
      EXPECT_GT(norm(std::string("model.layers.1.mlp.") + t), 0) << t;
    double experts = 0;  // an expert no token chose has none
    for (int e = 0; e < 8; ++e) experts += norm("model.layers.1.mlp.experts." + std::to_string(e) + ".up_proj.weight");
    EXPECT_GT(experts, 0);
    EXPECT_EQ(norm(bias), 0);
    opt.step(m, grads, step);
  }
  EXPECT_LT(losses.back(), losses.front() - 0.1) << "the loss did not fall";
  EXPECT_EQ(m.params.at(bias).to_vector<float>(), bias0);  // not a gradient parameter: it stays
  // Even a gradient written into its slot does not move it: the optimizer skips the bias.
  grads.at(bias).copy_from(Tensor::from_vector<float>({8}, std::vector<float>(8, 1.f)));
  opt.step(m, grads, 6);
  EXPECT_EQ(m.params.at(bias).to_vector<float>(), bias0);
  EXPECT_NE(m.params.at("model.layers.1.mlp.gate.weight").to_vector<float>(), gate0);
  // The memory plan counts the MoE layer's tensors: the model's arena is the plan's parameters.
  MemoryPlan plan;
  plan_parameters(plan, c, m.has_indexer, false, DType::f32);
  EXPECT_EQ(plan.total(), 4 * m.arena.numel());
  // ... and the activation plan the activation table, routing buffers (i32 idx) and per-expert
  // rows included, in each compute dtype.
  for (DType compute : {DType::f32, DType::bf16}) {
    MemoryPlan act;
    plan_activation_table(act, c, {"rows", 2}, {"s", 16}, compute);
    int64_t bytes = 0, ids = 0;
    for (const ActSpec& a : activation_table(c, {2, 16, 16}, compute)) {
      bytes += shape_numel(a.shape) * int64_t(dtype_size(a.dtype));
      ids += a.dtype == DType::i32;
      if (a.name == "layers.1.experts.act") {
        EXPECT_EQ(a.shape, Shape({32, 3 * 6}));
      }
    }
    EXPECT_EQ(act.total(), bytes);
    EXPECT_EQ(ids, 1);
  }
}

}  // namespace
}  // namespace hmla
