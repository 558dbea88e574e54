// The multi-token-prediction layers of a checkpoint (params.h: CheckpointTensors::kept) go through
// training untouched: an init_checkpoint's MTP tensors (bf16, FP8 and its scale) are in every
// checkpoint and in the final model byte for byte, and a resumed run carries them too.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "hmla/io/json_strict.h"
#include "hmla/io/safetensors.h"
#include "hmla/model/model.h"
#include "programmes.h"

namespace hmla {
namespace {

namespace fs = std::filesystem;

io::StoredMap mtp_tensors() {
  const Tensor eh = Tensor::from_vector<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  return {{"model.layers.2.eh_proj.weight", io::stored_tensor(eh)},
          {"model.layers.2.mlp.down_proj.weight", {"F8_E4M3", {2, 2}, std::string("\x01\x38\xb8\x7e", 4)}},
          {"model.layers.2.mlp.down_proj.weight_scale_inv", io::stored_tensor(Tensor::from_vector<float>({1, 1}, {0.25f}))}};
}

io::StoredMap stored_mtp(const fs::path& file) {
  io::StoredMap f8;
  io::TensorMap w = io::load_safetensors(file.string(), nullptr, &f8);
  for (auto& [name, t] : w)
    if (name.rfind("model.layers.2.", 0) == 0) f8[name] = io::stored_tensor(t);
  return f8;
}

void expect_same(const io::StoredMap& a, const io::StoredMap& b, const std::string& where) {
  ASSERT_EQ(a.size(), b.size()) << where;
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << where << ": " << name;
    EXPECT_EQ(b.at(name).dtype, t.dtype) << where << ": " << name;
    EXPECT_EQ(b.at(name).shape, t.shape) << where << ": " << name;
    EXPECT_EQ(b.at(name).bytes, t.bytes) << where << ": " << name;
  }
}

TEST(MtpLayers, RoundTripThroughTrainingCheckpointsAndResume) {
  const fs::path d = testing::tmpdir("mtp");
  nlohmann::json j = io::load_json(std::string(HMLA_SOURCE_DIR) + "/tests/train/tiny_model.json");
  j["num_nextn_predict_layers"] = 1;
  std::ofstream(d / "cfg.json") << j.dump();
  const ModelConfig c = load_model_config((d / "cfg.json").string());
  Model m = build_model(c, std::vector<bool>(c.num_hidden_layers, false));
  init_model(m, 1);
  io::save_safetensors((d / "init.safetensors").string(), arena_views(m.table, m.arena), {}, mtp_tensors());
  const std::string phases = "  - {name: pre, mode: mha, steps: 2, checkpoint_every: 1}\n";
  auto text = [&](const std::string& steps) {
    std::string p = phases;
    p.replace(p.find("steps: 2"), 8, steps);
    return "model: " + (d / "cfg.json").string() + "\ndata: " + HMLA_SOURCE_DIR + "/data/demo\nseed: 3\ninit_checkpoint: " +
           (d / "init.safetensors").string() +
           "\nbase: {batch: 4, seq_len: 32, lr: 3.0e-3, indexer_lr: 3.0e-3, log_every: 100, eval_rows: 4}\nphases:\n" + p;
  };
  testing::run_text(text("steps: 2"), d / "run");
  expect_same(mtp_tensors(), stored_mtp(d / "run" / "model.safetensors"), "final model");
  expect_same(mtp_tensors(), stored_mtp(d / "run" / "checkpoints" / "0-pre-step1" / "model.safetensors"), "checkpoint");
  const nlohmann::json saved = io::load_json((d / "run" / "config.json").string());
  EXPECT_EQ(saved["num_nextn_predict_layers"], 1);
  // Resumed from the step-1 checkpoint: the MTP tensors come back from it and are written again.
  fs::remove(d / "run" / "model.safetensors");
  std::ofstream(d / "run" / "checkpoints" / "latest") << "0-pre-step1\n";
  TrainOptions o;
  o.resume = true;
  o.allow_safe_changes = true;
  testing::run_text(text("steps: 2"), d / "run", o);
  expect_same(mtp_tensors(), stored_mtp(d / "run" / "model.safetensors"), "resumed final model");
  fs::remove_all(d);
}

}  // namespace
}  // namespace hmla
