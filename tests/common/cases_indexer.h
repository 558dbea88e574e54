// The indexer's case tables in the registry: the selection from given scores, scores and selection
// end to end, and the KLs (rows in op_cases.h). Runners: tests/cpu/test_indexer.cpp (CPU, and the
// emulated CUDA through test_cuda_emu) and tests/cuda/indexer_cuda_check.cpp, test_cuda_attention.cpp.
#pragma once
#include <vector>

#include "case_support.h"

namespace hmla::op_cases {
// The KL rows again on bf16 qI, kI, q, k: CUDA's tensor-core KLs (runner: MixedKlTensorCores in
// tests/cuda/emu/test_mixed_dtype_emu.cpp, against the float64 oracle with the kernels' roundings;
// the CPU reads f32 only).
inline std::vector<IndexerKlCase> indexer_kl_bf16() {
  std::vector<IndexerKlCase> t = indexer_kl();
  for (IndexerKlCase& c : t) c.bf16_inputs = true;
  return t;
}
inline void case_rows_indexer(const Backend& be, std::vector<RowUse>& out) {
  const bool cpu = be.device() == Device::cpu;
  add_rows(out, "indexer_select", "tests/cuda/test_cuda_attention.cpp", be, be.compute_dtype(), indexer_select());
  add_rows(out, "indexer_topk", "tests/cuda/test_cuda_attention.cpp", be, be.compute_dtype(), indexer_topk());
  add_rows(out, "indexer_kl", cpu ? "tests/cpu/test_indexer.cpp" : "tests/cuda/indexer_cuda_check.cpp", be,
           be.compute_dtype(), indexer_kl());
  add_rows(out, "indexer_kl_bf16", "tests/cuda/emu/test_mixed_dtype_emu.cpp", be, be.compute_dtype(), indexer_kl_bf16());
}
}  // namespace hmla::op_cases
