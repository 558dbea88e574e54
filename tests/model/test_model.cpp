// The whole model: parameter table and arena, loading, and gradients against finite differences
// of the LM loss along each tensor's own gradient direction.
#include <gtest/gtest.h>

#include <functional>
#include <random>

#include <cmath>

#include "hmla/model/indexer.h"
#include "hmla/model/model.h"
#include "testing.h"
#include "tiny_config.h"

namespace hmla {
namespace {

ModelConfig tiny(const std::vector<std::string>& modes, bool tie = false) {
  testing::TinyConfig t;
  t.modes = modes, t.tie = tie;
  return testing::tiny_config(t);
}

Batch batch(int64_t b, int64_t s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids(b * s);
  for (auto& x : ids) x = int32_t(1 + rng() % 39);
  ids[5] = 0;  // a pad token inside a document
  return {Tensor::from_vector<int32_t>({b, s}, ids), layout_from_cu_seqlens(s, std::vector<std::vector<int64_t>>(b, {0, 9, 10, s - 2}))};
}

TEST(Model, TableArenaAndMoeLayers) {
  ModelConfig c = tiny({"mha", "dsa_warmup"});
  Model m = build_model(c, {false, true});
  EXPECT_EQ(m.arena.numel(), table_numel(m.table));
  EXPECT_EQ(m.params.at("model.layers.1.self_attn.indexer.wk.weight").shape(), Shape({8, 32}));
  EXPECT_FALSE(m.params.count("model.layers.0.self_attn.indexer.wk.weight"));
  EXPECT_THROW(build_model(c, {false, false}), ConfigError);  // dsa layer without indexer
  nlohmann::json j = model_config_to_json(c);
  // A MoE layer (mlp_layer_types) has transformers' tensors instead of the dense MLP's.
  j["mlp_layer_types"] = {"dense", "sparse"};
  j["n_routed_experts"] = 4, j["n_group"] = 2, j["topk_group"] = 1, j["num_experts_per_tok"] = 2;
  j["moe_intermediate_size"] = 6, j["n_shared_experts"] = 1;
  const Model moe = build_model(parse_model_config(j, "moe"), {false, true});
  EXPECT_EQ(moe.params.at("model.layers.1.mlp.gate.weight").shape(), Shape({4, 32}));
  EXPECT_EQ(moe.params.at("model.layers.1.mlp.gate.e_score_correction_bias").shape(), Shape({4}));
  EXPECT_EQ(moe.params.at("model.layers.1.mlp.experts.3.down_proj.weight").shape(), Shape({32, 6}));
  EXPECT_EQ(moe.params.at("model.layers.1.mlp.shared_experts.up_proj.weight").shape(), Shape({6, 32}));
  EXPECT_FALSE(moe.params.count("model.layers.1.mlp.gate_proj.weight"));
  EXPECT_TRUE(moe.params.count("model.layers.0.mlp.gate_proj.weight"));
  EXPECT_EQ(moe.w.layers[1].moe.experts.size(), 4u);
}

// The activations come from one arena of activation_table, and the memory plan counts exactly
// that table, before anything is allocated (tests/model/test_activation_arena.cpp: and the forward
// allocates exactly it). In each compute dtype: with bf16 (CUDA's), the residual stream (embed,
// h_mid, out) and the statistics stay f32 and every other field outside the attention takes 2
// bytes; the attention's rows are mla_fields', after each layer's own.
TEST(Model, TheActivationPlanCountsTheActivationTable) {
  const ModelConfig c = tiny({"mha", "dsa_warmup"});
  for (DType compute : {DType::f32, DType::bf16}) {
    MemoryPlan plan;
    plan_activation_table(plan, c, {"rows", 3}, {"s", 17}, compute);
    const std::vector<ActSpec> t = activation_table(c, {3, 17, 17}, compute);
    int64_t bytes = 0, exact = 0;
    size_t attn = 0;
    for (int64_t L = 0; L < c.num_hidden_layers; ++L) attn += mla_fields(c, L, 3, 17, 17, compute, false).size();
    for (const ActSpec& a : t) {
      bytes += shape_numel(a.shape) * int64_t(dtype_size(a.dtype));
      if (a.name.find(".attn.") != std::string::npos) continue;
      const bool layer = a.name.starts_with("layers.");
      const bool stays_f32 = a.name == "embed" || (layer && (a.name.ends_with(".h_mid") || a.name.ends_with(".out"))) ||
                             a.name.find("rstd") != std::string::npos;
      EXPECT_EQ(a.dtype, stays_f32 ? DType::f32 : compute) << a.name;
      exact += stays_f32;
    }
    EXPECT_EQ(plan.total(), bytes);
    EXPECT_EQ(exact, 1 + 4 * c.num_hidden_layers + 1);
    EXPECT_EQ(t.size(), size_t(3 + 9 * c.num_hidden_layers) + attn);
    EXPECT_EQ(t[1 + 9].name, "layers.0.attn.q");  // after layer 0's own and its MLP's
    EXPECT_EQ(t.front().name, "embed");
    EXPECT_EQ(t.back().shape, Shape({3 * 17}));
  }
}

// Moves tensor `name` by +-eps along a unit direction d: the loss's slope there must be g . d
// (central difference; 2% of |g| plus an absolute floor for the curvature over 2 eps). Two
// directions: g / |g| (the slope is |g|) and a fixed random one, so that a gradient that is missing
// (all zero) or points the wrong way fails wherever the loss does move.
template <class Loss>
void expect_slope_is_gradient_norm(Model& m, const io::TensorMap& grads, const std::string& name, Loss loss,
                                   const std::string& what) {
  float* w = m.params.at(name).data<float>();
  const float* g = grads.at(name).data<float>();
  const int64_t n = m.params.at(name).numel();
  double norm = 0;
  for (int64_t i = 0; i < n; ++i) norm += double(g[i]) * g[i];
  norm = std::sqrt(norm);
  std::mt19937_64 rng(std::hash<std::string>{}(name));
  std::normal_distribution<double> nd;
  std::vector<double> rnd(static_cast<size_t>(n));
  double rn = 0;
  for (double& x : rnd) x = nd(rng), rn += x * x;
  for (double& x : rnd) x /= std::sqrt(rn);
  const double eps = 2e-2;
  const std::vector<float> w0(w, w + n);
  auto slope = [&](auto dir) {  // central difference along dir(i)
    for (int64_t i = 0; i < n; ++i) w[i] = w0[i] + float(eps * dir(i));
    const double lp = loss();
    for (int64_t i = 0; i < n; ++i) w[i] = w0[i] - float(eps * dir(i));
    const double lm = loss();
    std::copy(w0.begin(), w0.end(), w);
    return (lp - lm) / (2 * eps);
  };
  double g_dot_r = 0;
  for (int64_t i = 0; i < n; ++i) g_dot_r += double(g[i]) * rnd[size_t(i)];
  EXPECT_NEAR(slope([&](int64_t i) { return rnd[size_t(i)]; }), g_dot_r, 0.02 * norm + 2e-4) << what << " (random direction)";
  if (norm > 0) {
    EXPECT_NEAR(slope([&](int64_t i) { return g[i] / norm; }), norm, 0.02 * norm + 2e-4) << what;
  }
}

TEST(Model, GradientsMatchFiniteDifferences) {
  for (bool tie : {false, true}) {
    ModelConfig c = tiny({"mha", "mqa_full_causal"}, tie);
    Model m = build_model(c, {false, false});
    init_model(m, 3);
    Batch bt = batch(2, 24, 4);
    Tensor garena = Tensor::zeros({m.arena.numel()}, DType::f32);
    io::TensorMap grads = arena_views(m.table, garena);
    StepStats st = model_step(m, bt, {}, grads);
    EXPECT_GT(st.lm_loss, 3.0);
    auto loss = [&] {
      Tensor scratch = Tensor::zeros({m.arena.numel()}, DType::f32);
      io::TensorMap g = arena_views(m.table, scratch);
      return model_step(m, bt, {}, g).lm_loss;
    };
    for (const ParamSpec& p : m.table)
      expect_slope_is_gradient_norm(m, grads, p.name, loss, p.name + (tie ? " (tied)" : ""));
  }
}

// GLM-5's IndexShare in dsa_sparse: layer 1 ("shared") attends over layer 0's table, so the LM
// loss is a smooth function of the backbone while the tables stay put (s = 24 > index_topk = 4:
// the selection decides), and the backbone's gradients are its slopes, through the shared layer
// too. Left out: the indexers' tensors (trained by their KL, not the LM loss) and what feeds layer
// 0's indexer (the embedding, input_layernorm, q_a_proj, q_a_layernorm): moving them moves the
// table, where the loss is not differentiable (at eps = 2e-2 along the gradient q_a_proj does).
TEST(Model, GradientsThroughASharedIndexerLayerMatchFiniteDifferences) {
  testing::TinyConfig t;
  t.modes = {"dsa_sparse", "dsa_sparse"};
  nlohmann::json j = testing::tiny_config_json(t);
  j["model_type"] = "glm_moe_dsa", j["indexer_types"] = {"full", "shared"}, j["first_k_dense_replace"] = 2;
  const ModelConfig c = parse_model_config(j, "glm");
  Model m = build_model(c, {true, true});
  init_model(m, 5);
  Batch bt = batch(2, 24, 6);
  Tensor garena = Tensor::zeros({m.arena.numel()}, DType::f32);
  io::TensorMap grads = arena_views(m.table, garena);
  model_step(m, bt, {}, grads);
  auto loss = [&] {
    Tensor scratch = Tensor::zeros({m.arena.numel()}, DType::f32);
    io::TensorMap g = arena_views(m.table, scratch);
    return model_step(m, bt, {}, g).lm_loss;
  };
  auto feeds_the_table = [](const std::string& n) {
    return n.find(".indexer.") != std::string::npos || n == "model.embed_tokens.weight" ||
           n == "model.layers.0.input_layernorm.weight" || n.starts_with("model.layers.0.self_attn.q_a_");
  };
  for (const ParamSpec& p : m.table)
    if (!feeds_the_table(p.name)) expect_slope_is_gradient_norm(m, grads, p.name, loss, p.name);
}

// StepOptions::lm_targets is the step's global target count (micro-batches, data and context
// parallelism): the LM loss and every gradient are this batch's sums over its targets divided by
// it. Twice this batch's count halves them exactly (scaling by a power of two commutes with f32
// rounding while nothing is subnormal), so the comparison is bit for bit.
TEST(Model, TheGlobalTargetCountDividesTheLossAndEveryGradient) {
  const ModelConfig c = tiny({"mha"});
  Model m = build_model(c, {false});
  init_model(m, 3);
  const Batch bt = batch(2, 24, 4);
  const int64_t n = count_lm_targets(bt, c.pad_token_id);
  ASSERT_GT(n, 10);
  auto step = [&](int64_t lm_targets, std::vector<float>& grad) {
    Tensor garena = Tensor::zeros({m.arena.numel()}, DType::f32);
    io::TensorMap g = arena_views(m.table, garena);
    StepOptions o;
    o.lm_targets = lm_targets;
    const double loss = model_step(m, bt, o, g).lm_loss;
    grad = garena.to_vector<float>();
    return loss;
  };
  std::vector<float> g_local, g_given, g_twice;
  const double local = step(0, g_local), given = step(n, g_given), twice = step(2 * n, g_twice);
  EXPECT_EQ(given, local);
  EXPECT_EQ(2 * twice, local);
  EXPECT_EQ(g_given, g_local);
  int64_t off = 0;
  for (size_t i = 0; i < g_local.size(); ++i) off += 2 * g_twice[i] != g_local[i];
  EXPECT_EQ(off, 0) << "of " << g_local.size() << " gradient entries, " << off << " are not halved";
}

// A vocabulary large enough that the LM head runs in chunks of rows (model_internal.h: 2^25 logits
// per chunk, 479 rows of 70000, so 600 rows are two chunks): the loss matches the cross-entropy of
// the full logits (model_logits, summed here in float64), the head's and the final norm's
// gradients match finite differences, and the step never holds the [tokens, vocab] logits
// (600 x 70000 f32 = 168 MB) whole.
TEST(Model, TheLmHeadRunsInChunksOfRows) {
  testing::TinyConfig t;
  t.vocab = 70000, t.indexer = std::nullopt, t.max_positions = 256;
  const ModelConfig c = testing::tiny_config(t, "big vocab");
  Model m = build_model(c, {false});
  init_model(m, 5);
  const Batch bt = batch(4, 150, 8);
  const int64_t N = 600, V = 70000;
  const Tensor logits = model_logits(m, bt);
  const std::vector<float> lg = logits.to_vector<float>();
  const std::vector<int32_t> ids = bt.input_ids.to_vector<int32_t>();
  const std::vector<int32_t> de = bt.layout.doc_end.to_vector<int32_t>();
  double want = 0;
  int64_t targets = 0;
  for (int64_t n = 0; n < N; ++n) {  // row n predicts ids[n + 1] inside its document (not a pad)
    const int64_t t = n % 150;
    if (bt.layout.is_padding(n / 150, t) || t + 1 >= de[n] || ids[n + 1] == 0) continue;
    double mx = -INFINITY, z = 0;
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, double(lg[n * V + v]));
    for (int64_t v = 0; v < V; ++v) z += std::exp(double(lg[n * V + v]) - mx);
    want += mx + std::log(z) - double(lg[n * V + ids[n + 1]]);
    ++targets;
  }
  want /= double(targets);
  Tensor garena = Tensor::zeros({m.arena.numel()}, DType::f32);
  io::TensorMap grads = arena_views(m.table, garena);
  Allocator& a = allocator(Device::cpu);
  const size_t live = a.live_bytes();
  a.reset_peak();
  const StepStats st = model_step(m, bt, {}, grads);
  const size_t step_peak = a.peak_bytes() - live;
  // Each row's loss carries its log-sum-exp rounding in f32 (a few ulps of its magnitude, ~log V),
  // and at this width the f32 exps' sum (cross_entropy.cpp: at most 2 + 256 ulps of z, relative,
  // so ~1.5e-5 absolute in lse; 64 ulps x log V is 8.5e-5).
  EXPECT_NEAR(st.lm_loss, want, 64 * FLT_EPSILON * std::log(double(V)));
  EXPECT_LT(step_peak, size_t(N * V * 4)) << "the step held " << step_peak << " bytes";
  auto loss = [&] {
    Tensor scratch = Tensor::zeros({m.arena.numel()}, DType::f32);
    io::TensorMap g = arena_views(m.table, scratch);
    return model_step(m, bt, {}, g).lm_loss;
  };
  for (const char* name : {"lm_head.weight", "model.norm.weight"}) expect_slope_is_gradient_norm(m, grads, name, loss, name);
}

TEST(Model, LoadRoundTripAndErrors) {
  ModelConfig c = tiny({"mha", "dsa_sparse"});
  Model a = build_model(c, {false, true}), b = build_model(c, {false, true});
  init_model(a, 1);
  load_into_model(b, a.params, "a");
  EXPECT_EQ(0, std::memcmp(a.arena.raw_data(), b.arena.raw_data(), a.arena.nbytes()));
  io::TensorMap missing = a.params;
  missing.erase("model.norm.weight");
  EXPECT_THROW(load_into_model(b, missing, "ckpt"), IoError);
  io::TensorMap bad = a.params;
  bad["model.norm.weight"] = Tensor::zeros({3}, DType::f32);
  EXPECT_THROW(load_into_model(b, bad, "ckpt"), IoError);
  // The indexer may be allowed to be missing (entering dsa_warmup from a phase-1 checkpoint).
  io::TensorMap no_idx;
  for (auto& [n, t] : a.params)
    if (n.find("indexer.") == std::string::npos) no_idx[n] = t;
  std::vector<std::string> idx_names;
  for (auto& p : b.table)
    if (p.name.find("indexer.") != std::string::npos) idx_names.push_back(p.name);
  EXPECT_NO_THROW(load_into_model(b, no_idx, "ckpt", idx_names));
}

// README: a tensor a command would ignore is an error. A checkpoint with a layer, a sink or an
// indexer the config does not have is refused before anything is copied, naming the first few.
TEST(Model, LoadRefusesTensorsTheConfigDoesNotHave) {
  ModelConfig two = tiny({"mha", "dsa_sparse"}), one = tiny({"mha"});
  Model a = build_model(two, {false, true}), b = build_model(one, {false});
  init_model(a, 2);
  const std::vector<float> before = b.arena.to_vector<float>();
  try {
    load_into_model(b, a.params, "ckpt");
    ADD_FAILURE() << "a 2-layer checkpoint loaded into a 1-layer model";
  } catch (const IoError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("tensors the config's model does not have ('model.layers.1.input_layernorm.weight', "),
              std::string::npos) << msg;
    EXPECT_NE(msg.find(" more)"), std::string::npos) << msg;
  }
  EXPECT_EQ(b.arena.to_vector<float>(), before);  // nothing copied
  // Indexer tensors on a layer without one (here layer 1 as mha) and a sink without attention_sink.
  Model c = build_model(tiny({"mha", "mha"}), {false, false});
  EXPECT_THROW(load_into_model(c, a.params, "ckpt"), IoError);
  io::TensorMap sink = b.params;
  sink["model.layers.0.self_attn.softmax_offset"] = Tensor::zeros({2}, DType::f32);
  EXPECT_THROW(load_into_model(b, sink, "ckpt"), IoError);
  io::TensorMap nan = b.params;
  nan["model.norm.weight"] = Tensor::from_vector<float>({32}, std::vector<float>(32, NAN));
  EXPECT_THROW(load_into_model(b, nan, "ckpt"), IoError);
}

TEST(Model, DsaStepsRunAndIndexerOnlySkipsTheBackbone) {
  ModelConfig c = tiny({"dsa_warmup", "dsa_sparse"});
  Model m = build_model(c, {true, true});
  init_model(m, 5);
  Batch bt = batch(1, 30, 6);
  Tensor ga = Tensor::zeros({m.arena.numel()}, DType::f32), gb = Tensor::zeros({m.arena.numel()}, DType::f32);
  io::TensorMap full = arena_views(m.table, ga), only = arena_views(m.table, gb);
  StepStats a = model_step(m, bt, {}, full);
  StepOptions o;
  o.backbone = false;
  StepStats b = model_step(m, bt, o, only);
  EXPECT_GT(a.indexer_kl, 0.0);
  EXPECT_EQ(a.indexer_kl, b.indexer_kl);
  for (const ParamSpec& p : m.table) {
    const Tensor& x = only.at(p.name);
    double sum = 0;
    for (int64_t i = 0; i < x.numel(); ++i) sum += std::abs(x.data<float>()[i]);
    if (p.name.find("indexer.") != std::string::npos)
      EXPECT_EQ(0, std::memcmp(x.raw_data(), full.at(p.name).raw_data(), x.nbytes())) << p.name;
    else
      EXPECT_EQ(sum, 0.0) << p.name;
  }
}

// Recomputing the attention core changes no bit of any gradient, the indexers' included.
TEST(Model, RecomputationIsBitIdentical) {
  ModelConfig c = tiny({"dsa_warmup", "dsa_sparse"});
  Model m = build_model(c, {true, true});
  init_model(m, 8);
  Batch bt = batch(2, 20, 9);
  Tensor ga = Tensor::zeros({m.arena.numel()}, DType::f32), gb = Tensor::zeros({m.arena.numel()}, DType::f32);
  io::TensorMap a = arena_views(m.table, ga), b = arena_views(m.table, gb);
  StepOptions o;
  StepStats sa = model_step(m, bt, o, a);
  o.recompute_attention = true;
  StepStats sb = model_step(m, bt, o, b);
  EXPECT_EQ(sa.lm_loss, sb.lm_loss);
  EXPECT_EQ(sa.indexer_kl, sb.indexer_kl);
  EXPECT_EQ(0, std::memcmp(ga.raw_data(), gb.raw_data(), ga.nbytes()));
}

}  // namespace
}  // namespace hmla
