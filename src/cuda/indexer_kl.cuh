// What the indexer KL's files share: the per-row workspace of the SIMT and dense tensor-core
// paths (indexer_kl_simt.cu, indexer_kl_mma.cu), bf16 widened in line, and the launchers that
// indexer_kl.cu dispatches to by the plan. Each launcher runs its kernels, then the loss sum.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

#include "cuda_kernels.h"

namespace hmla::cuda::detail {

struct Work {
  float* lseI;       // [b * sq]
  float* lseC;       // [b * sq, H]
  float* kl;         // [b * sq]
  int32_t* sorted;   // sparse: [b * sq, K] each row's candidates ascending, INT_MAX after them
  float* dI;         // sparse: [b * sq, K] dI of those candidates
};

__device__ __forceinline__ float widen(float x) { return x; }
// bf16 widened in line (exact: its 16 bits above 16 zeros). Not through the emulator's out-of-line
// __bfloat162float: that changed gcc's inlining of logit(), hence which multiply-adds it fused, and
// the bf16 instantiation's bits with it (test_mixed_dtype_emu compares them with the f32 one's).
__device__ __forceinline__ float widen(__nv_bfloat16 x) {
  const uint32_t u = uint32_t(reinterpret_cast<const uint16_t&>(x)) << 16;
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}
// The bits of bf16(x), and the f32 of bf16 bits (the tensor-core path's dI tile holds bits).
__device__ __forceinline__ uint16_t bf16_bits(float x) {
  const __nv_bfloat16 v = __float2bfloat16(x);
  uint16_t u;
  memcpy(&u, &v, sizeof(u));
  return u;
}
__device__ __forceinline__ float bits_f32(uint16_t u) {
  const uint32_t w = uint32_t(u) << 16;
  float f;
  memcpy(&f, &w, sizeof(f));
  return f;
}

// The SIMT kernels for either KL (f32 or bf16 inputs, widened on load; indexer_kl_simt.cu).
template <bool kSparse>
void kl_simt(const IndexerKlParams& p);
// The dense KL on the tensor cores (bf16 inputs; indexer_kl_mma.cu).
void kl_dense_mma(const IndexerKlParams& p);
// *p.kl_acc += sum_r rw[r] kl[r] over the rows [0, rows) in order, on the current stream.
void kl_sum(const IndexerKlParams& p, const float* kl, int64_t rows);

}  // namespace hmla::cuda::detail
