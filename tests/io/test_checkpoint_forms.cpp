// FP8 block-scale checkpoints (checkpoint_forms.h) and the stored tensors of the safetensors
// reader and writer: e4m3 decoding against the format's definition evaluated in float64, the
// block-scale dequantization against a float64 reference, and every bad input's one-line error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "hmla/core/error.h"
#include "hmla/io/checkpoint_forms.h"
#include "hmla/io/safetensors.h"

namespace hmla::io {
namespace {

// torch.float8_e4m3fn by its definition, in float64: (-1)^s 2^(e - 7) (1 + m / 8) for e > 0,
// (-1)^s 2^-6 (m / 8) for e = 0; S.1111.111 is NaN.
double e4m3_reference(int code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::nan("");
  const double mag = e == 0 ? std::pow(2.0, -6) * (m / 8.0) : std::pow(2.0, e - 7) * (1.0 + m / 8.0);
  return s ? -mag : mag;
}

TEST(Fp8, EveryE4m3CodeDecodesExactly) {
  int nans = 0;
  for (int c = 0; c < 256; ++c) {
    const double ref = e4m3_reference(c);
    const float got = e4m3_to_f32(uint8_t(c));
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(got)) << c;
      ++nans;
      continue;
    }
    EXPECT_EQ(double(got), ref) << "code " << c;  // exact: every e4m3 value is an f32
    EXPECT_EQ(std::signbit(got), bool(c & 0x80)) << c;  // -0 included
  }
  EXPECT_EQ(nans, 2);
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.f);                 // the largest finite value
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.f, -9));   // the smallest subnormal
}

StoredTensor fp8_tensor(const Shape& shape, uint64_t seed) {
  StoredTensor t{"F8_E4M3", shape, std::string(size_t(shape[0] * shape[1]), '\0')};
  for (size_t i = 0; i < t.bytes.size(); ++i) {
    uint8_t c = uint8_t((seed * 2654435761u + i * 40503u) >> 3);
    if ((c & 0x7f) == 0x7f) c ^= 1;  // no NaN codes
    t.bytes[i] = char(c);
  }
  return t;
}

Tensor scales(const Shape& shape, float base) {
  std::vector<float> v(size_t(shape[0] * shape[1]));
  for (size_t i = 0; i < v.size(); ++i) v[i] = base * float(i + 1) / 64.f;
  return Tensor::from_vector<float>(shape, v);
}

// Ragged blocks on both axes: 5 x 7 in 2 x 3 blocks is 3 x 3 blocks, the last ones 1 x 1.
TEST(Fp8, BlockScalesDequantizeWithRaggedLastBlocks) {
  const StoredTensor q = fp8_tensor({5, 7}, 3);
  const Tensor s = scales({3, 3}, 0.75f);
  TensorMap t{{"a.weight_scale_inv", s}, {"b", Tensor::zeros({2}, DType::f32)}};
  StoredMap f8{{"a.weight", q}};
  const Fp8Blocks blocks{2, 3};
  dequantize_fp8_weights(t, f8, &blocks, "ck");
  EXPECT_TRUE(f8.empty());
  EXPECT_FALSE(t.count("a.weight_scale_inv"));  // consumed
  ASSERT_TRUE(t.count("a.weight"));
  const Tensor& w = t.at("a.weight");
  ASSERT_EQ(w.shape(), (Shape{5, 7}));
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t j = 0; j < 7; ++j) {
      // float64 product of two f32 values rounded once to f32: what one f32 multiply gives.
      const double ref = e4m3_reference(uint8_t(q.bytes[size_t(i * 7 + j)])) * double(s.data<float>()[(i / 2) * 3 + j / 3]);
      EXPECT_EQ(w.data<float>()[i * 7 + j], float(ref)) << i << "," << j;
    }
}

std::string fp8_error(TensorMap t, StoredMap f8, const Fp8Blocks* b = nullptr) {
  const Fp8Blocks def{2, 3};
  try {
    dequantize_fp8_weights(t, f8, b ? b : &def, "ck");
  } catch (const IoError& e) {
    return e.what();
  }
  return "accepted";
}

TEST(Fp8, BadWeightsAndScalesAreOneLineErrorsNamingTheTensor) {
  const StoredTensor q = fp8_tensor({5, 7}, 4);
  EXPECT_NE(fp8_error({}, {{"a.weight", q}}).find("FP8 tensor 'a.weight' has no 'a.weight_scale_inv'"),
            std::string::npos);
  EXPECT_NE(fp8_error({{"a.weight_scale_inv", scales({2, 3}, 1)}}, {{"a.weight", q}}).find("'a.weight_scale_inv' is f32 [2, 3]"),
            std::string::npos);
  EXPECT_NE(fp8_error({{"a.weight_scale_inv", Tensor::zeros({3, 3}, DType::bf16)}}, {{"a.weight", q}}).find("is bf16"),
            std::string::npos);
  Tensor inf = scales({3, 3}, 1);
  inf.data<float>()[4] = INFINITY;
  EXPECT_NE(fp8_error({{"a.weight_scale_inv", inf}}, {{"a.weight", q}}).find("'a.weight_scale_inv' holds a non-finite scale"),
            std::string::npos);
  StoredTensor nan = q;
  nan.bytes[6] = char(0xff);
  EXPECT_NE(fp8_error({{"a.weight_scale_inv", scales({3, 3}, 1)}}, {{"a.weight", nan}}).find("'a.weight' holds an e4m3 NaN code at flat index 6"),
            std::string::npos);
  EXPECT_NE(fp8_error({{"a.bias_scale_inv", scales({3, 3}, 1)}}, {{"a.bias", q}}).find("'a.bias' is F8_E4M3"),
            std::string::npos);
  TensorMap t{{"a.weight_scale_inv", scales({3, 3}, 1)}};
  StoredMap f8{{"a.weight", q}};
  EXPECT_THROW(dequantize_fp8_weights(t, f8, nullptr, "ck"), IoError);  // no quantization_config
  EXPECT_TRUE(t.count("a.weight_scale_inv") && !t.count("a.weight"));   // nothing done
  for (const std::string& e : {fp8_error({}, {{"a.weight", q}})}) EXPECT_EQ(e.find('\n'), std::string::npos);
}

// The reader keeps F8_E4M3 bytes as stored, refuses the other F8 types by name, and the writer
// writes stored tensors back byte for byte.
TEST(Fp8, ReaderKeepsE4m3BytesAndRefusesOtherF8Types) {
  const StoredTensor q = fp8_tensor({3, 4}, 9);
  const TensorMap t{{"x", Tensor::from_vector<float>({2}, {1.f, 2.f})}};
  const std::string file = serialize_safetensors(t, {}, {{"q.weight", q}});
  StoredMap f8;
  const TensorMap back = parse_safetensors(file, "f", nullptr, &f8);
  ASSERT_EQ(f8.size(), 1u);
  EXPECT_EQ(f8.at("q.weight").dtype, "F8_E4M3");
  EXPECT_EQ(f8.at("q.weight").shape, (Shape{3, 4}));
  EXPECT_EQ(f8.at("q.weight").bytes, q.bytes);
  EXPECT_EQ(back.at("x").to_vector<float>(), (std::vector<float>{1.f, 2.f}));
  EXPECT_EQ(serialize_safetensors(back, {}, f8), file);
  try {
    parse_safetensors(file, "f");
    FAIL() << "F8 without a place to keep it";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("'q.weight' is F8_E4M3"), std::string::npos);
  }
  StoredTensor e5 = q;
  e5.dtype = "F8_E5M2";
  try {
    parse_safetensors(serialize_safetensors({}, {}, {{"q.weight", e5}}), "f", nullptr, &f8);
    FAIL() << "F8_E5M2 read";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("'q.weight' has dtype F8_E5M2"), std::string::npos);
  }
  EXPECT_THROW(serialize_safetensors(t, {}, {{"x", q}}), IoError);  // one name twice
  StoredTensor shortq = q;
  shortq.bytes.pop_back();
  shortq.shape = {3, 4};
  const std::string bad = serialize_safetensors({}, {}, {{"q.weight", shortq}});
  EXPECT_THROW(parse_safetensors(bad, "f", nullptr, &f8), IoError);  // 11 bytes for 12 elements
}

// A sharded index whose shards hold FP8 weights: each lands in `fp8`, its scale in the tensors.
TEST(Fp8, ShardedIndexCarriesFp8Tensors) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("hmla_fp8_shards_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const StoredTensor q = fp8_tensor({3, 4}, 5);
  save_safetensors((dir / "a.safetensors").string(), {{"q.weight_scale_inv", scales({1, 1}, 1)}}, {}, {{"q.weight", q}});
  save_safetensors((dir / "b.safetensors").string(), {{"n", Tensor::zeros({3}, DType::f32)}});
  nlohmann::json idx = {{"weight_map", {{"q.weight", "a.safetensors"}, {"q.weight_scale_inv", "a.safetensors"}, {"n", "b.safetensors"}}}};
  std::ofstream(dir / "model.safetensors.index.json") << idx.dump();
  StoredMap f8;
  TensorMap w = load_checkpoint_tensors(dir.string(), &f8);
  EXPECT_EQ(f8.at("q.weight").bytes, q.bytes);
  EXPECT_EQ(w.size(), 2u);
  const Fp8Blocks b{128, 128};
  dequantize_fp8_weights(w, f8, &b, "ck");
  EXPECT_EQ(w.at("q.weight").shape(), (Shape{3, 4}));
  EXPECT_THROW(load_checkpoint_tensors(dir.string()), IoError);  // FP8 needs a place to go
  fs::remove_all(dir);
}

}  // namespace
}  // namespace hmla::io
