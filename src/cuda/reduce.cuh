// Block-wide reductions with a fixed tree over the block's kThreads threads (deterministic: the
// same additions in the same order every launch); every thread gets the result. `red` is
// kThreads values of shared memory; the block's threads must all call.
#pragma once
#include <cmath>

namespace hmla::cuda {

template <int kThreads, class T>
__device__ T block_sum(T v, T* red) {
  static_assert((kThreads & (kThreads - 1)) == 0, "a power of two");
  red[threadIdx.x] = v;
  __syncthreads();
  for (int o = kThreads / 2; o > 0; o >>= 1) {
    if (int(threadIdx.x) < o) red[threadIdx.x] += red[threadIdx.x + o];
    __syncthreads();
  }
  const T r = red[0];
  __syncthreads();
  return r;
}

template <int kThreads>
__device__ float block_max(float v, float* red) {
  red[threadIdx.x] = v;
  __syncthreads();
  for (int o = kThreads / 2; o > 0; o >>= 1) {
    if (int(threadIdx.x) < o) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + o]);
    __syncthreads();
  }
  const float r = red[0];
  __syncthreads();
  return r;
}

}  // namespace hmla::cuda
