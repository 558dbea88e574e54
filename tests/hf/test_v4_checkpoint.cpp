// DeepSeek-V4 checkpoints through hmla's reader (read_checkpoint, load_checkpoint_into_model) and
// writer (save_model_weights), against the file transformers 5.24 saved (tests/hf/fixtures/v4):
// - hmla's file has exactly transformers' names, dtypes, shapes and bytes (f32 weights, tid2eid
//   I64), read by an independent header parser here; read back it gives the same arena and ints;
//   the sharded form likewise;
// - the MTP layers (mtp.0.*, made up here: FP8 with E8M0 scales, BF16) are kept byte for byte;
// - DeepSeek's released form (no "model." prefix, `.scale` F8_E8M0 scales, `weight_scale_inv` f32
//   with ragged blocks, packed FP4 experts) dequantized equal to a float64 reference of the
//   formats' definitions;
// - every bad input is a one-line IoError naming the tensor.
// What wrong code would still pass: a writer that orders the header differently (safetensors
// readers do not care, and neither does this test's comparison by name).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <unistd.h>

#include "hmla/core/error.h"
#include "hmla/io/safetensors.h"
#include "hmla/model/model.h"
#include "hmla/model/params.h"

namespace hmla {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kDir = std::string(HMLA_SOURCE_DIR) + "/tests/hf/fixtures/v4";

// One tensor of a safetensors file, read here from the format's definition (8-byte little-endian
// header length, JSON header, data block), independently of hmla's reader.
struct Raw {
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
  bool operator==(const Raw&) const = default;
};
using RawMap = std::map<std::string, Raw>;

RawMap read_raw(const fs::path& path, json* metadata = nullptr) {
  std::ifstream f(path, std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(all[size_t(i)]);
  const json h = json::parse(all.substr(8, n));
  RawMap out;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (metadata) *metadata = *it;
      continue;
    }
    const uint64_t b = (*it)["data_offsets"][0], e = (*it)["data_offsets"][1];
    out[it.key()] = {(*it)["dtype"], (*it)["shape"].get<std::vector<int64_t>>(), all.substr(8 + n + b, e - b)};
  }
  return out;
}

// Every tensor of a directory's shards (through its index) or of its model.safetensors.
RawMap read_raw_dir(const fs::path& dir) {
  if (!fs::exists(dir / "model.safetensors.index.json")) return read_raw(dir / "model.safetensors");
  std::ifstream f(dir / "model.safetensors.index.json");
  const json idx = json::parse(f);
  RawMap out;
  std::set<std::string> files;
  for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) files.insert(it->get<std::string>());
  for (const std::string& file : files)
    for (auto& [name, r] : read_raw(dir / file)) {
      EXPECT_EQ(idx["weight_map"].value(name, ""), file) << name;
      out[name] = r;
    }
  return out;
}

struct TmpDir {
  fs::path path;
  explicit TmpDir(const std::string& tag)
      : path(fs::temp_directory_path() / ("hmla_v4ck_" + tag + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TmpDir() { fs::remove_all(path); }
};

json fixture_config() {
  std::ifstream f(kDir + "/config.json");
  return json::parse(f);
}

// A checkpoint directory of config `cfg` holding `tensors` (and `stored`, as they are).
ModelConfig write_dir(const fs::path& dir, const json& cfg, const io::TensorMap& tensors, const io::StoredMap& stored = {}) {
  std::ofstream(dir / "config.json") << cfg.dump(1);
  io::save_safetensors((dir / "model.safetensors").string(), tensors, {{"format", "pt"}}, stored);
  return load_model_config((dir / "config.json").string());
}

Model read_model(const std::string& path, const ModelConfig& c) {
  CheckpointTensors ck = read_checkpoint(path, c);
  Model m = build_model(c, checkpoint_indexers(c, ck.tensors));
  load_checkpoint_into_model(m, std::move(ck), path);
  return m;
}

void expect_same_model(const Model& a, const Model& b) {
  ASSERT_EQ(a.arena.numel(), b.arena.numel());
  EXPECT_EQ(std::memcmp(a.arena.raw_data(), b.arena.raw_data(), size_t(a.arena.nbytes())), 0);
  ASSERT_EQ(a.ints.size(), b.ints.size());
  for (const auto& [name, t] : a.ints) EXPECT_EQ(t.to_vector<int32_t>(), b.ints.at(name).to_vector<int32_t>()) << name;
}

// The IoError of reading `dir` into a model, checked to be one line naming `tensor`.
std::string read_error(const fs::path& dir, const ModelConfig& c, const std::string& tensor) {
  try {
    read_model(dir.string(), c);
  } catch (const IoError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_NE(msg.find("'" + tensor + "'"), std::string::npos) << msg;
    return msg;
  }
  ADD_FAILURE() << "no error for " << tensor;
  return {};
}

TEST(V4Checkpoint, WritesTransformersFileByteForByteAndReadsItBack) {
  const ModelConfig c = load_model_config(kDir + "/config.json");
  const Model m = read_model(kDir, c);  // the directory: config.json + model.safetensors
  EXPECT_TRUE(m.kept.empty());
  TmpDir out("single");
  save_model_weights(out.path.string(), m);
  json meta;
  const RawMap want = read_raw(kDir + "/model.safetensors"), got = read_raw(out.path / "model.safetensors", &meta);
  EXPECT_EQ(meta, json({{"format", "pt"}}));
  ASSERT_EQ(got.size(), want.size());
  int tid2eid = 0;
  for (const auto& [name, w] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    const Raw& g = got.at(name);
    EXPECT_EQ(g.dtype, w.dtype) << name;
    EXPECT_EQ(g.shape, w.shape) << name;
    EXPECT_TRUE(g.bytes == w.bytes) << name;
    tid2eid += name.ends_with("tid2eid") && g.dtype == "I64";
  }
  EXPECT_EQ(tid2eid, 2);  // the two hash layers
  expect_same_model(read_model(out.path.string(), c), m);
}

TEST(V4Checkpoint, ShardedFormWritesAndReadsTheSameTensors) {
  const ModelConfig c = load_model_config(kDir + "/config.json");
  const Model m = read_model(kDir, c);
  TmpDir out("sharded");
  std::ofstream(out.path / "model.safetensors") << "stale";  // removed: the index is the checkpoint
  save_model_weights(out.path.string(), m, 16 << 10);
  EXPECT_FALSE(fs::exists(out.path / "model.safetensors"));
  std::ifstream f(out.path / "model.safetensors.index.json");
  const json idx = json::parse(f);
  std::set<std::string> files;
  for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) files.insert(it->get<std::string>());
  EXPECT_GE(files.size(), 3u);
  char last[64];
  std::snprintf(last, sizeof last, "model-%05zu-of-%05zu.safetensors", files.size(), files.size());
  EXPECT_TRUE(files.count(last)) << last;
  const RawMap want = read_raw(kDir + "/model.safetensors"), got = read_raw_dir(out.path);
  EXPECT_TRUE(got == want);
  uint64_t total = 0;
  for (const auto& [name, r] : want) total += r.bytes.size();
  EXPECT_EQ(idx["metadata"]["total_size"].get<uint64_t>(), total);
  expect_same_model(read_model(out.path.string(), c), m);
  // and back to one file: the index goes
  save_model_weights(out.path.string(), m);
  EXPECT_FALSE(fs::exists(out.path / "model.safetensors.index.json"));
  EXPECT_TRUE(read_raw(out.path / "model.safetensors") == want);
}

// Made-up MTP tensors in V4's names: FP8 with an E8M0 scale, BF16, and an I64 table.
io::StoredMap fake_mtp() {
  io::StoredMap s;
  std::string q(16 * 32, '\0'), b(2 * 32, '\0'), t(8 * 4 * 2, '\0');
  for (size_t i = 0; i < q.size(); ++i) q[i] = char((i * 37 + 11) % 0x7e);
  for (size_t i = 0; i < b.size(); ++i) b[i] = char(i * 13 + 5);
  for (size_t i = 0; i < t.size(); i += 8) t[i] = char(i / 8 % 4);
  s["mtp.0.attn.wq_a.weight"] = {"F8_E4M3", {16, 32}, q};
  s["mtp.0.attn.wq_a.scale"] = {"F8_E8M0", {1, 1}, std::string(1, char(120))};
  s["mtp.0.enorm.weight"] = {"BF16", {32}, b};
  s["mtp.0.ffn.gate.tid2eid"] = {"I64", {4, 2}, t};
  return s;
}

TEST(V4Checkpoint, KeepsTheMtpLayersByteForByte) {
  json cfg = fixture_config();
  cfg["num_nextn_predict_layers"] = 1;
  TmpDir dir("mtp");
  const io::TensorMap w = io::load_safetensors(kDir + "/model.safetensors");
  const ModelConfig c = write_dir(dir.path, cfg, w, fake_mtp());
  const Model m = read_model(dir.path.string(), c);
  ASSERT_EQ(m.kept.size(), 4u);
  for (const auto& [name, t] : fake_mtp()) {
    EXPECT_EQ(m.kept.at(name).dtype, t.dtype) << name;
    EXPECT_TRUE(m.kept.at(name).bytes == t.bytes) << name;
  }
  TmpDir out("mtp_out");
  save_model_weights(out.path.string(), m);
  RawMap got = read_raw(out.path / "model.safetensors");
  for (const auto& [name, t] : fake_mtp()) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_TRUE((got.at(name) == Raw{t.dtype, t.shape, t.bytes})) << name;
    got.erase(name);
  }
  EXPECT_TRUE(got == read_raw(kDir + "/model.safetensors"));
  const Model back = read_model(out.path.string(), c);
  expect_same_model(back, m);
  EXPECT_EQ(back.kept.size(), 4u);

  // An MTP layer the config does not have, and MTP tensors with num_nextn_predict_layers = 0.
  io::StoredMap extra = fake_mtp();
  extra["mtp.1.enorm.weight"] = extra.at("mtp.0.enorm.weight");
  write_dir(dir.path, cfg, w, extra);
  EXPECT_NE(read_error(dir.path, c, "mtp.1.enorm.weight").find("num_nextn_predict_layers = 1"), std::string::npos);
  const ModelConfig c0 = write_dir(dir.path, fixture_config(), w, fake_mtp());
  read_error(dir.path, c0, "mtp.0.enorm.weight");
}

// Format definitions in float64, from the formats' specifications.
double e4m3_ref(int code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}
double e2m1_ref(int code) {
  static const double v[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (code & 8 ? -1 : 1) * v[code & 7];
}
double e8m0_ref(int code) { return std::pow(2.0, code - 127); }

// DeepSeek's released form of the fixture, with three weights quantized: an F8_E4M3 one with
// `.scale` F8_E8M0 in 8 x 12 blocks (ragged columns), one with `weight_scale_inv` f32, and a routed
// expert in packed FP4 with [1, 32]-block E8M0 scales. Their float64 values in `ref` (hmla names).
struct Released {
  json cfg = fixture_config();
  io::TensorMap tensors;
  io::StoredMap stored;
  std::map<std::string, std::vector<double>> ref;
};

std::string release_name(const std::string& n) {
  if (n == "model.embed_tokens.weight") return "embed.weight";
  if (n == "model.norm.weight") return "norm.weight";
  if (n.starts_with("model.hc_head.hc_")) return "hc_head_" + n.substr(17);
  if (n.starts_with("model.layers.")) return n.substr(6);
  return n;
}

Released released() {
  Released r;
  r.cfg["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                                  {"scale_fmt", "ue8m0"}, {"weight_block_size", {8, 12}}};
  r.cfg["expert_dtype"] = "fp4";
  for (const auto& [n, t] : io::load_safetensors(kDir + "/model.safetensors")) r.tensors[release_name(n)] = t;
  std::mt19937 rng(7);
  auto codes = [&](size_t n) {
    std::string s(n, '\0');
    for (char& ch : s) {
      int v = int(rng() % 256);
      while ((v & 0x7f) == 0x7f) v = int(rng() % 256);  // no e4m3 NaN
      ch = char(v);
    }
    return s;
  };
  {  // wq_a [16, 32]: 2 x 3 blocks of 8 x 12, E8M0 scales
    const std::string w = codes(16 * 32), s = {char(120), char(127), char(130), char(125), char(118), char(133)};
    r.tensors.erase("layers.0.attn.wq_a.weight");
    r.stored["layers.0.attn.wq_a.weight"] = {"F8_E4M3", {16, 32}, w};
    r.stored["layers.0.attn.wq_a.scale"] = {"F8_E8M0", {2, 3}, s};
    std::vector<double>& v = r.ref["model.layers.0.attn.wq_a.weight"];
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 32; ++j) v.push_back(e4m3_ref(uint8_t(w[size_t(i * 32 + j)])) * e8m0_ref(uint8_t(s[size_t(i / 8 * 3 + j / 12)])));
  }
  {  // wkv [16, 32]: f32 weight_scale_inv
    const std::string w = codes(16 * 32);
    const std::vector<float> s = {0.013f, -0.25f, 3.7e-3f, 1.f, 0.5f, 2.9e-4f};
    r.tensors.erase("layers.1.attn.wkv.weight");
    r.stored["layers.1.attn.wkv.weight"] = {"F8_E4M3", {16, 32}, w};
    r.tensors["layers.1.attn.wkv.weight_scale_inv"] = Tensor::from_vector<float>({2, 3}, s);
    std::vector<double>& v = r.ref["model.layers.1.attn.wkv.weight"];
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 32; ++j) v.push_back(e4m3_ref(uint8_t(w[size_t(i * 32 + j)])) * double(s[size_t(i / 8 * 3 + j / 12)]));
  }
  {  // experts.2.w1 [8, 32]: I8 [8, 16], two e2m1 codes a byte, E8M0 scales [8, 1]
    const std::string w = codes(8 * 16), s = codes(8);
    std::string sc = s;
    for (char& ch : sc) ch = char(120 + uint8_t(ch) % 12);
    r.tensors.erase("layers.1.ffn.experts.2.w1.weight");
    r.stored["layers.1.ffn.experts.2.w1.weight"] = {"I8", {8, 16}, w};
    r.stored["layers.1.ffn.experts.2.w1.scale"] = {"F8_E8M0", {8, 1}, sc};
    std::vector<double>& v = r.ref["model.layers.1.ffn.experts.2.w1.weight"];
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 32; ++j) {
        const int byte = uint8_t(w[size_t(i * 16 + j / 2)]), code = j % 2 ? byte >> 4 : byte & 15;
        v.push_back(e2m1_ref(code) * e8m0_ref(uint8_t(sc[size_t(i)])));
      }
  }
  return r;
}

TEST(V4Checkpoint, DequantizesDeepSeeksReleasedFormAgainstFloat64) {
  const Released r = released();
  TmpDir dir("fp8");
  const ModelConfig c = write_dir(dir.path, r.cfg, r.tensors, r.stored);
  EXPECT_TRUE(c.form.fp8 && c.form.fp4_experts);
  const CheckpointTensors ck = read_checkpoint(dir.path.string(), c);
  for (const auto& [name, v] : r.ref) {
    const std::vector<float> got = ck.tensors.at(name).to_vector<float>();
    ASSERT_EQ(got.size(), v.size()) << name;
    // Exact: a code's value times a power of two (or an f32) is one rounding of the exact product.
    for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(got[i], float(v[i])) << name << " at " << i;
  }
  const Model m = read_model(dir.path.string(), c);
  const Model fx = read_model(kDir, load_model_config(kDir + "/config.json"));
  for (const auto& [name, t] : fx.params) {
    if (r.ref.count(name)) continue;
    EXPECT_EQ(m.params.at(name).to_vector<float>(), t.to_vector<float>()) << name;
  }
  for (const auto& [name, t] : fx.ints) {
    EXPECT_EQ(m.ints.at(name).to_vector<int32_t>(), t.to_vector<int32_t>()) << name;
  }
  // Written back: f32 in transformers' names, the config without quantization_config / expert_dtype.
  TmpDir out("fp8_out");
  save_model_config((out.path / "config.json").string(), m.cfg);
  save_model_weights(out.path.string(), m);
  std::ifstream f(out.path / "config.json");
  const json written = json::parse(f);
  EXPECT_FALSE(written.contains("quantization_config"));
  EXPECT_FALSE(written.contains("expert_dtype"));
  const RawMap got = read_raw(out.path / "model.safetensors"), want = read_raw(kDir + "/model.safetensors");
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, w] : want) EXPECT_TRUE(got.count(name) && got.at(name).dtype == w.dtype) << name;
  expect_same_model(read_model(out.path.string(), load_model_config((out.path / "config.json").string())), m);
}

TEST(V4Checkpoint, BadQuantizedFormsAreOneLineErrors) {
  TmpDir dir("fp8_bad");
  auto with = [&](auto edit) {
    Released r = released();
    edit(r);
    return std::pair{write_dir(dir.path, r.cfg, r.tensors, r.stored), r};
  };
  {  // FP4 without expert_dtype
    auto [c, r] = with([](Released& r) { r.cfg.erase("expert_dtype"); });
    EXPECT_NE(read_error(dir.path, c, "model.layers.1.ffn.experts.2.w1.weight").find("expert_dtype"), std::string::npos);
  }
  {  // a scale missing
    auto [c, r] = with([](Released& r) { r.stored.erase("layers.0.attn.wq_a.scale"); });
    read_error(dir.path, c, "model.layers.0.attn.wq_a.scale");
  }
  {  // scales under both names
    auto [c, r] = with([](Released& r) { r.tensors["layers.0.attn.wq_a.weight_scale_inv"] = Tensor::from_vector<float>({2, 3}, {1, 1, 1, 1, 1, 1}); });
    read_error(dir.path, c, "model.layers.0.attn.wq_a.weight_scale_inv");
  }
  {  // a scale of the wrong grid
    auto [c, r] = with([](Released& r) { r.stored["layers.1.ffn.experts.2.w1.scale"] = {"F8_E8M0", {3, 3}, std::string(9, char(127))}; });
    read_error(dir.path, c, "model.layers.1.ffn.experts.2.w1.scale");
  }
  {  // an E8M0 NaN scale
    auto [c, r] = with([](Released& r) { r.stored["layers.0.attn.wq_a.scale"].bytes[3] = char(0xff); });
    read_error(dir.path, c, "model.layers.0.attn.wq_a.scale");
  }
  {  // an orphan scale
    auto [c, r] = with([](Released& r) { r.stored["layers.0.attn.wo_a.scale"] = {"F8_E8M0", {1, 1}, "x"}; });
    read_error(dir.path, c, "model.layers.0.attn.wo_a.scale");
  }
  {  // both names of one tensor
    auto [c, r] = with([](Released& r) { r.tensors["model.norm.weight"] = r.tensors.at("norm.weight"); });
    read_error(dir.path, c, "model.norm.weight");
  }
}

TEST(V4Checkpoint, BadExpertTablesAndMissingTensorsAreOneLineErrors) {
  const json cfg = fixture_config();
  const ModelConfig c = load_model_config(kDir + "/config.json");
  const std::string tid = "model.layers.2.ffn.gate.tid2eid";
  TmpDir dir("bad");
  auto with = [&](auto edit) {
    io::TensorMap w = io::load_safetensors(kDir + "/model.safetensors");
    edit(w);
    write_dir(dir.path, cfg, w);
  };
  with([&](io::TensorMap& w) { w.at(tid).data<int64_t>()[5] = 4; });  // E = 4
  EXPECT_NE(read_error(dir.path, c, tid).find("row 2 names expert 4, outside [0, n_routed_experts = 4)"), std::string::npos);
  with([&](io::TensorMap& w) { w.at(tid).data<int64_t>()[7] = w.at(tid).data<int64_t>()[6]; });
  EXPECT_NE(read_error(dir.path, c, tid).find("row 3 names expert"), std::string::npos);
  with([&](io::TensorMap& w) { w[tid] = Tensor::zeros(w.at(tid).shape(), DType::f32); });
  EXPECT_NE(read_error(dir.path, c, tid).find("is f32"), std::string::npos);
  with([&](io::TensorMap& w) { w[tid] = Tensor::zeros({64, 3}, DType::i64); });
  EXPECT_NE(read_error(dir.path, c, tid).find("[64, 3]"), std::string::npos);
  with([&](io::TensorMap& w) { w.erase(tid); });
  EXPECT_NE(read_error(dir.path, c, tid).find("is missing"), std::string::npos);
  with([&](io::TensorMap& w) { w.erase("model.layers.1.attn.compressor.ape"); });
  read_error(dir.path, c, "model.layers.1.attn.compressor.ape");
  with([&](io::TensorMap& w) { w["model.layers.1.ffn.gate.tid2eid"] = w.at(tid); });  // a learned layer has none
  read_error(dir.path, c, "model.layers.1.ffn.gate.tid2eid");

  // The writer refuses a bad table before writing anything.
  Model m = read_model(kDir, c);
  m.ints.at(tid).data<int32_t>()[0] = m.ints.at(tid).data<int32_t>()[1];
  TmpDir out("bad_out");
  try {
    save_model_weights(out.path.string(), m);
    ADD_FAILURE() << "saved a table with a duplicated expert";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("'" + tid + "' row 0 names expert"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(out.path / "model.safetensors"));
}

}  // namespace
}  // namespace hmla
