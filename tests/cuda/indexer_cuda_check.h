// The CUDA indexer selection against the CPU: shared by the gtest suite (label gpu) and
// hmla_cuda_check.
//   select: the same f32 scores (exact ties and -0/+0 planted) give the CPU's table bit for bit,
//           for K below and above |R(t)|, windows, padding and a query-row slice;
//   topk:   end to end from bf16 qI/kI and f32 w, the window part exact and each row's top K equal
//           as a set to the float64 reference's wherever the K-th/(K+1)-th score gap exceeds
//           bf16 rounding (2^-8 of the row's largest |I|).
#pragma once
#include <cstdint>
#include <string>

#include <vector>

#include "hmla/core/allocator.h"
#include "op_cases.h"

namespace hmla::cuda_check {

struct IndexerCheck {
  std::string name;
  bool ok = false;
  int64_t rows = 0, rows_compared = 0;  // topk: rows whose gap allowed a set comparison
  std::string json() const;
};

// The rows of the selection tables (op_cases.h) the CUDA backend runs: select on f32 scores, topk
// on bf16 qI and kI, as its supports() answers for each row's params (case_support.h).
std::vector<op_cases::IndexerSelectCase> indexer_select_cases();
std::vector<op_cases::IndexerTopkCase> indexer_topk_cases();

IndexerCheck check_select(int64_t s, int64_t K, int64_t W, int64_t q_row0, uint64_t seed);
// dev = cpu runs hmla's f32 CPU top-k on the same (bf16-valued) inputs: the harness's self-test.
IndexerCheck check_topk(int64_t s, int64_t HI, int64_t DI, int64_t K, int64_t W, uint64_t seed,
                        Device dev = Device::cuda);

// Scores + top-k on one causal document, median of `reps` CUDA-event timings.
struct IndexerBench {
  int64_t s, HI, DI, K;
  double ms = 0;
  int64_t peak_bytes = 0;
  std::string json() const;
};
IndexerBench bench_indexer(int64_t s, int64_t HI, int64_t DI, int64_t K, int reps);

}  // namespace hmla::cuda_check
