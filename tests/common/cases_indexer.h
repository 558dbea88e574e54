// The indexer's case tables in the registry: the selection from given scores, scores and selection
// end to end, and the KLs (rows in op_cases.h). Runners: tests/cpu/test_indexer.cpp (CPU, and the
// emulated CUDA through test_cuda_emu) and tests/cuda/indexer_cuda_check.cpp, test_cuda_attention.cpp.
#pragma once
#include <vector>

#include "case_support.h"

namespace hmla::op_cases {
inline void case_rows_indexer(const Backend& be, std::vector<RowUse>& out) {
  add_rows(out, "indexer_select", be, be.compute_dtype(), indexer_select());
  add_rows(out, "indexer_topk", be, be.compute_dtype(), indexer_topk());
  add_rows(out, "indexer_kl", be, be.compute_dtype(), indexer_kl());
}
}  // namespace hmla::op_cases
