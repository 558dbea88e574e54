// safetensors: bit-exact round trips, malformed files as clear errors (including a fuzz loop
// over random and mutated headers), and atomic writes.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "hmla/io/safetensors.h"

namespace hmla::io {
namespace {

namespace fs = std::filesystem;

TensorMap sample() {
  TensorMap m;
  m["a.weight"] = Tensor::from_vector<float>({2, 3}, {1.5f, -0.f, 3e-39f, INFINITY, -7.f, 1e30f});
  m["b"] = Tensor::from_vector<int64_t>({3}, {-1, 1ll << 40, 0});
  m["c"] = Tensor::from_vector<int32_t>({1, 1}, {-5});
  m["d"] = Tensor::from_vector<bf16>({2}, {f32_to_bf16(1.f), f32_to_bf16(-3.f)});
  m["empty"] = Tensor::empty({0, 4}, DType::f32);
  return m;
}

std::string header_file(const std::string& json, const std::string& data = "") {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = char((uint64_t(json.size()) >> (8 * i)) & 0xff);
  return out + json + data;
}

TEST(Safetensors, RoundTripIsBitExact) {
  TensorMap m = sample();
  std::string bytes = serialize_safetensors(m, {{"format", "pt"}});
  TensorMap r = parse_safetensors(bytes, "mem");
  ASSERT_EQ(r.size(), m.size());
  for (const auto& [name, t] : m) {
    const Tensor& u = r.at(name);
    EXPECT_EQ(u.dtype(), t.dtype()) << name;
    EXPECT_EQ(u.shape(), t.shape()) << name;
    EXPECT_EQ(0, std::memcmp(u.raw_data(), t.raw_data(), t.nbytes())) << name;
  }
  EXPECT_EQ(serialize_safetensors(r, {{"format", "pt"}}), bytes);  // and stable
}

TEST(Safetensors, MalformedFilesAreClearErrors) {
  std::string good = serialize_safetensors(sample());
  EXPECT_THROW(parse_safetensors("", "f"), IoError);
  EXPECT_THROW(parse_safetensors(good.substr(0, 5), "f"), IoError);
  EXPECT_THROW(parse_safetensors(good.substr(0, good.size() - 1), "f"), IoError);  // truncated data
  std::string huge = good;
  huge[7] = char(0x7f);  // header length far past the file
  EXPECT_THROW(parse_safetensors(huge, "f"), IoError);
  EXPECT_THROW(parse_safetensors(header_file("{not json"), "f"), IoError);
  EXPECT_THROW(parse_safetensors(header_file("[1,2]"), "f"), IoError);
  EXPECT_THROW(parse_safetensors(header_file(R"({"x":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}})", "ab"), "f"), IoError);
  EXPECT_THROW(parse_safetensors(header_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "abcd"), "f"), IoError);
  EXPECT_THROW(parse_safetensors(header_file(R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "abcd"), "f"), IoError);
  EXPECT_THROW(parse_safetensors(header_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", "abcd"), "f"), IoError);
  EXPECT_THROW(parse_safetensors(header_file(R"({"x":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})"), "f"), IoError);
  EXPECT_THROW(parse_safetensors(header_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"y":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})", "abcdefgh"), "f"), IoError);
  EXPECT_THROW(parse_safetensors(header_file(R"({"x":{"shape":[1],"data_offsets":[0,4]}})", "abcd"), "f"), IoError);
  try {
    parse_safetensors(good.substr(0, good.size() - 1), "model.safetensors");
    ADD_FAILURE() << "a truncated file was accepted";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("model.safetensors"), std::string::npos);
  }
}

// Random and mutated inputs: every outcome is a parse or an IoError, never a crash (run under
// the debug-asan preset to catch out-of-bounds reads).
TEST(Safetensors, FuzzedHeadersNeverCrash) {
  std::string good = serialize_safetensors(sample());
  std::mt19937_64 rng(99);
  int errors = 0;
  for (int it = 0; it < 3000; ++it) {
    std::string f = good;
    const int kind = it % 4;
    if (kind == 0) {  // flip random bytes anywhere
      for (int n = 0; n < 3; ++n) f[rng() % f.size()] = char(rng());
    } else if (kind == 1) {  // truncate
      f.resize(rng() % f.size());
    } else if (kind == 2) {  // mutate header digits
      for (size_t i = 8; i < f.size(); ++i)
        if (std::isdigit(static_cast<unsigned char>(f[i])) && rng() % 4 == 0) f[i] = char('0' + rng() % 10);
    } else {  // random garbage of random length
      f.resize(rng() % 64);
      for (auto& ch : f) ch = char(rng());
    }
    try {
      parse_safetensors(f, "fuzz");
    } catch (const IoError&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 1000);
}

TEST(Safetensors, MetadataIsAFlatMapOfStrings) {
  Metadata meta;
  TensorMap r = parse_safetensors(serialize_safetensors(sample(), {{"format", "pt"}, {"k", "v"}}), "mem", &meta);
  EXPECT_EQ(meta, (Metadata{{"format", "pt"}, {"k", "v"}}));
  // What the format's other readers cannot read as metadata is an error, not dropped.
  for (const char* bad : {R"({"__metadata__": {"a": {"b": "c"}}})", R"({"__metadata__": {"a": 1}})",
                          R"({"__metadata__": {"a": ["x"]}})", R"({"__metadata__": "x"})"}) {
    try {
      parse_safetensors(header_file(bad), "mem");
      ADD_FAILURE() << "accepted " << bad;
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("__metadata__"), std::string::npos) << e.what();
    }
  }
}

TEST(Safetensors, AHeaderNestedPastTheBoundIsRefused) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  try {
    parse_safetensors(header_file("{\"__metadata__\": {}, \"x\": " + deep + "}"), "mem");
    ADD_FAILURE() << "accepted";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("mem: header: nests deeper than 64 levels"), std::string::npos) << e.what();
  }
}

TEST(Safetensors, AtomicWriteKeepsOldFileOnFailure) {
  fs::path dir = fs::temp_directory_path() / ("hmla_st_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string path = (dir / "w.safetensors").string();
  save_safetensors(path, sample());
  const std::string before = read_file(path);
  EXPECT_EQ(parse_safetensors(before, path).size(), sample().size());
  TensorMap bad = sample();
  bad["undefined"] = Tensor();
  EXPECT_THROW(save_safetensors(path, bad), IoError);  // fails while serialising
  EXPECT_EQ(read_file(path), before);
  EXPECT_THROW(save_safetensors((dir / "missing" / "x.safetensors").string(), sample()), IoError);
  fs::create_directories(dir / "adir");  // rename onto a non-empty directory fails
  fs::create_directories(dir / "adir" / "sub");
  EXPECT_THROW(save_safetensors((dir / "adir").string(), sample()), IoError);
  for (const auto& e : fs::directory_iterator(dir))  // no temporary files left behind
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  fs::remove_all(dir);
}

TEST(Safetensors, ShardedCheckpointsReadThroughTheIndex) {
  fs::path dir = fs::temp_directory_path() / ("hmla_shard_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  TensorMap all = sample(), a, b;
  for (const auto& [name, t] : all) (a.size() < 2 ? a : b)[name] = t;
  save_safetensors((dir / "model-00001-of-00002.safetensors").string(), a);
  save_safetensors((dir / "model-00002-of-00002.safetensors").string(), b);
  nlohmann::json index{{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  for (const auto& [name, t] : a) index["weight_map"][name] = "model-00001-of-00002.safetensors";
  for (const auto& [name, t] : b) index["weight_map"][name] = "model-00002-of-00002.safetensors";
  write_file_atomic((dir / "model.safetensors.index.json").string(), index.dump());
  TensorMap r = load_checkpoint_tensors(dir.string());
  ASSERT_EQ(r.size(), all.size());
  for (const auto& [name, t] : all) EXPECT_EQ(0, std::memcmp(r.at(name).raw_data(), t.raw_data(), t.nbytes()));
  index["weight_map"]["ghost"] = "model-00001-of-00002.safetensors";  // listed, not stored
  write_file_atomic((dir / "model.safetensors.index.json").string(), index.dump());
  EXPECT_THROW(load_checkpoint_tensors(dir.string()), IoError);
  index["weight_map"]["ghost"] = "../elsewhere.safetensors";
  write_file_atomic((dir / "model.safetensors.index.json").string(), index.dump());
  EXPECT_THROW(load_checkpoint_tensors(dir.string()), IoError);
  index["weight_map"].erase("ghost");
  index["weight_map"]["c"] = "missing.safetensors";
  write_file_atomic((dir / "model.safetensors.index.json").string(), index.dump());
  EXPECT_THROW(load_checkpoint_tensors(dir.string()), IoError);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace hmla::io
