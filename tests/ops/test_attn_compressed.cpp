// DeepSeek-V4's attention core (hmla/ops/compressed_attention.h) beyond its case rows
// (cases_attn_compressed.h, run by test_case_rows.cpp): the float64 oracle's gradients against
// central differences, the memory property (nothing [s, s] or [s, n_e] is allocated: the exact-byte
// allocator's peak over each pass), and the entry points' refusals.
#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>
#include <vector>

#include "cases_attn_compressed.h"
#include "hmla/core/allocator.h"
#include "hmla/core/cuda.h"
#include "hmla/core/error.h"

namespace hmla {
namespace {

using op_cases::AttnCompressedCase;
using op_cases::AttnCompressedData;

// L = sum dout . out in float64, for central differences.
double loss(const AttnCompressedCase& c, const AttnCompressedData& x) {
  const auto r = op_cases::attn_compressed_ref<double>(c, x);
  double l = 0;
  for (size_t i = 0; i < r.out.size(); ++i) l += x.dout[i] * r.out[i];
  return l;
}

// Each gradient of the oracle against (L(x + h) - L(x - h)) / 2h. With h = 1e-4 the truncation
// error is h^2 / 6 |L'''| and the cancellation error about 1e-16 |L| / h; with logits and values of
// a few units, |L'''| stays below ~1e2 here, so both stay below 1e-6, while a missing term of the
// chain rule (a sink, a K = V role, a mask) moves a gradient by at least ~1e-2.
TEST(AttnCompressedOracle, GradientsMatchCentralDifferences) {
  for (int64_t k : {0, 3}) {
    const AttnCompressedCase c{"fd", op_cases::Oracle::attn_compressed_ref, 1, 11, 2, 4, 3, 2, {{0, 5, 11}}, k};
    AttnCompressedData x = op_cases::attn_compressed_data(c);
    ASSERT_GT(x.n_e, 0);
    const auto r = op_cases::attn_compressed_ref<double>(c, x);
    const double h = 1e-4;
    auto fd = [&](std::vector<double>& v, const std::vector<double>& g, const char* name) {
      ASSERT_EQ(v.size(), g.size()) << name;
      for (size_t i = 0; i < v.size(); ++i) {
        const double v0 = v[i];
        v[i] = v0 + h;
        const double lp = loss(c, x);
        v[i] = v0 - h;
        const double lm = loss(c, x);
        v[i] = v0;
        EXPECT_NEAR((lp - lm) / (2 * h), g[i], 1e-6) << name << "[" << i << "] k = " << k;
      }
    };
    fd(x.q, r.dq, "dq");
    fd(x.kv, r.dkv, "dkv");
    fd(x.ent, r.dent, "dent");
    fd(x.sink, r.dsink, "dsink");
  }
}

// The memory property on a device: one document of s rows, n_e = s / m entries, dense and
// selected; each pass's peak above what was live before it is what the pass allocated. Bounded by
// the outputs plus O(s + n_e) workspace (CPU: per-thread key-gradient partials of (s + n_e) d and
// O(k d + 128 (H + d)) scratch; CUDA: 2 s H floats), far under one f32 [s, n_e] tensor.
void memory_property(Device dev, int64_t s) {
  const int64_t H = 2, d = 16, m = 4;
  for (int64_t k : {0, 16}) {
    const AttnCompressedCase c{"mem", op_cases::Oracle::attn_compressed_ref, 1, s, H, d, 64, m, {{0, s}}, k};
    AttnCompressedData x = op_cases::attn_compressed_data(c);
    const int64_t n_e = x.n_e;
    ASSERT_EQ(n_e, s / m);
    auto put = [dev](const Shape& sh, const std::vector<double>& v) {
      return Tensor::from_vector<float>(sh, std::vector<float>(v.begin(), v.end())).to(dev);
    };
    AttnCompressedInputs in;
    in.q = put({1, s, H, d}, x.q);
    in.kv = put({1, s, d}, x.kv);
    in.ent = put({1, n_e, d}, x.ent);
    in.ent_last = Tensor::from_vector<int32_t>({1, n_e}, x.ent_last).to(dev);
    in.ent_doc = Tensor::from_vector<int32_t>({1, n_e}, x.ent_doc).to(dev);
    if (k > 0) in.idx = Tensor::from_vector<int32_t>({1, s, k}, x.idx).to(dev);
    in.sink = Tensor::from_vector<float>({H}, std::vector<float>(x.sink.begin(), x.sink.end())).to(dev);
    in.layout = &x.layout;
    in.scale = 0.25f;
    in.window = 64;
    const Tensor dout = put({1, s, H, d}, x.dout);
    const DType dt = in.q.dtype();
    (void)in.layout->doc_start_on(dev);  // the layout's device copy is the caller's, not the pass's
    Allocator& a = allocator(dev);
    const int64_t threads = dev == Device::cpu ? omp_get_max_threads() : 1;
    const int64_t outputs_fwd = s * H * d * dtype_size(dt) + H * s * 4;
    const int64_t work_fwd = dev == Device::cpu ? threads * ((128 * H + H * d + 2 * H + k * d) * 4 + std::max<int64_t>(k, 1) * 4) : 0;
    int64_t before = int64_t(a.live_bytes());
    a.reset_peak();
    const AttnCompressedSaved sv = attn_compressed_fwd(in);
    const int64_t fwd_peak = int64_t(a.peak_bytes()) - before;
    // The layout's copies on the device (doc_start and doc_end, made by the entry point): 2 b s i32.
    const int64_t layout_copies = dev == Device::cpu ? 0 : 2 * s * 4;
    EXPECT_LE(fwd_peak, outputs_fwd + work_fwd + layout_copies) << "k = " << k;
    const int64_t outputs_bwd = (s * H * d + s * d + n_e * d) * dtype_size(dt) + H * 4;
    const int64_t work_bwd = dev == Device::cpu ? threads * ((s + n_e) * d * 4 + (2 * H * 128 + 128 * d + 2 * H + k * d) * 4 +
                                                             std::max<int64_t>(k, 1) * 4 + H * 4)
                                                : 2 * s * H * 4;
    before = int64_t(a.live_bytes());
    a.reset_peak();
    const AttnCompressedGrads g = attn_compressed_bwd(in, sv, dout);
    const int64_t bwd_peak = int64_t(a.peak_bytes()) - before;
    EXPECT_LE(bwd_peak, outputs_bwd + work_bwd + layout_copies) << "k = " << k;
    EXPECT_LT(std::max(fwd_peak - outputs_fwd, bwd_peak - outputs_bwd), s * n_e * 4 / 4)
        << "the workspace must stay under a quarter of one f32 [s, n_e] tensor";
    std::printf("attn_compressed memory on %s, s = %lld, n_e = %lld, k = %lld: forward %lld B, backward %lld B; one f32 [s, n_e] = %lld B\n",
                device_name(dev), (long long)s, (long long)n_e, (long long)k, (long long)fwd_peak, (long long)bwd_peak,
                (long long)(s * n_e * 4));
  }
}

TEST(AttnCompressedMemory, NothingProportionalToSTimesEntriesOnTheCpu) { memory_property(Device::cpu, 4096); }

TEST(AttnCompressedMemory, NothingProportionalToSTimesEntriesOnCuda) {
  if (!cuda_backend() || cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  memory_property(Device::cuda, 512);
}

// The contract's refusals, each naming what is wrong.
TEST(AttnCompressedInputs, RefusesEntriesOutOfOrderAndAZeroWindow) {
  const AttnCompressedCase c{"refuse", op_cases::Oracle::attn_compressed_ref, 1, 12, 1, 4, 3, 2, {{0, 5, 12}}};
  AttnCompressedData x = op_cases::attn_compressed_data(c);
  AttnCompressedInputs in;
  in.q = Tensor::zeros({1, 12, 1, 4}, DType::f32);
  in.kv = Tensor::zeros({1, 12, 4}, DType::f32);
  in.ent = Tensor::zeros({1, x.n_e, 4}, DType::f32);
  in.ent_last = Tensor::from_vector<int32_t>({1, x.n_e}, x.ent_last);
  in.ent_doc = Tensor::from_vector<int32_t>({1, x.n_e}, x.ent_doc);
  in.layout = &x.layout;
  in.scale = 0.5f;
  in.window = 3;
  EXPECT_NO_THROW(attn_compressed_fwd(in));
  std::vector<int32_t> swapped = x.ent_last;
  std::swap(swapped[0], swapped[1]);
  in.ent_last = Tensor::from_vector<int32_t>({1, x.n_e}, swapped);
  EXPECT_THROW(attn_compressed_fwd(in), LayoutError);
  std::vector<int32_t> outside = x.ent_last;
  outside[0] = 7;  // document [0, 5) ends at 4
  in.ent_last = Tensor::from_vector<int32_t>({1, x.n_e}, outside);
  EXPECT_THROW(attn_compressed_fwd(in), LayoutError);
  in.ent_last = Tensor::from_vector<int32_t>({1, x.n_e}, x.ent_last);
  in.window = 0;
  EXPECT_THROW(attn_compressed_fwd(in), ShapeError);
}

// Context parallelism's row shards (DESIGN.md section 8): every case row's query rows in 2 and 3
// calls at q_row0 = k s / shards (keys, entries and the layout whole), put together, meet the float64
// oracle by the rule (the key gradients' shard sum adds its rounding). A kernel that read the layout,
// the window or the visibility at the local row instead of the global position fails every row with
// documents (as one that walked a key's queries outside the call's rows). The CPU and, where there
// is one (the GPU or the emulator), CUDA twice: bf16 (the tensor-core kernels) and f32 (the SIMT
// kernels, which no other row checks since bf16 left them; in 3 shards only: the emulator's time).
TEST(AttnCompressedShards, QueryRowsAtAnOffsetMeetTheOracle) {
  struct Run {
    Device dev;
    bool f32;
  };
  std::vector<Run> runs{{Device::cpu, false}};
  if (cuda_backend() && cuda_device_count() > 0) runs.push_back({Device::cuda, false}), runs.push_back({Device::cuda, true});
  for (const Run& r : runs)
    for (const AttnCompressedCase& c : op_cases::attn_compressed_cases())
      for (int64_t shards : {2, 3}) {
        if (shards == 2 && r.f32) continue;
        EXPECT_EQ(op_cases::check(c, r.dev, shards, r.f32), "")
            << c.name << " in " << shards << " on " << device_name(r.dev) << (r.f32 ? " (f32)" : "");
      }
}

TEST(AttnCompressedInputs, RefusesQueryRowsPastTheLayout) {
  const AttnCompressedCase c{"rows", op_cases::Oracle::attn_compressed_ref, 1, 12, 1, 4, 3, 2, {{0, 5, 12}}};
  AttnCompressedData x = op_cases::attn_compressed_data(c);
  AttnCompressedInputs in;
  in.q = Tensor::zeros({1, 6, 1, 4}, DType::f32);
  in.kv = Tensor::zeros({1, 12, 4}, DType::f32);
  in.layout = &x.layout;
  in.scale = 0.5f;
  in.window = 3;
  in.q_row0 = 6;
  EXPECT_NO_THROW(attn_compressed_fwd(in));
  in.q_row0 = 7;  // rows [7, 13) of 12
  EXPECT_THROW(attn_compressed_fwd(in), LayoutError);
  in.q_row0 = -1;
  EXPECT_THROW(attn_compressed_fwd(in), LayoutError);
  in.q_row0 = 0;
  in.kv = Tensor::zeros({1, 6, 4}, DType::f32);  // kv covers the layout's rows, not q's
  EXPECT_THROW(attn_compressed_fwd(in), ShapeError);
}

}  // namespace
}  // namespace hmla
