// hmla's FP8 reading against torch and transformers 5.24 (fixtures from tests/hf/make_form_fixtures.py):
// every e4m3 code decodes to torch's float8_e4m3fn -> float32, and a block-scaled weight with ragged
// last blocks dequantizes to what transformers' finegrained_fp8 computes in f32 (one product each:
// the same rounding, so the comparison is exact).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "hmla/io/checkpoint_forms.h"
#include "hmla/io/safetensors.h"

namespace hmla::io {
namespace {

TEST(HfForms, Fp8AsTorchAndTransformersDecodeIt) {
  StoredMap f8;
  TensorMap t = load_safetensors(std::string(HMLA_SOURCE_DIR) + "/tests/hf/fixtures/forms/fp8.safetensors", nullptr, &f8);
  ASSERT_EQ(f8.at("codes").bytes.size(), 256u);
  const float* v = t.at("values").data<float>();
  for (int c = 0; c < 256; ++c) {
    const uint8_t code = uint8_t(f8.at("codes").bytes[size_t(c)]);
    const float got = e4m3_to_f32(code);
    if (std::isnan(v[c])) EXPECT_TRUE(std::isnan(got)) << c;
    else EXPECT_EQ(std::memcmp(&got, &v[c], 4), 0) << "code " << c << ": " << got << " vs " << v[c];
  }
  TensorMap w{{"w.weight_scale_inv", t.at("w_scale_inv")}};
  StoredMap q{{"w.weight", f8.at("w")}};
  const Fp8Blocks b{2, 3};
  dequantize_fp8_weights(w, q, &b, "fixture");
  const Tensor& ref = t.at("w_deq");
  ASSERT_EQ(w.at("w.weight").shape(), ref.shape());
  for (int64_t i = 0; i < ref.numel(); ++i) EXPECT_EQ(w.at("w.weight").data<float>()[i], ref.data<float>()[i]) << i;
}

}  // namespace
}  // namespace hmla::io
