// The CUDA dense attention against the CPU references (attn_cuda_check.h has the rule); skipped
// without a device. Label gpu.
#include <gtest/gtest.h>

#include <cstdlib>

#include "attn_cuda_check.h"
#include "indexer_cuda_check.h"
#include "sparse_cuda_check.h"
#include "hmla/ops/attention.h"

namespace hmla {
namespace {

class CudaAttention : public ::testing::TestWithParam<cuda_check::Case> {};

TEST_P(CudaAttention, MatchesTheReferencesAndIsDeterministic) {
  if (!cuda_check::device_available()) GTEST_SKIP() << "no CUDA device";
  cuda_check::CaseResult r = cuda_check::check_case(GetParam(), 42);
  EXPECT_TRUE(r.deterministic) << r.json();
  for (const auto& e : r.tensors) EXPECT_TRUE(e.ok) << e.name << ": " << r.json();
}

INSTANTIATE_TEST_SUITE_P(Table, CudaAttention, ::testing::ValuesIn(cuda_check::cases()),
                         [](const auto& info) { return info.param.name; });

TEST(CudaIndexer, SelectionFromTheSameScoresIsTheCpuTable) {
  if (!cuda_check::device_available()) GTEST_SKIP() << "no CUDA device";
  for (const auto& r : {cuda_check::check_select(300, 64, 0, 0, 1), cuda_check::check_select(300, 16, 5, 100, 2),
                        cuda_check::check_select(3000, 2048, 0, 0, 3), cuda_check::check_select(3000, 2048, 64, 1000, 4)})
    EXPECT_TRUE(r.ok) << r.json();
}

TEST(CudaIndexer, TopkFromBf16InputsMatchesTheReferenceSets) {
  if (!cuda_check::device_available()) GTEST_SKIP() << "no CUDA device";
  for (const auto& r : {cuda_check::check_topk(300, 64, 128, 32, 4, 5), cuda_check::check_topk(600, 16, 32, 256, 0, 6)})
    EXPECT_TRUE(r.ok) << r.json();
}

const std::vector<cuda_check::SparseCase> kSparseCases{
    {"sparse_576_512_h16", 1, 96, 16, 576, 512, 24, 4, false},
    {"sparse_576_512_h64_b2_sink", 2, 48, 64, 576, 512, 16, 0, true},
    {"sparse_128_128_h128", 1, 48, 128, 128, 128, 40, 8, true},
    {"sparse_192_160_h32_kw140", 1, 140, 32, 192, 160, 100, 40, true},  // compaction over 2 rounds, partial chunk and head group
    {"sparse_k0_window_only", 1, 64, 16, 128, 128, 0, 12, false},
};

TEST(CudaSparse, ForwardMatchesTheReferencesAndIsDeterministic) {
  if (!cuda_check::device_available()) GTEST_SKIP() << "no CUDA device";
  for (const auto& c : kSparseCases) {
    const auto r = cuda_check::check_sparse(c, 3);
    EXPECT_TRUE(r.ok) << r.json();
  }
  // The backward's dkv a row at a time (a workspace of one row): many chunks, the same result.
  setenv("HMLA_SPARSE_BWD_WORKSPACE_BYTES", "1", 1);
  const auto chunked = cuda_check::check_sparse(kSparseCases[3], 3);
  unsetenv("HMLA_SPARSE_BWD_WORKSPACE_BYTES");
  EXPECT_TRUE(chunked.ok) << chunked.json();
  EXPECT_TRUE(cuda_check::sparse_rejects_duplicates());
}

// The sparse rule passes the f32 CPU kernel and fails a 2% scale error, and a backward fed a
// grad_output 2% off (the forward then passes).
TEST(CudaCheckHarness, TheSparseRuleAcceptsTheCpuKernelAndRejectsAWrongOne) {
  for (const auto& c : kSparseCases) {
    const auto good = cuda_check::check_sparse(c, 3, Device::cpu);
    EXPECT_TRUE(good.ok) << good.json();
    const auto bad = cuda_check::check_sparse(c, 3, Device::cpu, 1.02f);
    EXPECT_FALSE(bad.ok) << bad.json();
    const auto bad_bwd = cuda_check::check_sparse(c, 3, Device::cpu, 1.f, 1.02f);
    EXPECT_FALSE(bad_bwd.ok) << bad_bwd.json();
    EXPECT_LE(bad_bwd.out_err, bad_bwd.out_bound) << bad_bwd.json();
  }
}

// The harness itself, on the CPU: hmla's f32 kernels pass the bf16 rule on every case (a right
// kernel passes), and a kernel with a 2% error in its softmax scale fails it (a wrong one fails).
TEST(CudaCheckHarness, TheRuleAcceptsTheCpuKernelAndRejectsAWrongOne) {
  for (cuda_check::Case c : cuda_check::cases()) {
    cuda_check::CaseResult good = cuda_check::check_case(c, 7, Device::cpu);
    EXPECT_TRUE(good.ok) << good.json();
    c.kernel_scale_factor = 1.02f;
    cuda_check::CaseResult bad = cuda_check::check_case(c, 7, Device::cpu);
    EXPECT_FALSE(bad.ok) << bad.json();
  }
}

// The indexer check's set comparison passes hmla's f32 CPU top-k on the same inputs.
TEST(CudaCheckHarness, TheTopkComparisonAcceptsTheCpuSelection) {
  for (const auto& r : {cuda_check::check_topk(300, 64, 128, 32, 4, 5, Device::cpu),
                        cuda_check::check_topk(600, 16, 32, 256, 0, 6, Device::cpu)}) {
    EXPECT_TRUE(r.ok) << r.json();
    EXPECT_GT(r.rows_compared, r.rows / 2) << r.json();
  }
}

// CPU-side dispatch: what each device supports, and a clear error otherwise.
TEST(AttentionDispatch, SupportsByDeviceAndDtype) {
  DocLayout layout = layout_causal(1, 4);
  AttnDenseInputs in;
  in.q = Tensor::zeros({1, 4, 1, 16}, DType::bf16);
  in.k = in.q;
  in.v = in.q;
  in.layout = &layout;
  in.scale = 1.f;
  EXPECT_FALSE(attn_dense_supports(in));  // bf16 on the CPU
  EXPECT_THROW(attn_dense_fwd(in), ShapeError);
  in.q = in.k = in.v = Tensor::zeros({1, 4, 1, 16}, DType::f32);
  EXPECT_TRUE(attn_dense_supports(in));
  if (!cuda_check::device_available()) return;
  in.q = in.k = in.v = Tensor::zeros({1, 4, 1, 16}, DType::bf16, Device::cuda);
  EXPECT_TRUE(attn_dense_supports(in));
  in.q = in.k = Tensor::zeros({1, 4, 1, 12}, DType::bf16, Device::cuda);  // Dqk % 16 != 0
  EXPECT_FALSE(attn_dense_supports(in));
}

}  // namespace
}  // namespace hmla
