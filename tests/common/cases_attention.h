// The attention families' case tables in the registry: dense attention (AttnDenseCase) and sparse
// latent MQA (AttnSparseCase), rows in op_cases.h, at each backend's compute dtype. Runners:
// tests/cpu/test_attn_dense.cpp, test_attn_sparse.cpp (CPU) and tests/cuda/attn_cuda_check.cpp,
// sparse_cuda_check.cpp (CUDA: emulated, label emu; on a device, label gpu and hmla_cuda_check).
#pragma once
#include <vector>

#include "case_support.h"

namespace hmla::op_cases {
inline void case_rows_attention(const Backend& be, std::vector<RowUse>& out) {
  add_rows(out, "attn_dense", be.device() == Device::cpu ? "tests/cpu/test_attn_dense.cpp" : "tests/cuda/attn_cuda_check.cpp", be,
           be.compute_dtype(), attn_dense());
  add_rows(out, "attn_sparse", be.device() == Device::cpu ? "tests/cpu/test_attn_sparse.cpp" : "tests/cuda/sparse_cuda_check.cpp",
           be, be.compute_dtype(), attn_sparse());
}
}  // namespace hmla::op_cases
