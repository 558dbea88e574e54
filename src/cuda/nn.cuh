// What the dense ops (nn.cu) and the optimizer steps (optim.cu) share: the block size, the
// grid-stride loop and the launch of a grid-stride kernel, and the in-order device sum of f64
// partials (the host loop's order, so the bits are those the host sum had).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "runtime.h"
#include "strided.cuh"  // grid_for
#include "traits.h"

#define HMLA_GRID_STRIDE(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

namespace hmla::cuda::detail {

inline cudaStream_t stream() { return current_stream().get(); }

// A grid-stride kernel over n items, NnTraits::kThreads per block (none: no launch).
template <class K, class P>
void launch(K kernel, int64_t n, const P& p, const char* what) {
  if (n <= 0) return;
  HMLA_LAUNCH(kernel, grid_for(n), NnTraits::kThreads, 0, stream(), p);
  check_launch(what);
}

// *acc += part[0 .. n) in order, on the device, by one thread (nn.cu).
void ordered_sum(const double* part, int64_t n, double* acc, const char* what);

}  // namespace hmla::cuda::detail
