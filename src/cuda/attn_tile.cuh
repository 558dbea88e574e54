// The tile steps that the sparse scheme's tensor-core kernels share: the sparse attention
// (attn_sparse_fwd.cu, attn_sparse_bwd.cu) and DeepSeek-V4's attention core (attn_compressed_mma.cu,
// attn_compressed_mma_bwd.cu), which walk a row's gathered keys the same way and differ only in
// how a key list is made. Forward: a warp's share of a tile's raw scores into shared memory.
// Backward: steps 1-3 of a key tile (partial S and dP, P and dS, dq += dS K) and step 4's product
// (a key's gradient, dS^T Q + P^T dO). Each is inlined into
// its kernel, so the registers are the kernels' own.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "mma.cuh"

namespace hmla::cuda {

// Forward: S = Q K^T of the head tile at row r0 of Qs over the 8-key column tiles `cols` of the
// gathered keys Ks (k-steps over `width` columns, rolled), into the shared f32 tile Ss (row
// stride lds) at the same rows and columns. Nothing when cols is empty (warp-uniform).
template <int kNt>
__device__ __forceinline__ void tile_scores_to_shared(float* Ss, int lds, const __nv_bfloat16* Qs, int ldq, int r0,
                                                      const __nv_bfloat16* Ks, int ldk, int width, uint32_t cols,
                                                      int lane) {
  if (!cols) return;
  const int g = lane / 4, c = lane % 4;
  float s[kNt][4];
  zero_acc(s);
  mma_abt_live<kNt, true>(s, Qs, ldq, r0, Ks, ldk, width, lane, cols);
#pragma unroll
  for (int nt = 0; nt < kNt; ++nt) {
    if (!((cols >> nt) & 1u)) continue;
    float* top = Ss + (r0 + g) * lds + nt * 8 + 2 * c;
    top[0] = s[nt][0], top[1] = s[nt][1], top[8 * lds] = s[nt][2], top[8 * lds + 1] = s[nt][3];
  }
}

// Backward, one tile of kKeys gathered keys Ks (row stride ldk; keys j0 + k of the row's n) for a
// block of kHeads heads (nh of them live), warps (head tile ht, part qq of kSplit = 4):
//   1. the warp's partial S (qq 0, 1: A = Q) or dP (qq 2, 3: A = dO) over the k-steps [klo, khi),
//      into part [kSplit, kHeads, kPartLd];
//   2. the block sums the halves: P = exp(S scale - lse), dS = P (dP - D) scale, 0 past the list
//      and past nh; bf16 dS [head][key] (dSs), dS^T and P^T [key][head] (dSt, Pt), row stride ldt;
//   3. dq (the warp's column pairs pair0 .. pair0 + mine of 16 columns, from column col0 of Ks)
//      += dS K over the tile's live 16-key k-steps.
// s_lse holds lse * log2(e) per head, s_D the rows' D. Starts after the tile's load barrier; ends
// with dSs, dSt, Pt visible to the block (step 4 reads them) and no barrier after step 3.
template <int kHeads, int kKeys, int kSplit, int kPartLd, int kPairs>
__device__ __forceinline__ void bwd_tile_dq(float (&dq)[2 * kPairs][4], float* part, __nv_bfloat16* dSs,
                                            __nv_bfloat16* dSt, __nv_bfloat16* Pt, int ldt, const __nv_bfloat16* A,
                                            int lda, const __nv_bfloat16* Ks, int ldk, int klo, int khi,
                                            const float* s_lse, const float* s_D, float c2, float scale, int nh,
                                            int j0, int n, int ht, int qq, bool heads_live, int col0, int pair0,
                                            int mine, int lane) {
  constexpr int kNt = kKeys / 8;
  const int g = lane / 4, c = lane % 4;
  // 1. The warp's part of S = Q K^T or dP = dO V^T, over the live 8-key n-tiles.
  if (heads_live) {
    const uint32_t live = live_columns<kNt>(j0, 0, n - 1);
    float s[kNt][4];
    zero_acc(s);
    mma_abt_live(s, A + klo, lda, ht * 16, Ks + klo, ldk, khi - klo, lane, live);
    float* out = part + (qq * kHeads + ht * 16) * kPartLd;
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt) {
      out[g * kPartLd + nt * 8 + 2 * c] = s[nt][0], out[g * kPartLd + nt * 8 + 2 * c + 1] = s[nt][1];
      out[(g + 8) * kPartLd + nt * 8 + 2 * c] = s[nt][2], out[(g + 8) * kPartLd + nt * 8 + 2 * c + 1] = s[nt][3];
    }
  }
  __syncthreads();
  // 2. P and dS, once per (head, key); 0 past the list and past H.
  for (int i = threadIdx.x; i < kHeads * kKeys; i += blockDim.x) {
    const int h = i / kKeys, k = i % kKeys;
    float pr = 0.f, ds = 0.f;
    if (h < nh && j0 + k < n) {
      const float sv = part[h * kPartLd + k] + part[(kHeads + h) * kPartLd + k];
      const float dpv = part[(2 * kHeads + h) * kPartLd + k] + part[(3 * kHeads + h) * kPartLd + k];
      pr = exp2f(sv * c2 - s_lse[h]);
      ds = pr * (dpv - s_D[h]) * scale;
    }
    const __nv_bfloat16 dsb = __float2bfloat16(ds);
    dSs[h * ldt + k] = dsb, dSt[k * ldt + h] = dsb, Pt[k * ldt + h] = __float2bfloat16(pr);
  }
  __syncthreads();
  // 3. dq += dS K over the tile's live 16-key k-steps.
  if (heads_live) {
#pragma unroll
    for (int kt = 0; kt < kKeys / 16; ++kt) {
      if (j0 + kt * 16 >= n) break;
      uint32_t a[4];
      load_a(a, dSs, ldt, ht * 16, kt * 16, lane);
#pragma unroll
      for (int i = 0; i < kPairs; ++i) {
        if (i >= mine) break;
        uint32_t b0[2], b1[2];
        load_b_kn_x2(b0, b1, Ks, ldk, kt * 16, col0 + (pair0 + i) * 16, lane);
        mma_bf16_16816(dq[2 * i], a, b0);
        mma_bf16_16816(dq[2 * i + 1], a, b1);
      }
    }
  }
}

// Backward step 4, the A fragments of the warp's key m-tile mt: dS^T and P^T (dSt, Pt [key][head],
// row stride ldt) per live 16-head step hs < nht.
template <int kHeads>
__device__ __forceinline__ void bwd_key_grad_frags(uint32_t (&as)[kHeads / 16][4], uint32_t (&ap)[kHeads / 16][4],
                                                   const __nv_bfloat16* dSt, const __nv_bfloat16* Pt, int ldt, int mt,
                                                   int nht, int lane) {
#pragma unroll
  for (int hs = 0; hs < kHeads / 16; ++hs)
    if (hs < nht) load_a(as[hs], dSt, ldt, mt * 16, hs * 16, lane), load_a(ap[hs], Pt, ldt, mt * 16, hs * 16, lane);
}

// Backward step 4's product for one 16-column pair of the warp's key m-tile: acc (two 8-column C
// tiles) = dS^T Q + P^T dO (the second term only when with_dO: a column past dO's width) over the
// block's nht live 16-head steps, from bwd_key_grad_frags' as, ap, Q and dO in shared memory from
// column col.
template <int kHeads>
__device__ __forceinline__ void bwd_key_grad_pair(float (&acc)[2][4], const uint32_t (&as)[kHeads / 16][4],
                                                  const uint32_t (&ap)[kHeads / 16][4], const __nv_bfloat16* Qs,
                                                  int ldq, const __nv_bfloat16* dOs, int ldo, int col, int nht,
                                                  bool with_dO, int lane) {
  zero_acc(acc);
#pragma unroll
  for (int hs = 0; hs < kHeads / 16; ++hs) {
    if (hs >= nht) break;
    uint32_t b0[2], b1[2];
    load_b_kn_x2(b0, b1, Qs, ldq, hs * 16, col, lane);
    mma_bf16_16816(acc[0], as[hs], b0);
    mma_bf16_16816(acc[1], as[hs], b1);
    if (with_dO) {
      load_b_kn_x2(b0, b1, dOs, ldo, hs * 16, col, lane);
      mma_bf16_16816(acc[0], ap[hs], b0);
      mma_bf16_16816(acc[1], ap[hs], b1);
    }
  }
}

}  // namespace hmla::cuda
