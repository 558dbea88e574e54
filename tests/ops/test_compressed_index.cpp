// The CSA indexer over compressed entries (hmla/ops/compressed_index.h) beyond its case rows
// (cases_compressed_index.h, run by test_case_rows.cpp): a hand-made row whose whole table is
// known (exact ties at a positive score and at 0, a query row of zeros, all-negative products, -1
// pads, padding rows), on every device of the build; the memory property (the top-k allocates its
// table and O(threads n_e) workspace, nothing [s, n_e]); and the entry points' refusals.
#include <gtest/gtest.h>

#include <omp.h>

#include <vector>

#include "cases_compressed_index.h"
#include "hmla/core/allocator.h"
#include "hmla/core/cuda.h"
#include "hmla/core/error.h"

namespace hmla {
namespace {

// One document [0, 8) (rows 8, 9 padding), rate 2: entries e = 0..3 end at rows 1, 3, 5, 7. nI = 1,
// dI = 2, w = 1, so I(t, e) = relu(qI[t] . kI[e]). kI: e0 = (1, 0), e1 = (0, 0) (I = 0), e2 = e0
// (an exact tie), e3 = (2, 0). qI = (1, 0) but row 6 = (0, 0) (every I = 0) and row 7 = (-1, 0)
// (every product <= 0: every I = 0). K = 3.
struct TieRow {
  DocLayout layout = layout_from_cu_seqlens(10, {{0, 8}});
  std::vector<float> qI{1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 0, 0, -1, 0, 1, 0, 1, 0};
  std::vector<float> kI{1, 0, 0, 0, 1, 0, 2, 0};
  std::vector<float> w = std::vector<float>(10, 1.f);
  std::vector<int32_t> ent_last{1, 3, 5, 7}, ent_doc{0, 0, 0, 0};
  CompressedIndexInputs on(Device dev) const {
    CompressedIndexInputs in;
    in.qI = Tensor::from_vector<float>({1, 10, 1, 2}, qI).to(dev);
    in.kI = Tensor::from_vector<float>({1, 4, 2}, kI).to(dev);
    in.w = Tensor::from_vector<float>({1, 10, 1}, w).to(dev);
    in.ent_last = Tensor::from_vector<int32_t>({1, 4}, ent_last).to(dev);
    in.ent_doc = Tensor::from_vector<int32_t>({1, 4}, ent_doc).to(dev);
    in.layout = &layout;
    return in;
  }
};

std::vector<Device> devices() {
  std::vector<Device> d{Device::cpu};
  if (cuda_backend() && cuda_device_count() > 0) d.push_back(Device::cuda);
  return d;
}

TEST(CompressedIndex, ExactTiesGoToTheSmallerEntry) {
  const std::vector<int32_t> want{
      -1, -1, -1,  // t 0: no window has ended
      0,  -1, -1,  // t 1: e0
      0,  -1, -1,  // t 2
      0,  1,  -1,  // t 3: e0 (1), e1 (0)
      0,  1,  -1,  // t 4
      0,  2,  1,   // t 5: e0 and e2 tie at 1, then e1 at 0
      0,  1,  2,   // t 6: qI = 0, every score 0: ascending
      0,  1,  2,   // t 7: every product <= 0: every score 0, the first three of four
      -1, -1, -1,  // t 8, 9: padding
      -1, -1, -1,
  };
  const TieRow r;
  for (Device dev : devices()) {
    const Tensor idx = compressed_index_topk(r.on(dev), 3).to(Device::cpu);
    EXPECT_EQ(std::vector<int32_t>(idx.data<int32_t>(), idx.data<int32_t>() + idx.numel()), want) << device_name(dev);
    const Tensor sc = compressed_index_scores(r.on(dev)).to(Device::cpu);
    const float* s = sc.data<float>();
    EXPECT_EQ(s[5 * 4 + 0], 1.f) << device_name(dev);
    EXPECT_EQ(s[5 * 4 + 2], 1.f) << device_name(dev);
    EXPECT_EQ(s[5 * 4 + 3], -INFINITY) << device_name(dev);  // e3 ends at row 7
    EXPECT_EQ(s[7 * 4 + 3], 0.f) << device_name(dev);
    EXPECT_EQ(s[8 * 4 + 0], -INFINITY) << device_name(dev);  // padding
  }
}

// The top-k's allocations: its [b, s, K] table plus O(threads n_e) (the CPU: n_e floats and n_e
// ints per thread; CUDA: n_e floats per block in flight and the layout's device copy), far under one
// f32 [s, n_e] tensor at s = 4096 on the CPU.
void memory_property(Device dev, int64_t s, int64_t blocks) {
  const op_cases::CompressedIndexCase c{"mem", op_cases::Oracle::compressed_index_ref, 1, s, 2, 16, 4, 64, {{0, s}}};
  const op_cases::CompressedIndexData x = op_cases::compressed_index_data(c);
  const int64_t n_e = x.n_e;
  ASSERT_EQ(n_e, s / 4);
  auto put = [dev](const Shape& sh, const std::vector<double>& v) {
    return Tensor::from_vector<float>(sh, std::vector<float>(v.begin(), v.end())).to(dev);
  };
  CompressedIndexInputs in;
  in.qI = put({1, s, 2, 16}, x.qI);
  in.kI = put({1, n_e, 16}, x.kI);
  in.w = put({1, s, 2}, x.w);
  in.ent_last = Tensor::from_vector<int32_t>({1, n_e}, x.ent_last).to(dev);
  in.ent_doc = Tensor::from_vector<int32_t>({1, n_e}, x.ent_doc).to(dev);
  in.layout = &x.layout;
  Allocator& a = allocator(dev);
  const int64_t before = int64_t(a.live_bytes());
  a.reset_peak();
  const Tensor idx = compressed_index_topk(in, c.K);
  const int64_t peak = int64_t(a.peak_bytes()) - before, table = s * c.K * 4;
  // CUDA: the scores' scratch and the layout's doc_start on the device (made by the entry point).
  const int64_t work = dev == Device::cpu ? int64_t(omp_get_max_threads()) * n_e * 8 : blocks * n_e * 4 + s * 4;
  EXPECT_LE(peak, table + work);
  if (dev == Device::cpu) {
    EXPECT_LT(peak - table, s * n_e * 4 / 4) << "under a quarter of one f32 [s, n_e] tensor";
  }
  std::printf("compressed_index_topk memory on %s, s = %lld, n_e = %lld: %lld B beyond the table; one f32 [s, n_e] = %lld B\n",
              device_name(dev), (long long)s, (long long)n_e, (long long)(peak - table), (long long)(s * n_e * 4));
}

TEST(CompressedIndexMemory, NothingProportionalToSTimesEntriesOnTheCpu) { memory_property(Device::cpu, 4096, 0); }

TEST(CompressedIndexMemory, AFixedNumberOfRowsInFlightOnCuda) {
  if (!cuda_backend() || cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  memory_property(Device::cuda, 512, 256);  // CompressedIndexTraits::kMaxBlocks
}

// The contract's refusals, each naming what is wrong.
TEST(CompressedIndexInputs, RefusesBadShapesDtypesKAndMetadata) {
  const TieRow r;
  CompressedIndexInputs in = r.on(Device::cpu);
  EXPECT_THROW(compressed_index_topk(in, 0), ShapeError);
  in.w = Tensor::zeros({1, 10, 2}, DType::f32);  // nI = 1
  EXPECT_THROW(compressed_index_topk(in, 2), ShapeError);
  in = r.on(Device::cpu);
  in.kI = Tensor::zeros({1, 4, 3}, DType::f32);  // dI = 2
  EXPECT_THROW(compressed_index_scores(in), ShapeError);
  in = r.on(Device::cpu);
  in.qI = Tensor::zeros({1, 10, 1, 2}, DType::bf16);
  EXPECT_THROW(compressed_index_topk(in, 2), ShapeError);
  in = r.on(Device::cpu);
  in.ent_doc = Tensor::from_vector<float>({1, 4}, {0, 0, 0, 0});  // i32 metadata
  EXPECT_THROW(compressed_index_topk(in, 2), ShapeError);
  in = r.on(Device::cpu);
  in.ent_last = Tensor::from_vector<int32_t>({1, 4}, {1, 5, 3, 7});  // out of order
  EXPECT_THROW(compressed_index_topk(in, 2), LayoutError);
  in = r.on(Device::cpu);
  in.ent_last = Tensor::from_vector<int32_t>({1, 4}, {1, 3, 5, 9});  // past the document's end
  EXPECT_THROW(compressed_index_topk(in, 2), LayoutError);
  in = r.on(Device::cpu);
  const DocLayout other = layout_from_cu_seqlens(12, {{0, 12}, {0, 12}});  // b = 2
  in.layout = &other;
  EXPECT_THROW(compressed_index_topk(in, 2), LayoutError);
  in = r.on(Device::cpu);
  in.q_row0 = 1;  // query rows [1, 11) of the layout's 10
  EXPECT_THROW(compressed_index_topk(in, 2), LayoutError);
  in.q_row0 = -1;
  EXPECT_THROW(compressed_index_topk(in, 2), LayoutError);
  in.layout = nullptr;
  EXPECT_THROW(compressed_index_topk(in, 2), LayoutError);
}

// Context parallelism's row shards (DESIGN.md section 8): every case row's query rows in 2 and 3
// calls at q_row0 = k s / shards, put together, give the table and the scores the oracle's rule
// accepts (a kernel reading the layout at the local row would pick other documents' entries); on
// CUDA (the GPU or the emulator) also the CPU's bits.
TEST(CompressedIndexShards, QueryRowsAtAnOffsetMeetTheOracle) {
  for (Device dev : devices())
    for (const op_cases::CompressedIndexCase& c : op_cases::compressed_index_cases())
      for (int64_t shards : {2, 3})
        EXPECT_EQ(op_cases::check(c, dev, shards), "") << c.name << " in " << shards << " on " << device_name(dev);
}

}  // namespace
}  // namespace hmla
