// Shared by the CUDA dense attention kernels: tile traits, the per-document mask and the key range
// of a block of query rows. Letters as in hmla/ops/attention.h; t is a query's global position
// (q_row0 + local row), j a key's.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda_kernels.h"

namespace hmla::cuda {

// Tiles of the portable (mma.sync, sm_80+) kernels. A block is kWarps warps of 16 query (or key)
// rows each (the backward's kBwdSplit times as many warps); key (query) tiles of kBk; output
// columns in chunks of kDvChunk (forward) or groups of 16-column pairs (backward) so that
// accumulators stay in registers at any head width (576/512 included). The large head widths
// (Dqk > 256) take half the rows and keys so that the backward's tiles fit the 163 KB of shared
// memory of an A100 as well as Hopper's 227 KB.
template <bool kWide>
struct AttnCudaTraits {
  static constexpr int kWarps = kWide ? 2 : 4;
  static constexpr int kRows = 16 * kWarps;   // query rows (forward, dQ) or keys (dK/dV) per block
  static constexpr int kBk = kWide ? 32 : 64;  // keys (forward, dQ) or queries (dK/dV) per tile
  // Forward output columns per block: kDvChunk, or kDvChunkMax for value heads wider than it
  // (attn_fwd_dv_chunk): the widest chunk whose accumulators fit the registers without spilling
  // (215 / 205 at sm_90a); 512 would need 256 per thread, so values wider than 256 take two
  // chunks in one block, a warp each, sharing the scores (attn_fwd_chunks).
  static constexpr int kDvChunk = 128, kDvChunkMax = 256;
  // Backward: kBwdSplit warps per row tile (kBwdThreads threads). They split the S / dP tile's
  // n-tiles (computed once per tile over the whole Dqk / Dv) and then the gradient's 16-column
  // pairs, interleaved: kDqPairs (dq, Dqk up to 256 / 576) and kDkdvPairs (dk and dv, Dqk + Dv
  // up to 512 / 1088) pairs per warp, f32 accumulators of 64 / 72 and 128 / 136 registers. Wider
  // heads take more blocks (column groups), each recomputing its scores. 8 warps keep dkdv's
  // 576/512 accumulators at 136 registers a thread, under the 255 a block of 256 threads may use
  // (dkdv 239 / 211 registers at sm_90a, no spills); 4 would need 272.
  static constexpr int kBwdSplit = kWide ? 4 : 2;
  static constexpr int kBwdThreads = 32 * kWarps * kBwdSplit;
  static constexpr int kDqPairs = (kWide ? 576 : 256) / 16 / kBwdSplit;
  static constexpr int kDkdvPairs = (kWide ? 576 + 512 : 256 + 256) / 16 / kBwdSplit;
  static constexpr int kPad = 8;               // bf16 padding per shared row: 16 bytes, no bank conflicts
  static_assert(kBk % 16 == 0 && kDvChunk % 8 == 0, "mma tiles are 16 x 8 x 16");
  static_assert((kBk / 8) % kBwdSplit == 0 && kBwdThreads == 256, "the split warps share a tile's n-tiles evenly");
};

inline bool attn_is_wide(const AttnDenseParams& p) { return p.Dqk > 256 || p.Dv > 256; }

// Dynamic shared memory in bytes: the forward's Q tile and, per stage of its K/V pipeline, the K
// tile and the V tile of `chunks` value chunks of dv_chunk columns (none when the values are the
// keys' first columns, `v_in_k`: the latent form reads them from the K tile), both row major, and
// with two chunks the shared f32 score tile;
// the backward's Q, dO, K, V and the P / dS tiles [kRows, kBk] (bf16; dq uses one, the same
// bound for both kernels). The plan (attn_dense_fwd.cu) holds both under the smallest target's opt-in
// limit (an A100's 163 KB; Hopper has 227 KB) with one stage; the forward takes two where they fit.
template <bool kWide>
constexpr int64_t attn_fwd_smem(int64_t Dqk, int dv_chunk, int chunks = 1, int stages = 1, bool v_in_k = false) {
  using T = AttnCudaTraits<kWide>;
  return 2 * ((T::kRows + stages * T::kBk) * (Dqk + T::kPad) +
              (v_in_k ? 0 : stages * T::kBk * (chunks * dv_chunk + T::kPad))) +
         (chunks > 1 ? 4 * T::kRows * (T::kBk + T::kPad) : 0);  // the shared f32 score tile
}
// The backward's kernels: dq keeps Q and dO and takes K and V tiles (per stage; V from the K tile
// when v_in_k) and one [kRows, kBk] dS tile; dkdv keeps its K and V (V from K when v_in_k) and
// takes Q and dO tiles (per stage) and the P and dS tiles.
template <bool kWide>
constexpr int64_t attn_bwd_dq_smem(int64_t Dqk, int64_t Dv, int stages = 1, bool v_in_k = false) {
  using T = AttnCudaTraits<kWide>;
  return 2 * (T::kRows * (Dqk + Dv + 2 * T::kPad) + stages * T::kBk * (Dqk + T::kPad + (v_in_k ? 0 : Dv + T::kPad)) +
              T::kRows * (T::kBk + T::kPad));
}
template <bool kWide>
constexpr int64_t attn_bwd_dkdv_smem(int64_t Dqk, int64_t Dv, int stages = 1, bool v_in_k = false) {
  using T = AttnCudaTraits<kWide>;
  return 2 * (T::kRows * (Dqk + T::kPad + (v_in_k ? 0 : Dv + T::kPad)) + stages * T::kBk * (Dqk + Dv + 2 * T::kPad) +
              2 * T::kRows * (T::kBk + T::kPad));
}
// The bound both kernels fit with one stage (the plan holds it under kAttnMaxSmemBytes).
template <bool kWide>
constexpr int64_t attn_bwd_smem(int64_t Dqk, int64_t Dv) {
  const int64_t a = attn_bwd_dq_smem<kWide>(Dqk, Dv), b = attn_bwd_dkdv_smem<kWide>(Dqk, Dv);
  return a > b ? a : b;
}
// The forward's value chunk: heads up to 256 wide in one (one score pass), wider ones in 256s.
inline int attn_fwd_dv_chunk(const AttnDenseParams& p) {
  return p.Dv > AttnCudaTraits<false>::kDvChunk ? AttnCudaTraits<false>::kDvChunkMax : AttnCudaTraits<false>::kDvChunk;
}
// Value chunks per forward block: 2 for values wider than one chunk of 256 (one warp per chunk and
// row group, the scores shared through shared memory), else 1.
inline int attn_fwd_chunks(const AttnDenseParams& p) { return p.Dv > AttnCudaTraits<false>::kDvChunkMax ? 2 : 1; }
inline constexpr int64_t kAttnMaxSmemBytes = 163 * 1024;
// Whether the values are the keys' first Dv columns (the same tensor and strides: v a view of k),
// so the forward reads them from its K tile.
inline bool attn_v_in_k(const AttnDenseParams& p) {
  return p.v == p.k && p.v_rstride == p.k_rstride && p.v_bstride == p.k_bstride && p.v_hstride == p.k_hstride;
}
inline int64_t attn_dense_smem_bytes(const AttnDenseParams& p) {
  const int c = attn_fwd_dv_chunk(p), n = attn_fwd_chunks(p);
  const int64_t f = attn_is_wide(p) ? attn_fwd_smem<true>(p.Dqk, c, n) : attn_fwd_smem<false>(p.Dqk, c, n);
  const int64_t b = attn_is_wide(p) ? attn_bwd_smem<true>(p.Dqk, p.Dv) : attn_bwd_smem<false>(p.Dqk, p.Dv);
  return f > b ? f : b;
}
static_assert(attn_bwd_smem<true>(576, 512) <= kAttnMaxSmemBytes && attn_fwd_smem<true>(576, 256, 2) <= kAttnMaxSmemBytes &&
                  attn_bwd_smem<false>(256, 256) <= kAttnMaxSmemBytes,
              "the latent 576/512 form and heads of 256 fit an A100");
static_assert(attn_fwd_smem<true>(576, 256, 2, 2, true) <= kAttnMaxSmemBytes &&
                  attn_fwd_smem<false>(192, 128, 1, 2) <= kAttnMaxSmemBytes,
              "the latent form's and DeepSeek's 192/128 forward double-buffer their K/V tiles on an A100");

// Allowed: doc_start[t] <= j <= t (padding rows have doc_start = t + 1, so nothing).
__device__ __forceinline__ bool allowed(int ds_t, int64_t t, int64_t j) { return ds_t <= j && j <= t; }

// The mask as a policy. Each row x of a block (a query row, or in dK/dV a key) sees the columns
// [lo(x), hi(x)] (keys [doc_start[t], t]; queries [j, doc_end[j] - 1]), or none. Per block the
// union of the rows' ranges bounds the tiles it walks; per 16-row group the union says which 8-wide
// column tiles are live at all, and the intersection [max lo, min hi] (empty when a row of the
// group sees nothing) which column tiles every row of the group sees whole: those need no
// per-element test. Filled by the block's first kGroups * 16 threads (thread x: row x, `sees`
// whether it has a range); all threads must call; ends with a barrier.
template <int kGroups>
struct MaskRanges {
  int lo, hi;                      // the block's union (lo = INT32_MAX when empty)
  int ulo[kGroups], uhi[kGroups];  // each group's union
  int ilo[kGroups], ihi[kGroups];  // each group's intersection (ilo = INT32_MAX: none)
  __device__ void fill(bool sees, int xlo, int xhi) {
    if (threadIdx.x < kGroups) {
      ulo[threadIdx.x] = INT32_MAX, uhi[threadIdx.x] = -1;
      ilo[threadIdx.x] = INT32_MIN, ihi[threadIdx.x] = INT32_MAX;
    }
    if (threadIdx.x == kGroups) lo = INT32_MAX, hi = -1;
    __syncthreads();
    if (threadIdx.x < 16 * kGroups) {
      const int gr = threadIdx.x / 16;
      if (sees) {
        atomicMin(&lo, xlo), atomicMax(&hi, xhi);
        atomicMin(&ulo[gr], xlo), atomicMax(&uhi[gr], xhi);
        atomicMax(&ilo[gr], xlo), atomicMin(&ihi[gr], xhi);
      } else {
        atomicMax(&ilo[gr], INT32_MAX);
      }
    }
    __syncthreads();
  }
  // Whether every row of group gr sees all of the columns [c0, c0 + n).
  __device__ bool whole(int gr, int64_t c0, int n) const { return ilo[gr] <= c0 && c0 + n - 1 <= ihi[gr]; }
};

constexpr float kLog2e = 1.4426950408889634f;

__host__ __device__ inline const __nv_bfloat16* bf(const void* p) { return static_cast<const __nv_bfloat16*>(p); }
__host__ __device__ inline __nv_bfloat16* bf(void* p) { return static_cast<__nv_bfloat16*>(p); }

// Which row sets allow 16-byte loads (every row start 8-element aligned); decided on the host.
struct VecFlags {
  bool q, k, v, o;  // q, k, v, and the contiguous out/dout
};

inline bool rows_aligned(const void* base, int64_t rstride, int64_t bstride, int64_t hstride, int64_t width) {
  return reinterpret_cast<uintptr_t>(base) % 16 == 0 && rstride % 8 == 0 && bstride % 8 == 0 && hstride % 8 == 0 &&
         width % 8 == 0;
}

inline VecFlags vec_flags(const AttnDenseParams& p) {
  return {rows_aligned(p.q, p.q_rstride, p.q_bstride, p.q_hstride, p.Dqk),
          rows_aligned(p.k, p.k_rstride, p.k_bstride, p.k_hstride, p.Dqk),
          rows_aligned(p.v, p.v_rstride, p.v_bstride, p.v_hstride, p.Dv),
          rows_aligned(p.out ? p.out : p.dout, p.H * p.Dv, 0, p.Dv, p.Dv) &&
              (!p.dout || reinterpret_cast<uintptr_t>(p.dout) % 16 == 0)};
}

// Backward helpers shared with the sparse attention (attn_dense_bwd.cu):
// D[b, h, t] = rowsum(dO * O) over Dv of bf16 [b, sq, H, Dv] tensors, into f32 [b, H, sq];
void launch_rowdot(const __nv_bfloat16* out, const __nv_bfloat16* dout, int64_t b, int64_t sq, int64_t H, int64_t Dv,
                   float* D);
// dsink[h] = -sum over (b, t) with finite lse of exp(sink_h - lse) D (fixed-order block reduction).
void launch_dsink(const float* lse, const float* D, const float* sink, int64_t b, int64_t sq, int64_t H, float* dsink);

}  // namespace hmla::cuda
