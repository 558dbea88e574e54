// DeepSeek-V4's attention core forward on the tensor cores (bf16 in and out, f32 accumulation, f32
// lse; hmla/ops/compressed_attention.h, docs/v4_attention.md): the sparse forward's scheme
// (attn_sparse_fwd.cu) over a row's own key list. A block owns one query row, up to 64 of its heads
// (the mma rows: one shared K = V head, so every head meets every key) and all of d, one warp per
// (16 heads, 128 value columns). The row's keys are its window, then its visible entries (dense:
// one range; selected: its slots sorted in shared memory, repeats and invisible picks dropped):
// attn_compressed_mma.cuh. They are gathered kFwdBk at a time into one shared tile that is both K
// and V; S = Q K^T once per tile (its 8-key column tiles split between the warps of a head group
// into a shared f32 tile), then each warp's online softmax with the sink in the denominator and
// O += P V with P in registers. Column tiles past the row's last key issue nothing. No atomics.
// Also here: the selected mode's cleaned slot table for the backward (clean_table_kernel).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "attn_compressed_mma.cuh"
#include "attn_dense.cuh"  // bf, kLog2e, rows_aligned
#include "attn_tile.cuh"
#include "cuda_kernels.h"
#include "runtime.h"
#include "traits.h"

namespace hmla::cuda {

namespace {

using T = CompressedMmaTraits;
constexpr int kPad = T::kPad, kFwdBk = T::kFwdBk, kFwdChunk = T::kFwdChunk;

// A block: local query row blockIdx.x, heads [16 head_warps blockIdx.y, +16 head_warps), d padded to
// dp in `chunks` value chunks of kFwdChunk; warp = (head subgroup hw, chunk vc), hw fastest.
__global__ void __launch_bounds__(32 * T::kFwdHeadWarps * T::kFwdChunks)
    compressed_fwd_kernel(const AttnCompressedParams p, int head_warps, int chunks, int dp, bool vec_q, bool vec_k) {
  constexpr int kNt = kFwdBk / 8, kDt = kFwdChunk / 8;
  HMLA_DYNAMIC_SHARED(unsigned char, smem);
  const int heads = 16 * head_warps, ld = dp + kPad, lds = kFwdBk + kPad;
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem);  // [heads, dp]
  __nv_bfloat16* Ks = Qs + heads * ld;                           // [kFwdBk, dp] gathered keys = values
  float* Ss = reinterpret_cast<float*>(Ks + kFwdBk * ld);       // [heads, kFwdBk] the tile's raw scores
  int32_t* list = reinterpret_cast<int32_t*>(Ss + heads * lds);  // selected: [pow2(k)] twice

  const int64_t row = blockIdx.x;
  CompressedRow r(p, row);
  if (p.k > 0 && p.n_e > 0) r.n_ent = sort_entries(p, row, r, list, list + pow2_ceil(p.k));
  const int n = r.n_w + r.n_ent;
  const RowKeys keys(p, r, p.k > 0 ? list : nullptr);
  const int h0 = int(blockIdx.y) * heads, nh = int(p.H - h0 < heads ? p.H - h0 : heads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int hw = warp % head_warps, vc = warp / head_warps, r0 = hw * 16;
  const int dv0 = vc * kFwdChunk, dvn = dp - dv0 < kFwdChunk ? dp - dv0 : kFwdChunk;
  const int d = int(p.d);
  const __nv_bfloat16* q = bf(p.q) + r.bb * p.q_bstride + r.tl * p.q_rstride + h0 * p.q_hstride;
  load_rows(Qs, ld, heads, nh, d, dp, vec_q, [&](int i) { return q + i * p.q_hstride; });

  uint32_t mine = 0;  // the column tiles whose scores this warp computes
#pragma unroll
  for (int nt = 0; nt < kNt; ++nt)
    if (nt % chunks == vc) mine |= 1u << nt;
  const float c2 = p.scale * kLog2e;
  float mA = -INFINITY, mB = -INFINITY, lA = 0.f, lB = 0.f;
  float o[kDt][4];
  zero_acc(o);
  for (int j0 = 0; j0 < n; j0 += kFwdBk) {
    const int nk = n - j0 < kFwdBk ? n - j0 : kFwdBk;
    const uint32_t live = (1u << ((nk + 7) / 8)) - 1u;  // column tiles holding keys
    __syncthreads();
    load_rows(Ks, ld, kFwdBk, nk, d, dp, vec_k, [&](int i) { return keys.row(j0 + i); });
    __syncthreads();
    tile_scores_to_shared<kNt>(Ss, lds, Qs, ld, r0, Ks, ld, dp, live & mine, lane);
    __syncthreads();
    float s[kNt][4];
    read_scores(s, Ss, lds, r0, j0, n, c2, live, lane);
    online_softmax_step(s, mA, mB, lA, lB, o);
    mma_acc_pv(o, s, Ks + dv0, ld, dvn, lane, live);  // the chunk's values: the keys' columns [dv0, dv0 + dvn)
  }

  lA = quad_sum(lA), lB = quad_sum(lB);
  // out = O / (l + exp(sink - m)); lse = ln(that); a padding row (no key) 0 and +inf.
  const int hA = h0 + r0 + g, hB = hA + 8;
  float invA = 0.f, invB = 0.f, lseA = INFINITY, lseB = INFINITY;
  if (hA < p.H) softmax_finish(mA, lA, p.sink != nullptr, p.sink ? p.sink[hA] * kLog2e : 0.f, invA, lseA);
  if (hB < p.H) softmax_finish(mB, lB, p.sink != nullptr, p.sink ? p.sink[hB] * kLog2e : 0.f, invB, lseB);
  __nv_bfloat16* out = bf(p.out) + row * p.H * p.d;
#pragma unroll
  for (int dt = 0; dt < kDt; ++dt) {
    if (dt * 8 >= dvn) break;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = dv0 + dt * 8 + 2 * c + e;
      if (col >= d) continue;
      if (hA < p.H) out[hA * p.d + col] = __float2bfloat16(o[dt][e] * invA);
      if (hB < p.H) out[hB * p.d + col] = __float2bfloat16(o[dt][2 + e] * invB);
    }
  }
  if (vc == 0 && c == 0) {
    if (hA < p.H) p.lse[(r.bb * p.H + hA) * p.sq + r.tl] = lseA;
    if (hB < p.H) p.lse[(r.bb * p.H + hB) * p.sq + r.tl] = lseB;
  }
}

// The selected mode's table as the backward walks it: per local row its visible entries sorted,
// each once (sort_entries), then -1; count[row] their number.
__global__ void __launch_bounds__(256) clean_table_kernel(const AttnCompressedParams p, int32_t* clean, int32_t* count) {
  HMLA_DYNAMIC_SHARED(int32_t, buf);  // [pow2(k)] twice
  const int64_t row = blockIdx.x;
  const CompressedRow r(p, row);
  const int n = p.n_e > 0 ? sort_entries(p, row, r, buf, buf + pow2_ceil(p.k)) : 0;
  for (int i = threadIdx.x; i < p.k; i += blockDim.x) clean[row * p.k + i] = i < n ? buf[i] : -1;
  if (threadIdx.x == 0) count[row] = n;
}

}  // namespace

bool compressed_rows_aligned(const AttnCompressedParams& p, bool query_side) {
  if (p.d % 8 != 0) return false;
  if (query_side) return rows_aligned(p.q, p.q_rstride, p.q_bstride, p.q_hstride, p.d);
  return rows_aligned(p.kv, p.d, p.s * p.d, 0, p.d) && (p.n_e == 0 || rows_aligned(p.ent, p.d, p.n_e * p.d, 0, p.d));
}

void attn_compressed_clean_table(const AttnCompressedParams& p, int32_t* clean, int32_t* count) {
  const int64_t rows = p.b * p.sq;
  if (rows == 0 || p.k == 0) return;
  HMLA_LAUNCH(clean_table_kernel, unsigned(rows), 256, size_t(2 * T::pow2_at_least(p.k) * 4), current_stream().get(), p,
              clean, count);
  check_launch("attn_compressed_bwd: the selected entries");
}

void attn_compressed_fwd_mma(const AttnCompressedParams& p) {
  const int dp = int(T::pad16(p.d));
  const int chunks = std::max(1, (dp + kFwdChunk - 1) / kFwdChunk);
  const int head_warps = int(T::fwd_head_warps(p.H)), heads = 16 * head_warps;
  const int hgroups = int((p.H + heads - 1) / heads);
  const size_t smem = size_t(T::fwd_smem_bytes(p.H, p.d, p.n_e > 0 ? p.k : 0));
  check(cudaFuncSetAttribute(compressed_fwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
        "attn_compressed_fwd: shared memory");
  HMLA_LAUNCH(compressed_fwd_kernel, dim3(unsigned(p.b * p.sq), unsigned(hgroups)), 32 * head_warps * chunks, smem,
              current_stream().get(), p, head_warps, chunks, dp, compressed_rows_aligned(p, true),
              compressed_rows_aligned(p, false));
  check_launch("attn_compressed_fwd (mma)");
}

}  // namespace hmla::cuda
