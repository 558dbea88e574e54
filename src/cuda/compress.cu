// DeepSeek-V4's compressor pooling on the GPU (hmla/ops/compress.h), with the CPU's formulas and
// order (src/cpu/compress.cpp): one thread per (entry, channel) walks its slots in order (max,
// exponentials' sum, weighted sum); the backward's thread writes the dkv / dgate elements its
// slots read (each element belongs to one slot of one entry: no atomics), then one thread per
// (slot, channel) column sums dape over the entries in order. f32 throughout (DESIGN.md section
// 10 keeps V4's small mixers in f32); simple rather than fast, as the first CUDA form of V4's ops.
#include <cmath>
#include <cstdint>

#include "cuda_kernels.h"
#include "runtime.h"
#include "strided.cuh"  // grid_for

namespace hmla::cuda {

namespace {

constexpr int kThreads = 256;

cudaStream_t stream() { return current_stream().get(); }

#define HMLA_GRID_STRIDE(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

// Slot i (of `count`) of entry (r, first), channel c: its kv/gate offset and its ape offset.
__device__ bool has_previous(const CompressParams& p, int64_t r, int64_t first) {
  return p.overlap && first - p.m >= p.doc_start[r * p.s + first];
}
__device__ void slot(const CompressParams& p, int64_t r, int64_t first, int64_t c, bool prev, int64_t i, int64_t* off,
                     int64_t* ape_off) {
  const int64_t C = p.overlap ? 2 * p.W : p.W;
  int64_t token, ch, j;
  if (!p.overlap) {
    token = first + i, ch = c, j = i;
  } else if (prev && i < p.m) {
    token = first - p.m + i, ch = c, j = i;
  } else {
    j = prev ? i - p.m : i, token = first + j, ch = p.W + c;
  }
  *off = (r * p.s + token) * C + ch;
  *ape_off = j * C + ch;
}

// The pooled value of entry (r, first) in channel c, and the softmax's max and sum (recomputing
// alpha_i = exp(z_i - mx) / sum slot by slot, as the CPU divides).
__device__ float pool(const CompressParams& p, int64_t r, int64_t first, int64_t c, float* mx_out, float* sum_out) {
  const bool prev = has_previous(p, r, first);
  const int64_t count = p.overlap && prev ? 2 * p.m : p.m;
  float mx = -INFINITY;
  for (int64_t i = 0; i < count; ++i) {
    int64_t o, a;
    slot(p, r, first, c, prev, i, &o, &a);
    mx = fmaxf(mx, p.gate[o] + p.ape[a]);
  }
  float sum = 0.f;
  for (int64_t i = 0; i < count; ++i) {
    int64_t o, a;
    slot(p, r, first, c, prev, i, &o, &a);
    sum += expf(p.gate[o] + p.ape[a] - mx);
  }
  float out = 0.f;
  for (int64_t i = 0; i < count; ++i) {
    int64_t o, a;
    slot(p, r, first, c, prev, i, &o, &a);
    out += expf(p.gate[o] + p.ape[a] - mx) / sum * p.kv[o];
  }
  *mx_out = mx, *sum_out = sum;
  return out;
}

__global__ void compress_fwd_kernel(CompressParams p) {
  HMLA_GRID_STRIDE(i, p.b * p.n * p.W) {
    const int64_t re = i / p.W, c = i % p.W, first = p.first[re];
    float mx, sum;
    p.out[i] = first < 0 ? 0.f : pool(p, re / p.n, first, c, &mx, &sum);
  }
}

__global__ void compress_bwd_kernel(CompressParams p) {
  HMLA_GRID_STRIDE(i, p.b * p.n * p.W) {
    const int64_t re = i / p.W, c = i % p.W, r = re / p.n, first = p.first[re];
    if (first < 0) continue;
    float mx, sum;
    const float out = pool(p, r, first, c, &mx, &sum), d = p.dout[i];
    const bool prev = has_previous(p, r, first);
    const int64_t count = p.overlap && prev ? 2 * p.m : p.m;
    for (int64_t k = 0; k < count; ++k) {
      int64_t o, a;
      slot(p, r, first, c, prev, k, &o, &a);
      const float alpha = expf(p.gate[o] + p.ape[a] - mx) / sum;
      p.dkv[o] = alpha * d;
      p.dgate[o] = alpha * (p.kv[o] - out) * d;
    }
  }
}

__global__ void compress_dape_kernel(CompressParams p) {
  const int64_t C = p.overlap ? 2 * p.W : p.W;
  HMLA_GRID_STRIDE(col, p.m * C) {
    const int64_t j = col / C, ch = col % C;
    float acc = 0.f;
    for (int64_t re = 0; re < p.b * p.n; ++re) {
      const int64_t r = re / p.n, first = p.first[re];
      if (first < 0) continue;
      int64_t token = first + j;
      if (p.overlap && ch < p.W) {
        if (first - p.m < p.doc_start[r * p.s + first]) continue;
        token = first - p.m + j;
      }
      acc += p.dgate[(r * p.s + token) * C + ch];
    }
    p.dape[col] += acc;
  }
}

#undef HMLA_GRID_STRIDE

}  // namespace

void compress_fwd(const CompressParams& p) {
  if (p.b * p.n * p.W == 0) return;
  HMLA_LAUNCH(compress_fwd_kernel, grid_for(p.b * p.n * p.W), kThreads, 0, stream(), p);
  check_launch("compress");
}

void compress_bwd(const CompressParams& p) {
  const int64_t C = p.overlap ? 2 * p.W : p.W;
  check(cudaMemsetAsync(p.dkv, 0, size_t(p.b * p.s * C) * sizeof(float), stream()), "compress backward dkv");
  check(cudaMemsetAsync(p.dgate, 0, size_t(p.b * p.s * C) * sizeof(float), stream()), "compress backward dgate");
  if (p.b * p.n * p.W == 0) return;
  HMLA_LAUNCH(compress_bwd_kernel, grid_for(p.b * p.n * p.W), kThreads, 0, stream(), p);
  check_launch("compress backward");
  HMLA_LAUNCH(compress_dape_kernel, grid_for(p.m * C), kThreads, 0, stream(), p);
  check_launch("compress backward dape");
}

// The plan (cuda_kernels.h): f32, every size.
Plan plan(Op, const CompressParams&) { return {Variant::simt, {}}; }

}  // namespace hmla::cuda
