// DeepSeek-V4's multi-token-prediction layers in training (docs/deepseek_v4_math.md section 14;
// src/model/v4_mtp.cpp) against the float64 oracle (tests/python/v4_mtp_oracle.py: its fixture
// tests/hf/fixtures/v4_mtp holds three MTP depths, a CSA, an HCA and a sliding block, on the v4
// fixture's stack, its losses and every gradient of L = CE_LM + 0.3 / 3 sum_k CE_k):
// - the LM loss, the MTP loss and all gradients within STYLE.md's rule: twice the oracle's own
//   float32 evaluation's error on the tensor's group (a layer, an MTP depth, the model-wide
//   tensors) plus 8 ulps of the group's largest gradient; indexers and router biases exactly 0;
// - mtp_coeff 0 is today's step bit for bit (the MTP tensors kept, or parameters with zero
//   gradient);
// - a packed row of two documents and padding gives the documents' losses and gradients alone (no
//   MTP input or target crosses a document);
// - a checkpoint with trained MTP layers round-trips in DeepSeek's names, and a checkpoint without
//   them gets them initialised;
// - a hybrid_mla MTP layer (the seed's pattern; fixture tests/hf/fixtures/v4_mtp_hybrid from
//   tests/python/v4_mtp_hybrid_fixture.py) in mha, dsa_warmup and dsa_sparse: losses, the hybrid KL
//   and every gradient within the same rule; its indexer in the table in every mode, initialised
//   where a checkpoint lacks it.
// What wrong code would still pass: an MTP input other than pad at the rows whose targets are not
// counted (they are only ever read by themselves: nothing observable changes).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <unistd.h>
#include <vector>

#include "hmla/model/v4_tables.h"
#include "hmla/ops/nn.h"
#include "v4_fixture.h"

namespace hmla {
namespace {

namespace fs = std::filesystem;
using testing::joined;

const std::string kDir = testing::kV4Dir;
constexpr double kCoeff = 0.3;  // the oracle's LAM
constexpr double kUlp = 0x1p-23;

// The v4 fixture's stack with the oracle's MTP layers, as parameters (mtp_params) or kept.
struct MtpFixture {
  ModelConfig c;
  Model m;
  Batch batch;
  io::TensorMap G = io::load_safetensors(kDir + "v4_mtp/grads.safetensors");
  explicit MtpFixture(bool params = true) {
    c = load_model_config(kDir + "v4_mtp/config.json");
    c.v4.mtp_params = params;
    // The CSA layers run dsa_sparse (the oracle's top-k); the oracle trains no indexer, so the KL's
    // coefficient is 0: its gradient is exactly 0 (test_v4_model.cpp does the same).
    c.indexer_loss_coeff = 0;
    m = build_model(c, v4_indexer_layers(c));
    io::TensorMap w = io::load_safetensors(kDir + "v4/model.safetensors");
    for (auto& [name, t] : io::load_safetensors(kDir + "v4_mtp/mtp.safetensors")) w[name] = t;
    load_checkpoint_into_model(m, checkpoint_forms(std::move(w), {}, c, "v4_mtp fixture"), "v4_mtp fixture");
    const testing::V4Fixture fx;
    batch = fx.batch;
  }
};

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// A gradient's group: its layer (model.layers.L.), its MTP depth (mtp.k.), else the model-wide tensors.
std::string group_of(const std::string& name) {
  for (const std::string pre : {"model.layers.", "mtp."})
    if (name.starts_with(pre)) return name.substr(0, name.find('.', pre.size()) + 1);
  return "model";
}

StepStats step(const Model& m, const Batch& batch, io::TensorMap& grads, Tensor& garena, double coeff,
               int64_t lm_targets = 0, std::vector<int64_t> mtp_targets = {}) {
  garena = Tensor::zeros({m.arena.numel()}, DType::f32);
  grads = arena_views(m.table, garena);
  StepOptions opt;
  opt.mtp_coeff = coeff, opt.lm_targets = lm_targets, opt.mtp_targets = std::move(mtp_targets);
  return model_step(m, batch, opt, grads);
}

TEST(V4Mtp, ConfigReadsTheMtpLayersKindsAndWritesThemBack) {
  const ModelConfig c = load_model_config(kDir + "v4_mtp/config.json");
  ASSERT_EQ(c.form.num_nextn_predict_layers, 3);
  EXPECT_EQ(c.v4.layer_types.size(), 4u);
  EXPECT_EQ(c.v4.mtp_types, (std::vector<V4Kind>{V4Kind::csa, V4Kind::hca, V4Kind::sliding}));
  EXPECT_EQ(c.v4.compress_rate(4), 4);
  EXPECT_EQ(c.v4.compress_rate(5), 8);
  EXPECT_FALSE(c.v4.hash_layer(6));
  const fs::path p = fs::temp_directory_path() / ("hmla_mtp_cfg_" + std::to_string(::getpid()) + ".json");
  save_model_config(p.string(), c);
  const ModelConfig back = load_model_config(p.string());
  fs::remove(p);
  EXPECT_EQ(back.v4.mtp_types, c.v4.mtp_types);
  EXPECT_TRUE(back.v4.mtp_listed);
  // Without the MTP layers' entries: DeepSeek-V4-Flash's MTP layer (sliding, learned routing).
  const ModelConfig v4 = load_model_config(kDir + "v4/config.json");
  EXPECT_TRUE(v4.v4.mtp_types.empty());
}

TEST(V4Mtp, LossAndEveryGradientMatchTheFloat64Oracle) {
  MtpFixture fx;
  const io::TensorMap& G = fx.G;
  Tensor garena;
  io::TensorMap grads;
  const StepStats st = step(fx.m, fx.batch, grads, garena, kCoeff);
  const double mtp = joined(G, "mtp")[0], lm = joined(G, "lm")[0];
  const double mtp_err = std::abs(double(G.at("mtp_f32").to_vector<float>()[0]) - mtp);
  std::printf("MTP loss %.9g, oracle %.9g (bound %.3g); LM loss %.9g, oracle %.9g\n", st.mtp_loss, mtp,
              2 * mtp_err + 8 * kUlp * mtp, st.lm_loss, lm);
  EXPECT_LE(std::abs(st.mtp_loss - mtp), 2 * mtp_err + 8 * kUlp * mtp);
  EXPECT_NEAR(st.lm_loss, lm, 16 * kUlp * lm);  // the stack is V4Model's, checked there within its rule
  std::map<std::string, std::pair<double, double>> group;  // -> (largest f32 error, largest |gradient|)
  for (const ParamSpec& p : fx.m.table) {
    if (!G.count(p.name + "_hi")) continue;
    auto& [e, mag] = group[group_of(p.name)];
    e = std::max(e, double(G.at(p.name + "_f32err").to_vector<float>()[0]));
    mag = std::max(mag, max_abs(joined(G, p.name)));
  }
  double worst = 0, worst_mtp = 0;
  std::string worst_name;
  int checked = 0, zero = 0, mtp_tensors = 0;
  for (const ParamSpec& p : fx.m.table) {
    const std::vector<float> g = grads.at(p.name).to_vector<float>();
    if (!G.count(p.name + "_hi")) {  // the indexers' and the router biases: no gradient
      EXPECT_TRUE(p.name.find(".indexer.") != std::string::npos || p.name.ends_with(".ffn.gate.bias")) << p.name;
      for (float v : g) ASSERT_EQ(v, 0.f) << p.name;
      ++zero;
      continue;
    }
    const std::vector<double> ref = joined(G, p.name);
    ASSERT_EQ(g.size(), ref.size()) << p.name;
    double err = 0;
    for (size_t i = 0; i < ref.size(); ++i) err = std::max(err, std::abs(double(g[i]) - ref[i]));
    const auto [gerr, gmag] = group.at(group_of(p.name));
    // The rounding term scales with what enters (STYLE.md): a weight's gradient is a sum over the
    // batch's N rows, which a sequential f32 sum (the built-in sgemm: hmla's CPU without BLAS) rounds
    // about sqrt(N) times where the oracle's f32 run (torch's blocked sums) rounds a few times; the
    // terms are bounded by the group's largest gradient. Measured without BLAS before this term: the
    // stack's embedding at 1.03 of 2 gerr + 8 ulp. A dropped MTP gradient or a wrong target is
    // O(lambda) of the gradient, some 1e4 times this bound.
    const double bound = 2 * gerr + 8 * kUlp * gmag * std::sqrt(double(fx.batch.input_ids.numel()));
    EXPECT_LE(err, bound) << p.name;
    if (err / bound > worst) worst = err / bound, worst_name = p.name;
    if (is_mtp_tensor(p.name)) worst_mtp = std::max(worst_mtp, err / bound);
    ++checked, mtp_tensors += is_mtp_tensor(p.name);
  }
  std::printf("%d gradients (%d of MTP layers) within the rule (worst %.3g of its bound: %s; of the MTP layers' "
              "%.3g); %d exactly 0\n",
              checked, mtp_tensors, worst, worst_name.c_str(), worst_mtp, zero);
  EXPECT_GT(mtp_tensors, 100);
}

// Coefficient 0 computes nothing new: the same bits as the stack without MTP layers, whether they
// are kept as stored or parameters (then with zero gradients).
TEST(V4Mtp, CoefficientZeroIsTodaysStepBitForBit) {
  testing::V4Fixture today;
  today.m.cfg.indexer_loss_coeff = 0;  // as MtpFixture's
  Tensor g0, g1, g2;
  io::TensorMap m0, m1, m2;
  const StepStats s0 = step(today.m, today.batch, m0, g0, 0);
  MtpFixture kept(false), params(true);
  EXPECT_GT(kept.m.kept.size(), 100u);  // the MTP tensors, as stored
  const StepStats s1 = step(kept.m, kept.batch, m1, g1, 0), s2 = step(params.m, params.batch, m2, g2, 0);
  EXPECT_EQ(s0.lm_loss, s1.lm_loss);
  EXPECT_EQ(s0.lm_loss, s2.lm_loss);
  EXPECT_EQ(s2.mtp_loss, 0.0);
  ASSERT_EQ(g0.numel(), g1.numel());
  EXPECT_EQ(std::memcmp(g0.raw_data(), g1.raw_data(), size_t(g0.nbytes())), 0);
  ASSERT_GT(g2.numel(), g0.numel());  // the stack's tensors first, then the MTP layers'
  EXPECT_EQ(std::memcmp(g0.raw_data(), g2.raw_data(), size_t(g0.nbytes())), 0);
  const std::vector<float> rest = g2.slice(0, g0.numel(), g2.numel()).to_vector<float>();
  for (float v : rest) ASSERT_EQ(v, 0.f);
}

// Packed documents: a row of two documents (13 and 19 tokens, off the rates and the window) and
// padding gives what the documents give alone. With every loss a sum (the target counts set to 1),
// the packed row's losses and gradients are the two documents' sums; an MTP target or input that
// crossed into the other document would add terms. Bound: each run is an f32 evaluation within the
// fixture's relative rule r = (2 e_f32 + 8 ulp m) / m of its group (m: the group's largest
// gradient), so the difference is at most 3 r times the group's largest gradient in the three runs.
TEST(V4Mtp, PackedDocumentsEqualTheDocumentsAlone) {
  MtpFixture fx;
  const int64_t s = fx.batch.input_ids.size(1), a = 13, b = 19;
  const std::vector<int32_t> ids = fx.batch.input_ids.to_vector<int32_t>();
  std::vector<int32_t> row(ids.begin(), ids.begin() + s);
  for (int64_t t = a + b; t < s; ++t) row[size_t(t)] = int32_t(fx.c.pad_token_id);
  Batch packed;
  packed.input_ids = Tensor::from_vector<int32_t>({1, s}, row);
  packed.layout = layout_from_cu_seqlens(s, {{0, a, a + b}});
  const std::vector<int64_t> ones(3, 1);
  Tensor gp;
  io::TensorMap mp;
  const StepStats sp = step(fx.m, packed, mp, gp, kCoeff, 1, ones);
  double lm = 0, mtp = 0;
  std::vector<Tensor> alone;
  for (auto [start, len] : {std::pair<int64_t, int64_t>{0, a}, {a, b}}) {
    Batch one;
    one.input_ids = Tensor::from_vector<int32_t>({1, len}, std::vector<int32_t>(row.begin() + start, row.begin() + start + len));
    one.layout = layout_causal(1, len);
    Tensor g;
    io::TensorMap m;
    const StepStats st = step(fx.m, one, m, g, kCoeff, 1, ones);
    lm += st.lm_loss, mtp += st.mtp_loss;
    alone.push_back(g);
  }
  // Targets: the LM loss counts 12 + 18, depth k 11 - k + 17 - k; a crossing target would add terms.
  EXPECT_EQ(count_lm_targets(packed, fx.c.pad_token_id, 2), 11 + 17);
  std::printf("packed vs alone: LM %.9g vs %.9g, MTP %.9g vs %.9g\n", sp.lm_loss, lm, sp.mtp_loss, mtp);
  EXPECT_NEAR(sp.mtp_loss, mtp, 1e-5 * mtp);
  EXPECT_NEAR(sp.lm_loss, lm, 1e-5 * lm);
  std::map<std::string, std::pair<double, double>> rule;  // group -> (e_f32, magnitude) of the fixture
  for (const ParamSpec& p : fx.m.table) {
    if (!fx.G.count(p.name + "_hi")) continue;
    auto& [e, mag] = rule[group_of(p.name)];
    e = std::max(e, double(fx.G.at(p.name + "_f32err").to_vector<float>()[0]));
    mag = std::max(mag, max_abs(joined(fx.G, p.name)));
  }
  const io::TensorMap va = arena_views(fx.m.table, alone[0]), vb = arena_views(fx.m.table, alone[1]);
  std::map<std::string, double> big;  // group -> the largest |gradient| of the three runs (as the rule's magnitude)
  for (const io::TensorMap* v : std::vector<const io::TensorMap*>{&mp, &va, &vb})
    for (const ParamSpec& p : fx.m.table)
      for (float x : v->at(p.name).to_vector<float>()) big[group_of(p.name)] = std::max(big[group_of(p.name)], double(std::abs(x)));
  double worst = 0;
  for (const ParamSpec& p : fx.m.table) {
    if (!rule.count(group_of(p.name))) continue;
    const auto [e, mag] = rule.at(group_of(p.name));
    const std::vector<float> P = mp.at(p.name).to_vector<float>(), A = va.at(p.name).to_vector<float>(),
                             B = vb.at(p.name).to_vector<float>();
    double err = 0;
    for (size_t i = 0; i < P.size(); ++i) err = std::max(err, std::abs(double(P[i]) - double(A[i]) - double(B[i])));
    const double bound = 3 * (2 * e + 8 * kUlp * mag) / mag * big.at(group_of(p.name));
    EXPECT_LE(err, bound) << p.name;
    if (bound > 0) worst = std::max(worst, err / bound);
  }
  std::printf("packed vs alone: every gradient within its bound (worst %.3g of it)\n", worst);
}

struct TmpDir {
  fs::path path;
  explicit TmpDir(const std::string& tag)
      : path(fs::temp_directory_path() / ("hmla_mtp_" + tag + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TmpDir() { fs::remove_all(path); }
};

// A trained MTP layer's checkpoint: DeepSeek's names (mtp.{i}.*, attn.kv_norm), f32, the table's
// shapes; read back as parameters it is the same arena, read by a run that does not train them it
// is kept and written back byte for byte. A checkpoint without MTP layers gets them initialised.
TEST(V4Mtp, TrainedMtpLayersRoundTripInDeepSeeksNames) {
  MtpFixture fx;
  Tensor g;
  io::TensorMap grads;
  step(fx.m, fx.batch, grads, g, kCoeff);
  // a "trained" model: the weights moved by their gradient
  const Tensor arena = fx.m.arena.view({1, fx.m.arena.numel()});
  axpy(arena, -0.1f, g.view({1, g.numel()}), arena);
  TmpDir dir("roundtrip");
  save_model_weights(dir.path.string(), fx.m);
  const io::TensorMap file = io::load_safetensors((dir.path / "model.safetensors").string());
  int mtp = 0;
  for (const ParamSpec& p : fx.m.table) {
    if (!is_mtp_tensor(p.name)) continue;
    ++mtp;
    ASSERT_TRUE(file.count(p.name)) << p.name;
    EXPECT_EQ(file.at(p.name).shape(), p.shape) << p.name;
    EXPECT_EQ(file.at(p.name).dtype(), DType::f32) << p.name;
  }
  EXPECT_TRUE(file.count("mtp.0.attn.kv_norm.weight") && file.count("mtp.2.e_proj.weight") &&
              file.count("mtp.1.hc_head_fn") && file.count("mtp.0.attn.indexer.wq_b.weight"));
  for (const auto& [name, t] : file) EXPECT_FALSE(name.starts_with("model.mtp.")) << name;
  Model back = build_model(fx.c, v4_indexer_layers(fx.c));
  EXPECT_TRUE(load_checkpoint_into_model(back, read_checkpoint(dir.path.string(), fx.c), "roundtrip").empty());
  EXPECT_EQ(std::memcmp(back.arena.raw_data(), fx.m.arena.raw_data(), size_t(fx.m.arena.nbytes())), 0);
  // Kept by a model that does not train them, then written again: the same bytes.
  ModelConfig kept_cfg = fx.c;
  kept_cfg.v4.mtp_params = false;
  Model kept = build_model(kept_cfg, v4_indexer_layers(kept_cfg));
  load_checkpoint_into_model(kept, read_checkpoint(dir.path.string(), kept_cfg), "roundtrip");
  EXPECT_EQ(int(kept.kept.size()), mtp);
  TmpDir again("again");
  save_model_weights(again.path.string(), kept);
  EXPECT_EQ(io::read_file((again.path / "model.safetensors").string()), io::read_file((dir.path / "model.safetensors").string()));
  // A checkpoint without them (transformers saves none): initialised, named.
  Model fresh = build_model(fx.c, v4_indexer_layers(fx.c));
  const std::vector<std::string> init =
      load_checkpoint_into_model(fresh, read_checkpoint(kDir + "v4/model.safetensors", fx.c), "v4", 7);
  EXPECT_EQ(int(init.size()), mtp);
  EXPECT_EQ(fresh.params.at("mtp.1.hnorm.weight").to_vector<float>(), std::vector<float>(size_t(fx.c.hidden_size), 1.f));
  EXPECT_EQ(fresh.params.at("mtp.0.attn.attn_sink").to_vector<float>(), std::vector<float>(4, 0.f));
}

// --- a hybrid_mla MTP layer (the seed's pattern) -------------------------------------------------

// tests/hf/fixtures/v4_mtp_hybrid (tests/python/v4_mtp_hybrid_fixture.py): the v4_hybrid stack
// (HCA, hybrid_mla, CSA, hybrid_mla) with one hybrid_mla MTP layer, L = CE_LM + 0.3 CE_0 +
// indexer_loss_coeff (KL_1 + KL_3 + KL_mtp), per mode of the hybrid layers and the MTP layer.
struct HybridMtpFixture {
  const std::string dir = kDir + "v4_mtp_hybrid/";
  ModelConfig c = load_model_config(dir + "config.json");
  io::TensorMap F = io::load_safetensors(dir + "fixture.safetensors");
  io::TensorMap w = io::load_safetensors(kDir + "v4_hybrid/model.safetensors");
  Batch batch;
  HybridMtpFixture() {
    c.v4.mtp_params = true;
    for (auto& [name, t] : io::load_safetensors(dir + "model.safetensors")) w[name] = t;
    batch = testing::causal_batch(F.at("input_ids"));
  }
  // The stack's hybrid layers and the MTP layer in `mode` (as a programme's phase sets them), the CSA
  // layer over its top-k as the oracle computes it, the others mha.
  Model model(LayerMode mode) const {
    ModelConfig mc = c;
    std::vector<bool> indexer;
    for (int64_t L = 0; L < c.num_hidden_layers; ++L) {
      const bool csa = c.v4.layer_types[size_t(L)] == V4Kind::csa, hybrid = c.v4.is_hybrid_mla(L);
      mc.layer_modes[size_t(L)] = hybrid ? mode : csa ? LayerMode::dsa_sparse : LayerMode::mha;
      indexer.push_back(csa || hybrid);
    }
    mc.mtp_mode = mode;
    Model m = build_model(mc, indexer);
    load_into_model(m, w, "v4_mtp_hybrid fixture");
    return m;
  }
  double bound(const std::string& name) const { return testing::fixture_f32_bound(F, name); }
};

// The hybrid_mla MTP layer runs each mode as the stack's hybrid layers (DESIGN.md section 10) and
// trains its indexer by its KL, counted with theirs (indexer_kl_hybrid: the mean over the three):
// the LM and MTP losses, the KL and every gradient within STYLE.md's rule of the float64 oracle (the
// bounds as LossAndEveryGradientMatchTheFloat64Oracle's: 2 e_f32 of the group plus the rounding of
// the N rows a weight's gradient sums). dsa_warmup (no backbone: the programme's indexer-only step)
// gives the indexers' gradients only, the MTP layer's included; mha gives the indexers none. The CSA
// layer's indexer trains by its own KL, which the oracle leaves out (tests/hf/test_v4_csa.cpp).
// Planted bugs caught: the MTP layer in mha whatever the phase, its indexer left out of dsa_warmup.
TEST(V4Mtp, AHybridMlaMtpLayerMatchesTheFloat64OracleInEachMode) {
  const HybridMtpFixture fx;
  const int64_t rows = fx.batch.input_ids.numel();
  for (LayerMode mode : {LayerMode::mha, LayerMode::dsa_warmup, LayerMode::dsa_sparse}) {
    const std::string M = mode_name(mode);
    const Model m = fx.model(mode);
    Tensor garena = Tensor::zeros({m.arena.numel()}, DType::f32);
    io::TensorMap grads = arena_views(m.table, garena);
    StepOptions opt;
    opt.mtp_coeff = kCoeff, opt.backbone = mode != LayerMode::dsa_warmup;
    const StepStats st = model_step(m, fx.batch, opt, grads);
    const double lm = joined(fx.F, M + ".lm")[0], mtp = joined(fx.F, M + ".mtp")[0];
    EXPECT_LE(std::abs(st.lm_loss - lm), fx.bound(M + ".lm")) << M;
    if (opt.backbone) {
      std::printf("%s: MTP loss %.9g, oracle %.9g (error %.3g, bound %.3g)\n", M.c_str(), st.mtp_loss, mtp,
                  std::abs(st.mtp_loss - mtp), fx.bound(M + ".mtp"));
      EXPECT_LE(std::abs(st.mtp_loss - mtp), fx.bound(M + ".mtp")) << M;
    }
    if (is_dsa(mode)) {
      const std::vector<double> kl = joined(fx.F, M + ".kl");
      ASSERT_EQ(kl.size(), 3u);
      const double want = (kl[0] + kl[1] + kl[2]) / 3, err = std::abs(st.indexer_kl_hybrid - want);
      std::printf("%s: indexer_kl_hybrid %.9g, oracle %.9g (error %.3g, bound %.3g)\n", M.c_str(), st.indexer_kl_hybrid,
                  want, err, fx.bound(M + ".kl"));
      EXPECT_LE(err, fx.bound(M + ".kl")) << M;
    }
    std::map<std::string, std::pair<double, double>> group;  // -> (largest f32 error, largest |gradient|)
    for (const ParamSpec& p : m.table) {
      const std::string key = M + ".grad." + p.name;
      if (!fx.F.count(key + "_hi")) continue;
      auto& [e, mag] = group[group_of(p.name)];
      e = std::max(e, double(fx.F.at(key + "_f32err").to_vector<float>()[0]));
      mag = std::max(mag, max_abs(joined(fx.F, key)));
    }
    double worst = 0;
    std::string worst_name;
    int checked = 0, mtp_tensors = 0, mtp_indexer = 0;
    for (const ParamSpec& p : m.table) {
      if (p.name.find(".attn.indexer.") != std::string::npos) continue;  // the CSA layer's (its own KL)
      const std::string key = M + ".grad." + p.name;
      const std::vector<float> g = grads.at(p.name).to_vector<float>();
      if (!fx.F.count(key + "_hi")) {  // no gradient: router biases, mha's indexers, dsa_warmup's backbone
        for (float v : g) ASSERT_EQ(v, 0.f) << M << ": " << p.name;
        continue;
      }
      const std::vector<double> ref = joined(fx.F, key);
      ASSERT_EQ(g.size(), ref.size()) << p.name;
      double err = 0;
      for (size_t i = 0; i < ref.size(); ++i) err = std::max(err, std::abs(double(g[i]) - ref[i]));
      const auto [gerr, gmag] = group.at(group_of(p.name));
      const double bound = 2 * gerr + 8 * kUlp * gmag * std::sqrt(double(rows));
      EXPECT_LE(err, bound) << M << ": " << p.name;
      if (err / bound > worst) worst = err / bound, worst_name = p.name;
      ++checked, mtp_tensors += is_mtp_tensor(p.name);
      mtp_indexer += p.name.starts_with("mtp.0.self_attn.indexer.");
    }
    std::printf("%s: %d gradients (%d of the MTP layer, %d of its indexer) within the rule (worst %.3g of its "
                "bound: %s)\n",
                M.c_str(), checked, mtp_tensors, mtp_indexer, worst, worst_name.c_str());
    EXPECT_EQ(mtp_indexer, mode == LayerMode::mha ? 0 : 5) << M;
    EXPECT_GE(mtp_tensors, mode == LayerMode::dsa_warmup ? 5 : 40) << M;
  }
}

// The hybrid_mla MTP layer's names are the same in every phase (its indexer always in the table);
// a checkpoint that holds the layer without its indexer (a run that kept it as stored) gets the
// indexer initialised (k_norm 1 and 0, matrices N(0, initializer_range)), the rest loaded.
TEST(V4Mtp, AHybridMlaMtpLayersIndexerIsAlwaysThereAndInitialisedWhenMissing) {
  const HybridMtpFixture fx;
  const Model mha = fx.model(LayerMode::mha), sparse = fx.model(LayerMode::dsa_sparse);
  ASSERT_EQ(mha.table.size(), sparse.table.size());
  for (size_t i = 0; i < mha.table.size(); ++i) EXPECT_EQ(mha.table[i].name, sparse.table[i].name);
  io::TensorMap w = fx.w;
  for (auto it = w.begin(); it != w.end();) it = it->first.starts_with("mtp.0.self_attn.indexer.") ? w.erase(it) : std::next(it);
  Model m = fx.model(LayerMode::dsa_warmup);
  const std::vector<std::string> init = load_checkpoint_into_model(m, checkpoint_forms(std::move(w), {}, m.cfg, "no indexer"),
                                                                   "no indexer", 7);
  EXPECT_EQ(init.size(), 5u);
  for (const std::string& n : init) EXPECT_TRUE(n.starts_with("mtp.0.self_attn.indexer.")) << n;
  EXPECT_EQ(m.params.at("mtp.0.self_attn.indexer.k_norm.weight").to_vector<float>(),
            std::vector<float>(size_t(fx.c.index_head_dim), 1.f));
  EXPECT_EQ(m.params.at("mtp.0.self_attn.q_a_proj.weight").to_vector<float>(),
            fx.w.at("mtp.0.self_attn.q_a_proj.weight").to_vector<float>());
}

}  // namespace
}  // namespace hmla
