// Which product kernels the CPU backend runs: OpenBLAS's kernel set (it picks one per CPU at load
// time; OPENBLAS_CORETYPE overrides it) or hmla's built-in sgemm. Results are deterministic per
// build and kernel set; another kernel set sums tile products in another order (docs/bench.md).
#pragma once
#include <string>

namespace hmla {

struct CpuBlasInfo {
  std::string library;  // "OpenBLAS 0.3.21 ..." (its build configuration) or "built-in"
  std::string core;     // the kernel set in use: "Haswell", "SkylakeX", "Prescott", ... or "built-in"
  std::string cpu_isa;  // the widest vector ISA of this CPU: "AVX-512", "AVX2" or "SSE"
};

CpuBlasInfo cpu_blas_info();

// One line for the console when OpenBLAS runs kernels far below what the CPU supports (its SSE3
// "Prescott" fallback on an AVX2 or AVX-512 CPU it does not recognise), else "". hmla never sets
// OPENBLAS_CORETYPE itself: the hint names it.
std::string cpu_blas_hint();

}  // namespace hmla
