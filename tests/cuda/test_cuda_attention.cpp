// The CUDA backend's rows of the op case tables (op_cases.h) against the references of the
// attn/sparse/indexer_cuda_check harnesses (the bf16 rule), and the harnesses' own self-tests on
// the CPU. Built twice: against the device (label gpu, skipped without one) and against the SIMT
// emulator (tests/cuda/emu, label emu).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "attn_cuda_check.h"
#include "cases_attn_compressed.h"
#include "cuda_kernels.h"
#include "case_support.h"
#include "check_util.h"
#include "indexer_cuda_check.h"
#include "sparse_cuda_check.h"
#include "hmla/ops/attention.h"
#include "hmla/ops/backend.h"

namespace hmla {
namespace {

using op_cases::IndexerSelectCase;
using op_cases::IndexerTopkCase;

class CudaAttention : public ::testing::TestWithParam<cuda_check::Case> {};

TEST_P(CudaAttention, MatchesTheReferencesAndIsDeterministic) {
  if (!cuda_check::device_available()) GTEST_SKIP() << "no CUDA device";
  cuda_check::CaseResult r = cuda_check::check_case(GetParam(), 42);
  EXPECT_TRUE(r.deterministic) << r.json();
  for (const auto& e : r.tensors) EXPECT_TRUE(e.ok) << e.name << ": " << r.json();
}

// The same rows through cuDNN's fused attention where it takes them (sm_90, widths <= 256, no sink,
// whole rows); the others say why it declines. Only a build with the cuDNN path has it to test.
TEST_P(CudaAttention, ThroughCudnnMatchesTheReferencesAndIsDeterministic) {
  if (!cuda_check::device_available()) GTEST_SKIP() << "no CUDA device";
  if (!attn_cudnn_built()) GTEST_SKIP() << "this build has no cuDNN path";
  cuda_check::CaseResult r = cuda_check::check_case(GetParam(), 42, Device::cuda, 1.f, AttnBackend::cudnn);
  if (!r.declined.empty()) GTEST_SKIP() << r.declined;
  EXPECT_TRUE(r.deterministic) << r.json();
  for (const auto& e : r.tensors) EXPECT_TRUE(e.ok) << e.name << ": " << r.json();
}

INSTANTIATE_TEST_SUITE_P(Table, CudaAttention, ::testing::ValuesIn(cuda_check::cases()),
                         op_cases::RowName());

class CudaSparse : public ::testing::TestWithParam<cuda_check::SparseCase> {};

TEST_P(CudaSparse, MatchesTheReferencesAndIsDeterministic) {
  if (!cuda_check::device_available()) GTEST_SKIP() << "no CUDA device";
  const auto r = cuda_check::check_sparse(GetParam(), 3);
  EXPECT_TRUE(r.ok) << r.json();
}

INSTANTIATE_TEST_SUITE_P(Table, CudaSparse, ::testing::ValuesIn(cuda_check::sparse_cases()),
                         op_cases::RowName());

TEST(CudaSparse, ChunkedBackwardAndTheTableCheck) {
  if (!cuda_check::device_available()) GTEST_SKIP() << "no CUDA device";
  // The backward's dkv a row at a time (a workspace of one row) on the widest row (K + W >= 128):
  // many chunks, the same result.
  const auto rows = cuda_check::sparse_cases();
  const auto wide = std::find_if(rows.begin(), rows.end(), [](const auto& c) { return c.K + c.W >= 128; });
  ASSERT_NE(wide, rows.end());
  const auto chunked = [&] {
    const cuda_check::ScopedSparseBwdWorkspace one_row(1);
    return cuda_check::check_sparse(*wide, 3);
  }();
  EXPECT_TRUE(chunked.ok) << chunked.json();
  EXPECT_TRUE(cuda_check::sparse_rejects_duplicates());
}

// DeepSeek-V4's attention core: the tensor-core backward's key gradients a row at a time (a
// workspace of one row: a chunk per row, each reduction walking only its chunk's rows) on the
// table's rows with documents, two batch rows and selected slots: the oracle's bound as in one chunk.
TEST(CudaCompressed, ChunkedBackwardMeetsTheOracle) {
  if (!cuda_check::device_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t previous = cuda::set_attn_compressed_bwd_workspace_bytes(1);
  for (const op_cases::AttnCompressedCase& c : op_cases::attn_compressed_cases())
    if (c.name == "dense_packed_h4" || c.name == "dense_two_rows" || c.name == "selected_h1_two_rows") {
      EXPECT_EQ(op_cases::check(c, Device::cuda), "") << c.name;
    }
  cuda::set_attn_compressed_bwd_workspace_bytes(previous);
}

class CudaIndexerSelect : public ::testing::TestWithParam<IndexerSelectCase> {};

TEST_P(CudaIndexerSelect, FromTheSameScoresIsTheCpuTable) {
  if (!cuda_check::device_available()) GTEST_SKIP() << "no CUDA device";
  const IndexerSelectCase& c = GetParam();
  const auto r = cuda_check::check_select(c.s, c.K, c.W, c.q_row0, 1);
  EXPECT_TRUE(r.ok) << r.json();
}

INSTANTIATE_TEST_SUITE_P(Table, CudaIndexerSelect, ::testing::ValuesIn(cuda_check::indexer_select_cases()),
                         op_cases::RowName());

class CudaIndexerTopk : public ::testing::TestWithParam<IndexerTopkCase> {};

TEST_P(CudaIndexerTopk, FromBf16InputsMatchesTheReferenceSets) {
  if (!cuda_check::device_available()) GTEST_SKIP() << "no CUDA device";
  const IndexerTopkCase& c = GetParam();
  const auto r = cuda_check::check_topk(c.s, c.HI, c.DI, c.K, c.W, 5);
  EXPECT_TRUE(r.ok) << r.json();
}

INSTANTIATE_TEST_SUITE_P(Table, CudaIndexerTopk, ::testing::ValuesIn(cuda_check::indexer_topk_cases()),
                         op_cases::RowName());

// The sparse rule passes the f32 CPU kernel and fails a 2% scale error, and a backward fed a
// grad_output 2% off (the forward then passes).
TEST(CudaCheckHarness, TheSparseRuleAcceptsTheCpuKernelAndRejectsAWrongOne) {
  for (const auto& c : cuda_check::sparse_cases()) {
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
  for (const cuda_check::Case& c : cuda_check::cases()) {
    cuda_check::CaseResult good = cuda_check::check_case(c, 7, Device::cpu);
    EXPECT_TRUE(good.ok) << good.json();
    cuda_check::CaseResult bad = cuda_check::check_case(c, 7, Device::cpu, 1.02f);
    EXPECT_FALSE(bad.ok) << bad.json();
  }
}

// The indexer check's set comparison passes hmla's f32 CPU top-k on the same inputs.
TEST(CudaCheckHarness, TheTopkComparisonAcceptsTheCpuSelection) {
  for (const IndexerTopkCase& c : op_cases::run_by(&cpu_backend(), DType::f32, op_cases::indexer_topk())) {
    const auto r = cuda_check::check_topk(c.s, c.HI, c.DI, c.K, c.W, 5, Device::cpu);
    EXPECT_TRUE(r.ok) << r.json();
    EXPECT_GT(r.rows_compared, r.rows / 2) << r.json();
  }
}

// The error measure every CUDA check rests on (check_util.h): NaN never passes, an infinity
// passes only against the same infinity (lse of empty rows), and the reference's magnitude (the
// rounding term's scale) counts negative values.
TEST(CudaCheckHarness, TheErrorMeasureRejectsNanAndMismatchedInfinities) {
  EXPECT_EQ(cuda_check::max_err(std::vector<float>{1.5f, INFINITY}, {1.0, INFINITY}), 0.5);
  EXPECT_EQ(cuda_check::max_err(std::vector<float>{NAN}, {1.0}), INFINITY);
  EXPECT_EQ(cuda_check::max_err(std::vector<float>{1.f, 2.f}, {1.0, INFINITY}), INFINITY);
  EXPECT_EQ(cuda_check::max_err(std::vector<float>{INFINITY}, {1.0}), INFINITY);
  EXPECT_EQ(cuda_check::max_err(std::vector<float>{-INFINITY}, {INFINITY}), INFINITY);
  EXPECT_EQ(cuda_check::max_abs({-3.0, 2.0, -INFINITY, NAN}), 3.0);
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
