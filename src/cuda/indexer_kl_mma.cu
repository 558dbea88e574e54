// The dense indexer KL on the tensor cores (bf16 qI, kI, q, k: the training step's inputs;
// kl_mma_*; docs/indexer.md derives the passes): tiles of 16 query rows x 64 keys, scores q . k per
// head and qI . kI per index head on mma.sync with f32 accumulators (widths zero-padded to 16), P
// and I summed over heads in the accumulator layout.
//   rows  (a block per 16 rows): [pass 0, only with a sink: lseC per head], pass 1: lseI, pass 2:
//         P, I, dI, kl and G_h = sum_j bf16(dI) [s_h > 0] kI into the dqI buffer; then
//         dw_h = qI_h . G_h, dqI_h = w_h G_h.
//   keys  (a block per 64 keys): the rows that see them in tiles of 16: P, I, dI again from the
//         saved lseI / lseC, dkI += sum_h dS_h^T qI_h (dS = bf16(bf16(dI) w_h) [s_h > 0]) in registers.
//   4 H Dqk + 10 HI DI tensor-core FLOPs per valid pair, < 2 x the minimum 2 H Dqk + 6 HI DI; a
//   warp issues nothing for an 8-key column tile its 16 rows cannot see (warp_live).
// Tiles: kR query rows by kN keys, warp w owning keys [16 w, 16 w + 16) of each (two 16 x 8
// accumulators: one mma row block by 16 keys, K the zero-padded width). Workspace: lseI, lseC, kl
// per row, O(b s (H + 1)). Limits: IndexerKlTraits::mma_dense.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "cuda_kernels.h"
#include "indexer_kl.cuh"
#include "mma.cuh"
#include "runtime.h"
#include "traits.h"

namespace hmla::cuda {

namespace {

using detail::Work;
using detail::bf16_bits;
using detail::bits_f32;
using detail::widen;

constexpr int kR = IndexerKlTraits::kMmaRows, kN = IndexerKlTraits::kMmaKeys;
constexpr int kWarps = IndexerKlTraits::kMmaWarps, kThreads = IndexerKlTraits::kMmaThreads;
constexpr int kMaxCt = int(IndexerKlTraits::kMmaMaxDI / 8);  // n-tiles of dkI's accumulator
static_assert(kR == 16 && kN == 16 * kWarps, "a warp's score tile is one mma row block by 16 keys");
using bf16 = __nv_bfloat16;

// The block's shared memory, carved in the order of IndexerKlTraits::mma_smem_bytes.
struct Sm {
  bf16 *Qs, *Ks;     // attention q rows of one head [kR, ldq], keys of one kv head [kN, ldq]
  bf16 *QIs, *KIs;   // qI rows of one index head [kR, ldi], the tile's kI [kN, ldi]
  bf16* dIb;         // dI of the tile [kR, kN], rounded to bf16 (the products' A operand)
  float* lseC;       // [H, kR]
  float* wts;        // [kR, HI] the rows' head weights (0 past the rows)
  float* red;        // [kR, 4 kWarps, 2] per-lane partials (m, l) or sums, combined in a fixed order
  float *lseI, *g;   // [kR] each: the rows' lseI and coeff * rw
  int *lo, *t;       // [kR] each: A(t) = [lo, t]; lo = INT_MAX for a row past sq or without keys
  uint32_t* mask;    // [HI, kWarps, 2, 4] relu'(s) ballots: bit `lane` of word (h, warp, nt, e)
  int ldq, ldi, Dqkp, DIp;
};

// traits.h's pad16 and align16 (host constexpr there: traits.h has no device code).
__device__ __forceinline__ int64_t pad16(int64_t n) { return (n + 15) / 16 * 16; }

__device__ __forceinline__ Sm carve(const IndexerKlParams& p, unsigned char* base) {
  Sm m;
  m.Dqkp = int(pad16(p.Dqk)), m.DIp = int(pad16(p.DI));
  m.ldq = m.Dqkp + int(IndexerKlTraits::kMmaPad), m.ldi = m.DIp + int(IndexerKlTraits::kMmaPad);
  unsigned char* x = base;
  auto take = [&](int64_t bytes) {
    unsigned char* r = x;
    x += pad16(bytes);
    return r;
  };
  m.Qs = reinterpret_cast<bf16*>(take((kR + kN) * m.ldq * 2));
  m.Ks = m.Qs + kR * m.ldq;
  m.QIs = reinterpret_cast<bf16*>(take((kR + kN) * m.ldi * 2));
  m.KIs = m.QIs + kR * m.ldi;
  m.dIb = reinterpret_cast<bf16*>(take(kR * kN * 2));
  m.lseC = reinterpret_cast<float*>(take(p.H * kR * 4));
  m.wts = reinterpret_cast<float*>(take(kR * p.HI * 4));
  m.red = reinterpret_cast<float*>(take(kR * 4 * kWarps * 2 * 4));
  float* rowv = reinterpret_cast<float*>(take(kR * 4 * 4));
  m.lseI = rowv, m.g = rowv + kR;
  m.lo = reinterpret_cast<int*>(rowv + 2 * kR), m.t = m.lo + kR;
  m.mask = reinterpret_cast<uint32_t*>(take(p.HI * kWarps * 8 * 4));
  return m;
}

// Accumulator element (nt, e) of lane `lane` in warp `warp`: its row in the tile and its key.
__device__ __forceinline__ int acc_row(int lane, int e) { return (lane >> 2) + 8 * (e >> 1); }
__device__ __forceinline__ int acc_key(int warp, int lane, int nt, int e) { return 16 * warp + 8 * nt + 2 * (lane & 3) + (e & 1); }

__device__ __forceinline__ bool allowed(const Sm& m, int r, int64_t j) { return m.lo[r] <= j && j <= m.t[r]; }

__device__ __forceinline__ uint16_t dIb_bits(const Sm& m, int r, int k) {
  return reinterpret_cast<const uint16_t*>(m.dIb)[r * kN + k];
}
// relu'(s_h) of tile element (row r, key k) from the ballots.
__device__ __forceinline__ bool mask_bit(const Sm& m, int h, int r, int k) {
  const int warp = k >> 4, nt = (k >> 3) & 1, c = (k & 7) >> 1, e = 2 * (r >> 3) + (k & 1);
  return (m.mask[((h * kWarps + warp) * 2 + nt) * 4 + e] >> (4 * (r & 7) + c)) & 1u;
}

// The block's rows [r0, r0 + nr) (local, of batch row bb): positions, key ranges, g, the head weights
// and lseC (given, or `lseC_ws` computed by the rows kernel; null: left for the rows kernel).
__device__ __forceinline__ void load_rows(const IndexerKlParams& p, const Sm& m, int64_t bb, int64_t r0, int nr,
                          const float* lseC_ws, const float* lseI_ws) {
  for (int r = threadIdx.x; r < kR; r += blockDim.x) {
    const int64_t tl = r0 + r, t = p.q_row0 + tl, row = bb * p.sq + tl;
    const int lo = r < nr ? p.doc_start[bb * p.s + t] : INT_MAX;
    m.lo[r] = r < nr && lo <= t ? lo : INT_MAX;
    m.t[r] = int(t);
    m.g[r] = r < nr ? p.coeff * p.row_weight[row] : 0.f;
    if (lseI_ws) m.lseI[r] = r < nr ? lseI_ws[row] : INFINITY;
  }
  for (int i = threadIdx.x; i < kR * p.HI; i += blockDim.x) {
    const int r = i / int(p.HI);
    m.wts[i] = r < nr ? p.w[(bb * p.sq + r0) * p.HI + i] : 0.f;
  }
  if (p.lse_c || lseC_ws)
    for (int i = threadIdx.x; i < p.H * kR; i += blockDim.x) {
      const int64_t h = i / kR, r = i % kR, tl = r0 + r;
      m.lseC[i] = r >= nr ? INFINITY : p.lse_c ? p.lse_c[(bb * p.H + h) * p.sq + tl] : lseC_ws[(bb * p.sq + tl) * p.H + h];
    }
}

__device__ __forceinline__ void load_q_head(const IndexerKlParams& p, const Sm& m, int64_t bb, int64_t r0, int nr, int64_t h) {
  load_tile_padded(m.Qs, m.ldq, static_cast<const bf16*>(p.q) + bb * p.q_bstride + r0 * p.q_rstride + h * p.q_hstride,
                   p.q_rstride, kR, nr, int(p.Dqk), m.Dqkp);
}
__device__ __forceinline__ void load_k_head(const IndexerKlParams& p, const Sm& m, int64_t bb, int64_t j0, int nk, int64_t kvh) {
  load_tile_padded(m.Ks, m.ldq, static_cast<const bf16*>(p.k) + bb * p.k_bstride + j0 * p.k_rstride + kvh * p.k_hstride,
                   p.k_rstride, kN, nk, int(p.Dqk), m.Dqkp);
}
__device__ __forceinline__ void load_qI_head(const IndexerKlParams& p, const Sm& m, int64_t bb, int64_t r0, int nr, int64_t h) {
  load_tile_padded(m.QIs, m.ldi, static_cast<const bf16*>(p.qI) + ((bb * p.sq + r0) * p.HI + h) * p.DI, p.HI * p.DI,
                   kR, nr, int(p.DI), m.DIp);
}
__device__ __forceinline__ void load_kI(const IndexerKlParams& p, const Sm& m, int64_t bb, int64_t j0, int nk) {
  load_tile_padded(m.KIs, m.ldi, static_cast<const bf16*>(p.kI) + (bb * p.s + j0) * p.DI, p.DI, kN, nk, int(p.DI), m.DIp);
}

// The mask as a policy (as in the dense attention): an 8-key column tile of a warp's scores outside
// the hull [lo, hi] of its rows' key ranges is masked for all 16 rows, so every value it yields
// (P, dI, the ballots' operands) is an exact 0 and the warp issues no product for it. Bit nt of
// the result: the warp's n-tile nt of the tile at key j0 (its keys j0 + 16 warp + [8 nt, 8 nt + 8)).
__device__ __forceinline__ uint32_t warp_live(int64_t j0, int warp, int64_t lo, int64_t hi) {
  return live_columns<2>(j0 + 16 * warp, lo, hi);
}

// This warp's 16 rows x 16 keys of A B^T (A [kR, K] rows, Bt [kN, K] the tile's keys), K padded to
// 16, over its live n-tiles only (the others stay 0).
__device__ __forceinline__ void warp_scores(float (&acc)[2][4], const bf16* A, const bf16* Bt, int ld, int K, int warp,
                                            int lane, uint32_t live) {
  zero_acc(acc);
  mma_abt_live<2, true>(acc, A, ld, 0, Bt + 16 * warp * ld, ld, K, lane, live);
}

// sum_h exp(l_h - lseC_h) / H over the warp's tile elements (0 where not allowed): the target P.
// `live`: the warp's n-tiles that hold an allowed element (warp_live).
__device__ __forceinline__ void target_tile(const IndexerKlParams& p, const Sm& m, int64_t bb, int64_t r0, int nr, int64_t j0, int nk,
                            float (&P)[2][4], uint32_t live) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  zero_acc(P);
  const int64_t group = p.H / p.Hkv;
  for (int64_t h = 0; h < p.H; ++h) {
    __syncthreads();  // the previous head's tiles are read
    load_q_head(p, m, bb, r0, nr, h);
    if (h % group == 0) load_k_head(p, m, bb, j0, nk, h / group);
    __syncthreads();
    float acc[2][4];
    warp_scores(acc, m.Qs, m.Ks, m.ldq, m.Dqkp, warp, lane, live);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = acc_row(lane, e);
        if (allowed(m, r, j0 + acc_key(warp, lane, nt, e))) P[nt][e] += expf(p.scale * acc[nt][e] - m.lseC[h * kR + r]);
      }
  }
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) P[nt][e] /= float(p.H);
}

// I = sum_h w_h relu(qI_h . kI) over the warp's tile elements (KIs loaded by the caller); with
// `masks`, relu'(qI_h . kI) of every element into m.mask. Over the `live` n-tiles only: the dead
// ones' I is never read (no allowed element) and their ballots are 0.
__device__ __forceinline__ void index_tile(const IndexerKlParams& p, const Sm& m, int64_t bb, int64_t r0, int nr, float (&I)[2][4],
                           bool masks, uint32_t live) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  zero_acc(I);
  for (int64_t h = 0; h < p.HI; ++h) {
    __syncthreads();
    load_qI_head(p, m, bb, r0, nr, h);
    __syncthreads();
    float acc[2][4];
    warp_scores(acc, m.QIs, m.KIs, m.ldi, m.DIp, warp, lane, live);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        I[nt][e] += m.wts[acc_row(lane, e) * p.HI + h] * fmaxf(acc[nt][e], 0.f);
        if (masks) {
          const uint32_t word = __ballot_sync(0xffffffffu, acc[nt][e] > 0.f);
          if (lane == 0) m.mask[((h * kWarps + warp) * 2 + nt) * 4 + e] = word;
        }
      }
  }
}

// Online logsumexp of one tile's allowed values v into this lane's (mx, l) of rows g and g + 8.
__device__ __forceinline__ void online_lse(const Sm& m, const float (&v)[2][4], int64_t j0, int warp, int lane, float (&mx)[2],
                                           float (&l)[2]) {
  float a[2][4];
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) a[nt][e] = allowed(m, acc_row(lane, e), j0 + acc_key(warp, lane, nt, e)) ? v[nt][e] : -INFINITY;
  online_lse_tile(a, mx, l);
}

// The per-row combination of every lane's (mx, l) (16 per row: 4 lanes x kWarps warps), in lane
// order: lse per row into out[r * stride] (+inf for a row that saw nothing). Block-wide.
__device__ __forceinline__ void finish_lse(const Sm& m, const float (&mx)[2], const float (&l)[2], float* out, int stride) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    float* slot = m.red + ((acc_row(lane, 2 * hi) * 4 * kWarps) + warp * 4 + (lane & 3)) * 2;
    slot[0] = mx[hi], slot[1] = l[hi];
  }
  __syncthreads();
  if (threadIdx.x < kR) {
    const float* rv = m.red + threadIdx.x * 4 * kWarps * 2;
    float M = -INFINITY;
    for (int i = 0; i < 4 * kWarps; ++i) M = fmaxf(M, rv[2 * i]);
    float L = 0.f;
    if (M > -INFINITY)
      for (int i = 0; i < 4 * kWarps; ++i)
        if (rv[2 * i] > -INFINITY) L += rv[2 * i + 1] * expf(rv[2 * i] - M);
    out[threadIdx.x * stride] = L > 0.f ? M + logf(L) : INFINITY;
  }
  __syncthreads();
}

// dI = g (exp(I - lseI) - P) of the warp's tile elements into m.dIb (bf16; 0 where not allowed);
// kl[hi] += P (log P - (I - lseI)) over the allowed ones.
__device__ __forceinline__ void tile_dI(const Sm& m, const float (&I)[2][4], const float (&P)[2][4], int64_t j0, int warp,
                                        int lane, float (&kl)[2]) {
  uint16_t* dIb = reinterpret_cast<uint16_t*>(m.dIb);
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = acc_row(lane, e), k = acc_key(warp, lane, nt, e);
      float dI = 0.f;
      if (allowed(m, r, j0 + k)) {
        const float logq = I[nt][e] - m.lseI[r], Pv = P[nt][e];
        if (Pv > 0.f) kl[e >> 1] += Pv * (logf(Pv) - logq);
        dI = m.g[r] * (expf(logq) - Pv);
      }
      dIb[r * kN + k] = bf16_bits(dI);
    }
}

// One block per tile of kR query rows. Writes lseI (and lseC when computed), kl per row, dw, dqI.
// dqI's buffer first accumulates G_h(t) = sum_j dI [s_h > 0] kI(j) (each element owned by one
// thread of this block: no atomics), then dw_h = qI_h . G_h and dqI_h = w_h G_h.
__global__ void __launch_bounds__(kThreads, 1) kl_mma_rows_kernel(IndexerKlParams p, Work ws) {
  HMLA_DYNAMIC_SHARED(float, smem);  // the one dynamic buffer of the file's kernels, carved
  const Sm m = carve(p, reinterpret_cast<unsigned char*>(smem));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t tiles = (p.sq + kR - 1) / kR, bb = blockIdx.x / tiles, r0 = (blockIdx.x % tiles) * kR;
  const int nr = int(p.sq - r0 < kR ? p.sq - r0 : kR);
  const bool given = p.lse_c != nullptr;
  load_rows(p, m, bb, r0, nr, nullptr, nullptr);
  float* G = p.dqI + (bb * p.sq + r0) * p.HI * p.DI;
  for (int64_t i = threadIdx.x; i < nr * p.HI * p.DI; i += blockDim.x) G[i] = 0.f;
  __syncthreads();
  int jlo = INT_MAX, jhi = -1;  // the union of the rows' key ranges
  for (int r = 0; r < kR; ++r)
    if (m.lo[r] != INT_MAX) jlo = min(jlo, m.lo[r]), jhi = max(jhi, m.t[r]);

  // Pass 0 (no given lse): lseC per head, an online logsumexp over the attention score tiles.
  if (!given) {
    const int64_t group = p.H / p.Hkv;
    for (int64_t h = 0; h < p.H; ++h) {
      float mx[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
      for (int64_t j0 = jlo; j0 <= jhi; j0 += kN) {
        const int nk = int(jhi + 1 - j0 < kN ? jhi + 1 - j0 : kN);
        __syncthreads();
        if (j0 == jlo) load_q_head(p, m, bb, r0, nr, h);
        load_k_head(p, m, bb, j0, nk, h / group);
        __syncthreads();
        float acc[2][4];
        warp_scores(acc, m.Qs, m.Ks, m.ldq, m.Dqkp, warp, lane, warp_live(j0, warp, jlo, jhi));
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[nt][e] *= p.scale;
        online_lse(m, acc, j0, warp, lane, mx, l);
      }
      finish_lse(m, mx, l, m.lseC + h * kR, 1);
    }
  }

  // Pass 1: lseI, an online logsumexp over the index score tiles.
  {
    float mx[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    for (int64_t j0 = jlo; j0 <= jhi; j0 += kN) {
      const int nk = int(jhi + 1 - j0 < kN ? jhi + 1 - j0 : kN);
      __syncthreads();
      load_kI(p, m, bb, j0, nk);
      float I[2][4];
      index_tile(p, m, bb, r0, nr, I, false, warp_live(j0, warp, jlo, jhi));
      online_lse(m, I, j0, warp, lane, mx, l);
    }
    finish_lse(m, mx, l, m.lseI, 1);
  }

  // Pass 2: P and I again, dI, kl, and G += dS kI per index head.
  float kl[2] = {0.f, 0.f};
  const int cts = m.DIp / 8;
  for (int64_t j0 = jlo; j0 <= jhi; j0 += kN) {
    const int nk = int(jhi + 1 - j0 < kN ? jhi + 1 - j0 : kN);
    float P[2][4], I[2][4];
    target_tile(p, m, bb, r0, nr, j0, nk, P, warp_live(j0, warp, jlo, jhi));
    __syncthreads();
    load_kI(p, m, bb, j0, nk);
    index_tile(p, m, bb, r0, nr, I, true, warp_live(j0, warp, jlo, jhi));
    tile_dI(m, I, P, j0, warp, lane, kl);
    __syncthreads();  // dIb and the masks
    const int g = lane >> 2, c = lane & 3;
    for (int64_t h = 0; h < p.HI; ++h)
      for (int ct = warp; ct < cts; ct += kWarps) {
        const int col = ct * 8 + 2 * c;
        float acc[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = g + 8 * (e >> 1), cc = col + (e & 1);
          acc[e] = r < nr && cc < p.DI ? G[(r * p.HI + h) * p.DI + cc] : 0.f;
        }
        for (int kb = 0; kb * 16 < nk; ++kb) {
          // Key block kb (warp kb's keys) with both n-tiles dead: dS is exactly 0 there.
          if (!warp_live(j0, kb, jlo, jhi)) continue;
          uint32_t a[4];
#pragma unroll
          for (int x = 0; x < 4; ++x) {  // a0..a3: (rows g | g + 8) x (keys 2c.. | 2c + 8..) of k-block kb
            const int nt = x >> 1, hi = x & 1, r = g + 8 * hi, k = 16 * kb + 8 * nt + 2 * c;
            const uint32_t w0 = m.mask[((h * kWarps + kb) * 2 + nt) * 4 + 2 * hi];
            const uint32_t w1 = m.mask[((h * kWarps + kb) * 2 + nt) * 4 + 2 * hi + 1];
            const uint32_t lo = (w0 >> lane) & 1u ? dIb_bits(m, r, k) : 0u;
            const uint32_t up = (w1 >> lane) & 1u ? dIb_bits(m, r, k + 1) : 0u;
            a[x] = lo | (up << 16);
          }
          uint32_t b[2];
          load_b_kn(b, m.KIs, m.ldi, 16 * kb, ct * 8, lane);
          mma_bf16_16816(acc, a, b);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = g + 8 * (e >> 1), cc = col + (e & 1);
          if (r < nr && cc < p.DI) G[(r * p.HI + h) * p.DI + cc] = acc[e];
        }
      }
  }

  // kl per row: every lane's partial, in lane order.
  __syncthreads();
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) m.red[(acc_row(lane, 2 * hi) * 4 * kWarps + warp * 4 + (lane & 3)) * 2] = kl[hi];
  __syncthreads();
  if (threadIdx.x < nr) {
    const int r = threadIdx.x;
    const int64_t row = bb * p.sq + r0 + r;
    float s = 0.f;
    for (int i = 0; i < 4 * kWarps; ++i) s += m.red[(r * 4 * kWarps + i) * 2];
    ws.kl[row] = m.lo[r] == INT_MAX ? 0.f : s;
    ws.lseI[row] = m.lo[r] == INT_MAX ? INFINITY : m.lseI[r];
    if (!given)
      for (int64_t h = 0; h < p.H; ++h) ws.lseC[row * p.H + h] = m.lo[r] == INT_MAX ? INFINITY : m.lseC[h * kR + r];
  }
  // dw_h = qI_h . G_h, dqI_h = w_h G_h: one thread per (row, head), channels in order.
  for (int64_t i = threadIdx.x; i < nr * p.HI; i += blockDim.x) {
    const int64_t row = bb * p.sq + r0 + i / p.HI, h = i % p.HI;
    float* Gh = G + i * p.DI;
    const bf16* q = static_cast<const bf16*>(p.qI) + (row * p.HI + h) * p.DI;
    const float wh = p.w[row * p.HI + h];
    float dw = 0.f;
    for (int64_t c = 0; c < p.DI; ++c) dw += widen(q[c]) * Gh[c];
    for (int64_t c = 0; c < p.DI; ++c) Gh[c] *= wh;
    p.dw[row * p.HI + h] = dw;
  }
}

// One block per tile of kN keys: dkI[j] = sum over the rows t that see j, in tiles of kR rows in
// order, of sum_h dS_h(t, j) qI_h(t), dS = bf16(bf16(dI) w_h) [s_h > 0], accumulated in registers
// (warp w: keys [16 w, 16 w + 16) x DI). A warp whose keys no row of a row tile sees (the
// diagonal's first row tiles, another document's rows) issues nothing for that tile: its dS is 0.
__global__ void __launch_bounds__(kThreads) kl_mma_keys_kernel(IndexerKlParams p, Work ws) {
  HMLA_DYNAMIC_SHARED(float, smem);  // the one dynamic buffer of the file's kernels, carved
  const Sm m = carve(p, reinterpret_cast<unsigned char*>(smem));
  __shared__ int hull[2];  // the row tile's key hull: [min lo, max t] over its rows with keys
  __shared__ int last;     // the block's last key that is no padding row (-1: none)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, c = lane & 3;
  const int64_t tiles = (p.s + kN - 1) / kN, bb = blockIdx.x / tiles, j0 = (blockIdx.x % tiles) * kN;
  const int nk = int(p.s - j0 < kN ? p.s - j0 : kN);
  const int64_t jmax = j0 + nk - 1;
  const int cts = m.DIp / 8;
  float acc[kMaxCt][4];
  zero_acc(acc);
  load_kI(p, m, bb, j0, nk);
  if (threadIdx.x == 0) {
    int l = -1;
    for (int64_t j = j0; j <= jmax; ++j)
      if (p.doc_start[bb * p.s + j] <= j) l = int(j);
    last = l;
  }
  const int64_t first = j0 > p.q_row0 ? j0 : p.q_row0, end = p.q_row0 + p.sq;
  for (int64_t t0 = first; t0 < end; t0 += kR) {
    const int64_t r0 = t0 - p.q_row0;
    const int nr = int(end - t0 < kR ? end - t0 : kR);
    __syncthreads();
    load_rows(p, m, bb, r0, nr, ws.lseC, ws.lseI);
    __syncthreads();
    if (threadIdx.x == 0) {
      int lo = INT_MAX, hi = -1;
      for (int r = 0; r < kR; ++r)
        if (m.lo[r] != INT_MAX) lo = min(lo, m.lo[r]), hi = max(hi, m.t[r]);
      hull[0] = lo, hull[1] = hi;
    }
    __syncthreads();
    // A tile none of whose rows sees the keys: past their documents (no later row sees them) once
    // it is past the last key in a document; before that it is padding rows (a layout from end
    // rows may put them between documents) and a later document may still start among the keys.
    if (hull[0] > jmax) {
      if (t0 > last) break;
      continue;
    }
    const uint32_t live = warp_live(j0, warp, hull[0], hull[1]);
    float P[2][4], I[2][4], kl[2] = {0.f, 0.f};
    target_tile(p, m, bb, r0, nr, j0, nk, P, live);
    index_tile(p, m, bb, r0, nr, I, true, live);
    tile_dI(m, I, P, j0, warp, lane, kl);
    for (int64_t h = 0; h < p.HI; ++h) {
      __syncthreads();  // dIb, the masks; the previous head's qI rows are read
      load_qI_head(p, m, bb, r0, nr, h);
      __syncthreads();
      if (!live) continue;  // dS_h^T is 0 for all of the warp's keys
      uint32_t a[4];  // dS_h^T: keys (16 w + g | + 8) x rows (2c.. | 2c + 8..)
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const int k = 16 * warp + g + 8 * (x & 1), r = 2 * c + 8 * (x >> 1);
        uint32_t v[2];
#pragma unroll
        for (int y = 0; y < 2; ++y)
          v[y] = mask_bit(m, int(h), r + y, k) ? bf16_bits(bits_f32(dIb_bits(m, r + y, k)) * m.wts[(r + y) * p.HI + h]) : 0u;
        a[x] = v[0] | (v[1] << 16);
      }
#pragma unroll
      for (int ct = 0; ct < kMaxCt; ++ct) {
        if (ct >= cts) break;
        uint32_t b[2];
        load_b_kn(b, m.QIs, m.ldi, 0, ct * 8, lane);
        mma_bf16_16816(acc[ct], a, b);
      }
    }
  }
#pragma unroll
  for (int ct = 0; ct < kMaxCt; ++ct) {
    if (ct >= cts) break;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int k = 16 * warp + g + 8 * (e >> 1), col = ct * 8 + 2 * c + (e & 1);
      if (k < nk && col < p.DI) p.dkI[(bb * p.s + j0 + k) * p.DI + col] = acc[ct][e];
    }
  }
}

}  // namespace

void detail::kl_dense_mma(const IndexerKlParams& p) {
  const int64_t rows = p.b * p.sq;
  Scratch<float> lseI(rows), lseC(p.lse_c ? 1 : rows * p.H), kl(rows);
  const Work ws{lseI.get(), p.lse_c ? nullptr : lseC.get(), kl.get(), nullptr, nullptr};
  cudaStream_t st = current_stream().get();
  const size_t smem = size_t(IndexerKlTraits::mma_smem_bytes(p.H, p.HI, p.Dqk, p.DI));
  check(cudaFuncSetAttribute(kl_mma_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)), "indexer KL smem");
  check(cudaFuncSetAttribute(kl_mma_keys_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)), "indexer KL smem");
  if (rows > 0) {
    HMLA_LAUNCH(kl_mma_rows_kernel, unsigned(p.b * ((p.sq + kR - 1) / kR)), kThreads, smem, st, p, ws);
    check_launch("indexer KL rows (mma)");
  }
  if (p.b * p.s > 0) {
    HMLA_LAUNCH(kl_mma_keys_kernel, unsigned(p.b * ((p.s + kN - 1) / kN)), kThreads, smem, st, p, ws);
    check_launch("indexer KL keys (mma)");
  }
  detail::kl_sum(p, kl.get(), rows);
}

}  // namespace hmla::cuda
