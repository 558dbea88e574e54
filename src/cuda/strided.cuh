// Element-wise maps over strided views of up to four dimensions on the device: the caching
// allocator's copies within the device (same type) and the convert op (f32 <-> bf16). One thread
// per element in a grid-stride loop; the flat index is split over the dimensions, last fastest.
#pragma once
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "runtime.h"

namespace hmla::cuda {

struct Strided4 {
  int64_t shape[4] = {1, 1, 1, 1}, dst[4] = {0, 0, 0, 0}, src[4] = {0, 0, 0, 0};
  int64_t n = 0;
};

// The last `dims` dimensions; the leading ones are of size 1.
inline Strided4 strided4(const int64_t* shape, const int64_t* dst, const int64_t* src, int dims) {
  Strided4 g;
  for (int d = 0; d < dims; ++d) {
    const int k = 4 - dims + d;
    g.shape[k] = shape[d], g.dst[k] = dst[d], g.src[k] = src[d];
  }
  g.n = g.shape[0] * g.shape[1] * g.shape[2] * g.shape[3];
  return g;
}

__device__ __forceinline__ void put(float& d, float s) { d = s; }
__device__ __forceinline__ void put(__nv_bfloat16& d, float s) { d = __float2bfloat16_rn(s); }
__device__ __forceinline__ void put(float& d, __nv_bfloat16 s) { d = __bfloat162float(s); }
template <class T>
__device__ __forceinline__ void put(T& d, T s) {
  d = s;
}

template <class To, class From>
__global__ void strided_map_kernel(To* dst, const From* src, Strided4 g) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < g.n; i += step) {
    int64_t r = i, od = 0, os = 0;
    for (int d = 3; d >= 0; --d) {
      const int64_t c = r % g.shape[d];
      r /= g.shape[d];
      od += c * g.dst[d];
      os += c * g.src[d];
    }
    put(dst[od], src[os]);
  }
}

// Blocks for a grid-stride loop over n elements (256 threads each).
inline unsigned grid_for(int64_t n) { return unsigned(std::max<int64_t>(1, std::min<int64_t>((n + 255) / 256, 8192))); }

template <class To, class From>
void strided_map(To* dst, const From* src, const Strided4& g) {
  if (g.n == 0) return;
  auto* kernel = strided_map_kernel<To, From>;
  HMLA_LAUNCH(kernel, grid_for(g.n), 256, 0, current_stream().get(), dst, src, g);
  check_launch("strided copy");
}

}  // namespace hmla::cuda
