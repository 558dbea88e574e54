// The attention mass's sums on the GPU (hmla/ops/compressed_attention.h, attn_compressed_mass): one
// block; thread i takes the (row, head) pairs i, i + kThreads, ... in f64, then the block's partial
// sums meet in a fixed tree (no atomics: the same bits on every run). A logging step's metric, so
// one block is enough: a V4-Flash layer at s = 65536 has 4M pairs, a few hundred microseconds.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda_kernels.h"
#include "runtime.h"

namespace hmla::cuda {

namespace {

constexpr int kThreads = 256;  // a power of two for the tree

__global__ void __launch_bounds__(kThreads) mass_kernel(AttnMassParams p) {
  __shared__ double part[4][kThreads];
  double sum[4] = {0, 0, 0, 0};  // window, entries, sink, (row, head) pairs
  const int64_t pairs = p.b * p.H * p.sq;
  for (int64_t i = threadIdx.x; i < pairs; i += kThreads) {  // i = (r H + h) sq + t
    const int64_t t = i % p.sq, r = i / (p.H * p.sq), h = (i / p.sq) % p.H;
    if (!(p.row_weight[r * p.sq + t] > 0.f)) continue;  // not a loss row (padding: lse = +inf)
    const double p_sink = exp(double(p.sink ? p.sink[h] : -INFINITY) - double(p.lse[i]));
    const double p_ws = exp(double(p.lse_ws[i]) - double(p.lse[i]));
    sum[0] += p_ws - p_sink, sum[1] += 1 - p_ws, sum[2] += p_sink, sum[3] += 1;
  }
  for (int k = 0; k < 4; ++k) part[k][threadIdx.x] = sum[k];
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (int(threadIdx.x) < half)
      for (int k = 0; k < 4; ++k) part[k][threadIdx.x] += part[k][threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0)
    for (int k = 0; k < 4; ++k) p.acc[k] += part[k][0];
}

cudaStream_t stream() { return current_stream().get(); }

}  // namespace

void attn_compressed_mass(const AttnMassParams& p) {
  HMLA_LAUNCH(mass_kernel, 1, kThreads, 0, stream(), p);
  check_launch("attention mass");
}

// The plan (cuda_kernels.h): every size.
Plan plan(Op, const AttnMassParams&) { return {Variant::simt, {}}; }

}  // namespace hmla::cuda
