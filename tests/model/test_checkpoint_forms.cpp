// Checkpoint forms (params.h, docs/moe.md "Real checkpoints"): fused experts load to the model the
// per-expert form loads (bit-equal logits), FP8 block-scale weights dequantize at read time, the
// multi-token-prediction layers are set aside as stored, and the config's quantization_config and
// num_nextn_predict_layers are read, checked and written as README says.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "hmla/io/checkpoint_forms.h"
#include "hmla/model/model.h"
#include "testing.h"
#include "tiny_config.h"

namespace hmla {
namespace {

using nlohmann::json;

json moe_json() {
  testing::TinyConfig t;
  t.modes = {"mha", "mha"};
  json j = testing::tiny_config_json(t);
  j["first_k_dense_replace"] = 1;
  j["n_routed_experts"] = 8, j["n_group"] = 4, j["topk_group"] = 2, j["num_experts_per_tok"] = 3;
  j["moe_intermediate_size"] = 6, j["n_shared_experts"] = 1;
  return j;
}

Model tiny_moe(const ModelConfig& c, uint64_t seed) {
  Model m = build_model(c, std::vector<bool>(c.num_hidden_layers, false));
  init_model(m, seed);
  return m;
}

// Layer L's experts in transformers' fused form: gate_up_proj[e] = [gate; up], down_proj[e] = down.
io::TensorMap fused(const Model& m, int64_t L) {
  io::TensorMap w;
  for (const auto& [name, t] : m.params) w[name] = t.clone();
  const int64_t E = m.cfg.moe.n_routed_experts, I = m.cfg.moe.moe_intermediate_size, H = m.cfg.hidden_size;
  const std::string pre = "model.layers." + std::to_string(L) + ".mlp.experts.";
  Tensor gu = Tensor::empty({E, 2 * I, H}, DType::f32), dn = Tensor::empty({E, H, I}, DType::f32);
  for (int64_t e = 0; e < E; ++e) {
    const std::string x = pre + std::to_string(e) + ".";
    float* g = gu.data<float>() + e * 2 * I * H;
    std::memcpy(g, w.at(x + "gate_proj.weight").data<float>(), I * H * 4);
    std::memcpy(g + I * H, w.at(x + "up_proj.weight").data<float>(), I * H * 4);
    std::memcpy(dn.data<float>() + e * H * I, w.at(x + "down_proj.weight").data<float>(), H * I * 4);
    for (const char* p : {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}) w.erase(x + p);
  }
  w[pre + "gate_up_proj"] = gu;
  w[pre + "down_proj"] = dn;
  return w;
}

Batch tokens(int64_t s) {
  std::vector<int32_t> ids(size_t(2 * s));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 37 + 11) % 40);  // the tiny vocabulary
  return {Tensor::from_vector<int32_t>({2, s}, ids), layout_causal(2, s)};
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

std::string io_error(const io::TensorMap& w, const ModelConfig& c) {
  try {
    checkpoint_forms(w, {}, c, "ck");
  } catch (const IoError& e) {
    return e.what();
  }
  return "accepted";
}

TEST(CheckpointForms, FusedExpertsLoadAsThePerExpertForm) {
  const ModelConfig c = parse_model_config(moe_json(), "cfg");
  const Model a = tiny_moe(c, 5);
  Model b = build_model(c, {false, false});
  CheckpointTensors ck = checkpoint_forms(fused(a, 1), {}, c, "ck");
  load_checkpoint_into_model(b, std::move(ck), "ck");
  const Tensor la = model_logits(a, tokens(12)), lb = model_logits(b, tokens(12));
  EXPECT_TRUE(same_bits(la, lb));  // the same f32 weights, the same arithmetic
  for (const auto& [name, t] : a.params) EXPECT_TRUE(same_bits(t, b.params.at(name))) << name;
}

TEST(CheckpointForms, BothFormsOrAWrongFusedShapeIsAnErrorNamingTheTensor) {
  const ModelConfig c = parse_model_config(moe_json(), "cfg");
  const Model a = tiny_moe(c, 6);
  io::TensorMap both = fused(a, 1);
  both["model.layers.1.mlp.experts.0.gate_proj.weight"] = a.params.at("model.layers.1.mlp.experts.0.gate_proj.weight");
  EXPECT_NE(io_error(both, c).find("'model.layers.1.mlp.experts.gate_up_proj' (fused experts) and "
                                   "'model.layers.1.mlp.experts.0.gate_proj.weight'"),
            std::string::npos);
  io::TensorMap bad = fused(a, 1);
  bad["model.layers.1.mlp.experts.down_proj"] = Tensor::zeros({8, 6, c.hidden_size}, DType::f32);  // [E, I, H]
  const std::string e = io_error(bad, c);
  EXPECT_NE(e.find("'model.layers.1.mlp.experts.down_proj' is [8, 6, " + std::to_string(c.hidden_size) + "]"),
            std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos);
  io::TensorMap half = fused(a, 1);
  half.erase("model.layers.1.mlp.experts.gate_up_proj");
  EXPECT_NE(io_error(half, c).find("'model.layers.1.mlp.experts.gate_up_proj' is missing"), std::string::npos);
}

// An FP8 weight of the model dequantizes to e4m3 * scale per block (io tests check the decoding);
// its scale is consumed, so the model loads with no unexpected tensor.
TEST(CheckpointForms, Fp8WeightsLoadDequantized) {
  json j = moe_json();
  j["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                              {"weight_block_size", {4, 4}}};
  const ModelConfig c = parse_model_config(j, "cfg");
  EXPECT_TRUE(c.form.fp8);
  EXPECT_EQ(c.form.block_rows, 4);
  const Model a = tiny_moe(c, 7);
  io::TensorMap w;
  for (const auto& [name, t] : a.params) w[name] = t.clone();
  const std::string n = "model.layers.0.mlp.down_proj.weight";
  const Shape sh = w.at(n).shape();  // [hidden, intermediate]
  io::StoredTensor q{"F8_E4M3", sh, std::string(size_t(sh[0] * sh[1]), '\0')};
  for (size_t i = 0; i < q.bytes.size(); ++i) q.bytes[i] = char((i * 29) % 0x7f);
  const Shape ssh{(sh[0] + 3) / 4, (sh[1] + 3) / 4};
  std::vector<float> sv(size_t(ssh[0] * ssh[1]));
  for (size_t i = 0; i < sv.size(); ++i) sv[i] = 0.001f * float(i + 1);
  w.erase(n);
  w[n + "_scale_inv"] = Tensor::from_vector<float>(ssh, sv);
  Model b = build_model(c, {false, false});
  load_checkpoint_into_model(b, checkpoint_forms(w, {{n, q}}, c, "ck"), "ck");
  const float* got = b.params.at(n).data<float>();
  for (int64_t r = 0; r < sh[0]; ++r)
    for (int64_t k = 0; k < sh[1]; ++k)
      ASSERT_EQ(got[r * sh[1] + k], io::e4m3_to_f32(uint8_t(q.bytes[size_t(r * sh[1] + k)])) * sv[size_t((r / 4) * ssh[1] + k / 4)]);
  // quantization_config is not written back: hmla writes the dequantized weights.
  EXPECT_FALSE(model_config_to_json(c).contains("quantization_config"));
}

std::string config_error(json j) {
  try {
    parse_model_config(j, "cfg");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "accepted";
}

TEST(CheckpointForms, BadQuantizationConfigIsAConfigErrorNamingTheField) {
  json j = moe_json();
  auto with = [&](json q) {
    json k = j;
    k["quantization_config"] = q;
    return config_error(k);
  };
  EXPECT_NE(with({{"quant_method", "bitsandbytes"}}).find("quantization_config.quant_method"), std::string::npos);
  EXPECT_NE(with({{"quant_method", "fp8"}, {"fmt", "e5m2"}}).find("quantization_config: fmt"), std::string::npos);
  EXPECT_NE(with({{"quant_method", "fp8"}, {"weight_block_size", {128}}}).find("quantization_config.weight_block_size"),
            std::string::npos);
  EXPECT_NE(with({{"quant_method", "fp8"}, {"weight_block_size", {128, 0}}}).find("weight_block_size"), std::string::npos);
  EXPECT_NE(with({{"quant_method", "fp8"}, {"activation_scheme", "static"}}).find("activation_scheme"), std::string::npos);
  EXPECT_NE(with(json::array()).find("quantization_config must be an object"), std::string::npos);
  EXPECT_EQ(with({{"quant_method", "fp8"}}), "accepted");  // transformers' defaults: e4m3, [128, 128]
  j["num_nextn_predict_layers"] = -1;
  EXPECT_NE(config_error(j).find("num_nextn_predict_layers = -1"), std::string::npos);
}

// The MTP layers (FP8 and scales included) are set aside as stored; a layer past them is still an
// unexpected tensor; num_nextn_predict_layers is written back as read.
TEST(CheckpointForms, MtpLayersAreKeptAsStored) {
  json j = moe_json();
  j["num_nextn_predict_layers"] = 1;
  j["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}};
  const ModelConfig c = parse_model_config(j, "cfg");
  const Model a = tiny_moe(c, 8);
  io::TensorMap w;
  for (const auto& [name, t] : a.params) w[name] = t.clone();
  const Tensor eh = Tensor::zeros({4, 8}, DType::bf16), sc = Tensor::from_vector<float>({1, 1}, {0.5f});
  w["model.layers.2.eh_proj.weight"] = eh;
  w["model.layers.2.mlp.experts.0.up_proj.weight_scale_inv"] = sc;
  const io::StoredTensor q{"F8_E4M3", {3, 5}, "abcdefghijklmno"};
  CheckpointTensors ck = checkpoint_forms(w, {{"model.layers.2.mlp.experts.0.up_proj.weight", q}}, c, "ck");
  ASSERT_EQ(ck.kept.size(), 3u);
  EXPECT_EQ(ck.kept.at("model.layers.2.mlp.experts.0.up_proj.weight").bytes, q.bytes);
  EXPECT_EQ(ck.kept.at("model.layers.2.eh_proj.weight").dtype, "BF16");
  EXPECT_EQ(ck.kept.at("model.layers.2.mlp.experts.0.up_proj.weight_scale_inv").bytes,
            std::string(static_cast<const char*>(sc.raw_data()), 4));
  Model b = build_model(c, {false, false});
  load_checkpoint_into_model(b, std::move(ck), "ck");
  EXPECT_EQ(b.kept.size(), 3u);
  EXPECT_EQ(model_config_to_json(c)["num_nextn_predict_layers"], 1);
  w["model.layers.3.eh_proj.weight"] = eh;  // past num_nextn_predict_layers
  Model d = build_model(c, {false, false});
  EXPECT_THROW(load_checkpoint_into_model(d, checkpoint_forms(w, {}, c, "ck"), "ck"), IoError);
}

// A MoE checkpoint split over shards (model.safetensors.index.json) loads to the same model.
TEST(CheckpointForms, ShardedMoeCheckpointLoads) {
  const ModelConfig c = parse_model_config(moe_json(), "cfg");
  const Model a = tiny_moe(c, 9);
  namespace fs = std::filesystem;
  const fs::path d = fs::temp_directory_path() / ("hmla_moe_shards_" + std::to_string(::getpid()));
  fs::create_directories(d);
  io::TensorMap s0, s1;
  json map = json::object();
  for (const auto& [name, t] : a.params) {
    const bool first = name.find(".layers.1.") == std::string::npos;  // the MoE layer in its own shard
    (first ? s0 : s1)[name] = t;
    map[name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  io::save_safetensors((d / "model-00001-of-00002.safetensors").string(), s0);
  io::save_safetensors((d / "model-00002-of-00002.safetensors").string(), s1);
  io::write_file_atomic((d / "model.safetensors.index.json").string(), json{{"weight_map", map}}.dump());
  Model b = build_model(c, {false, false});
  load_checkpoint_into_model(b, read_checkpoint(d.string(), c), d.string());
  for (const auto& [name, t] : a.params) EXPECT_TRUE(same_bits(t, b.params.at(name))) << name;
  fs::remove_all(d);
}

}  // namespace
}  // namespace hmla
