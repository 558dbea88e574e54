#include <gtest/gtest.h>

#include <cmath>

#include "hmla/core/tensor.h"

namespace hmla {
namespace {

TEST(Allocator, CountsExactLiveAndPeakBytes) {
  Allocator& a = allocator(Device::cpu);
  const size_t base = a.live_bytes();
  a.reset_peak();
  {
    Tensor x = Tensor::empty({3, 5}, DType::f32);   // 60 bytes
    Tensor y = Tensor::empty({7}, DType::bf16);     // 14 bytes
    EXPECT_EQ(a.live_bytes(), base + 74);
    {
      Tensor z = Tensor::empty({2, 2}, DType::i64);  // 32 bytes
      EXPECT_EQ(a.peak_bytes(), base + 106);
    }
    EXPECT_EQ(a.live_bytes(), base + 74);
    EXPECT_EQ(a.peak_bytes(), base + 106);
    a.reset_peak();
    EXPECT_EQ(a.peak_bytes(), base + 74);
    Tensor v = x.slice(0, 1, 2);  // views allocate nothing
    EXPECT_EQ(a.live_bytes(), base + 74);
  }
  EXPECT_EQ(a.live_bytes(), base);
}

TEST(Tensor, ViewsShareStorageAndStride) {
  std::vector<float> vals(24);
  for (int i = 0; i < 24; ++i) vals[i] = float(i);
  Tensor t = Tensor::from_vector<float>({2, 3, 4}, vals);
  Tensor s = t.slice(2, 1, 3);  // [2, 3, 2]
  EXPECT_EQ(s.shape(), Shape({2, 3, 2}));
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{1, 2, 5, 6, 9, 10, 13, 14, 17, 18, 21, 22}));
  Tensor r = t.select(1, 2);  // [2, 4]
  EXPECT_EQ(r.to_vector<float>(), (std::vector<float>{8, 9, 10, 11, 20, 21, 22, 23}));
  EXPECT_EQ(t.view({6, -1}).shape(), Shape({6, 4}));
  EXPECT_THROW(s.view({12}), ShapeError);
  EXPECT_THROW(t.view({5, 5}), ShapeError);
  EXPECT_THROW(t.slice(0, 1, 3), ShapeError);
  EXPECT_THROW(t.data<int32_t>(), ShapeError);
  s.data<float>()[0] = -1.f;  // writes through the view
  EXPECT_EQ(t.data<float>()[1], -1.f);
}

TEST(Tensor, CopyFromStridedAndClone) {
  Tensor t = Tensor::from_vector<int32_t>({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor col = t.slice(1, 1, 2);  // [2, 1] strided
  Tensor c = col.clone();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.to_vector<int32_t>(), (std::vector<int32_t>{2, 5}));
  Tensor dst = Tensor::zeros({2, 1}, DType::i32);
  dst.copy_from(col);
  EXPECT_EQ(dst.to_vector<int32_t>(), (std::vector<int32_t>{2, 5}));
  EXPECT_THROW(dst.copy_from(t), ShapeError);
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f).bits, 0x3f80);
  // 1 + 2^-8 is halfway between two bf16 values: ties go to the even one (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + 1.0f / 256).bits, 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3.0f / 256).bits, 0x3f82);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-2.5f)), -2.5f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

}  // namespace
}  // namespace hmla
