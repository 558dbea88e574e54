// The sparse indexer KL on the tensor cores (bf16 qI, kI, q, k: what dsa_sparse passes; the
// algebra of docs/indexer.md, "The sparse KL on the CUDA tensor cores"). A block per query row t
// and its candidates C(t) (the table's first K slots, -1 dropped, in compact() order), the heads
// as the rows of mma.sync.m16n8k16: a row's [H, n] attention scores and [HI, n] index scores are
// GEMM-shaped with the gathered keys as the columns. Per tile of kT gathered candidates:
//   P      for each kv head and chunk of kHc of its heads: Q [heads, Dqk] x K_tile^T, then
//          sum_h exp(scale l_h - lseC_h) over the chunk's rows into P[i] (lseC: the attention's,
//          given, or pass 0 over the tiles first, an online logsumexp per head row);
//   I      qI [HI, DI] x kI_tile^T, I[i] = sum_h w_h relu(.) over the rows;
//   then   lseI, kl and dI = g (exp(I - lseI) - P) per candidate (block reductions, fixed order);
//   G      the index scores again (their relu' and nothing else), dS = bf16(dI) [s > 0] into shared
//          memory, G [HI, DI] += dS kI_tile (f32 accumulators in registers over the whole list);
//          and the tile's dkI contributions dS'^T qI, dS' = bf16(bf16(dI) w_h) [s > 0], into a
//          workspace per (row, candidate);
//   finish dqI_h = w_h G_h, dw_h = qI_h . G_h.
// 2 H Dqk + 8 HI DI tensor-core FLOPs per candidate with lseC given (2 H Dqk more without),
// against the minimum 2 H Dqk + 6 HI DI. dkI sums the contributions per key through the inverse
// index (sparse_index.cuh) in (row, position) order: deterministic, no float atomics. The
// workspace is IndexerKlTraits::kSpWorkspaceBytes of rows at a time.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "cuda_kernels.h"
#include "mma.cuh"
#include "reduce.cuh"
#include "runtime.h"
#include "sparse_index.cuh"
#include "traits.h"

namespace hmla::cuda {

namespace {

using Traits = IndexerKlTraits;
using bf16 = __nv_bfloat16;
constexpr int kT = Traits::kSpKeys, kHc = Traits::kSpHeads, kWarps = Traits::kSpWarps, kThreads = Traits::kSpThreads;
constexpr int kPad = int(Traits::kMmaPad);
constexpr int kMaxCt = int(Traits::kMmaMaxDI / 8);  // n-tiles of DI: G's accumulators per warp at most
constexpr int kMaxCc = kMaxCt / 4;                  // a dkI contribution tile's columns: 4 groups of warps
static_assert(kT == 32 && kWarps == 8, "a score tile is (16 rows, 16 keys) items over two key halves; 2 x 4 dkI items");

std::atomic<int64_t> g_workspace_bytes{Traits::kSpWorkspaceBytes};

// The block's shared memory, carved in the order of IndexerKlTraits::sp_smem_bytes.
struct Sm {
  bf16 *A, *B;       // the Q chunk [kHc, ldq] or qI [HIp, ldi]; the gathered k tile [kT, ldq] or kI tile [kT, ldi]
  bf16 *dSg, *dSkT;  // [HIp, ldg] bf16(dI) [s > 0]; [kT, ldk] bf16(bf16(dI) w_h) [s > 0], keys as rows
  float *P, *I;      // [K] per candidate: sum_h exp(l_h - lseC_h), then P; I, then dI
  int32_t* list;     // [K] the candidates
  float *lseC, *w, *part, *red;  // [kHc], [HIp] (0 past HI), [kSpPart], [kThreads]
  int ldq, ldi, ldg, ldk, Dqkp, DIp, HIp;
};

__device__ __forceinline__ int64_t pad16(int64_t n) { return (n + 15) / 16 * 16; }

__device__ __forceinline__ Sm carve(const IndexerKlParams& p, unsigned char* base) {
  Sm m;
  m.Dqkp = int(pad16(p.Dqk)), m.DIp = int(pad16(p.DI)), m.HIp = int(pad16(p.HI));
  m.ldq = m.Dqkp + kPad, m.ldi = m.DIp + kPad, m.ldg = kT + kPad, m.ldk = m.HIp + kPad;
  unsigned char* x = base;
  auto take = [&](int64_t bytes) {
    unsigned char* r = x;
    x += (bytes + 15) / 16 * 16;
    return r;
  };
  m.A = reinterpret_cast<bf16*>(take(int64_t(kHc * m.ldq > m.HIp * m.ldi ? kHc * m.ldq : m.HIp * m.ldi) * 2));
  m.B = reinterpret_cast<bf16*>(take(int64_t(kT) * (m.ldq > m.ldi ? m.ldq : m.ldi) * 2));
  m.dSg = reinterpret_cast<bf16*>(take(int64_t(m.HIp) * m.ldg * 2));
  m.dSkT = reinterpret_cast<bf16*>(take(int64_t(kT) * m.ldk * 2));
  m.P = reinterpret_cast<float*>(take(p.K * 4));
  m.I = reinterpret_cast<float*>(take(p.K * 4));
  m.list = reinterpret_cast<int32_t*>(take(p.K * 4));
  m.lseC = reinterpret_cast<float*>(take(kHc * 4));
  m.w = reinterpret_cast<float*>(take(int64_t(m.HIp) * 4));
  m.part = reinterpret_cast<float*>(take(Traits::kSpPart * 4));
  m.red = reinterpret_cast<float*>(take(kThreads * 4));
  return m;
}

// A score item: rows [16 mt, 16 mt + 16) of the block's A tile against keys [16 np, 16 np + 16) of
// the key tile (two n-tiles of 8). Items 2 mt + np are spread over the warps. Accumulator element
// (nt, e) of lane (g, c): row 16 mt + g + 8 (e >> 1), key 16 np + 8 nt + 2 c + (e & 1).
__device__ __forceinline__ int item_row(int mt, int lane, int e) { return 16 * mt + (lane >> 2) + 8 * (e >> 1); }
__device__ __forceinline__ int item_key(int np, int lane, int nt, int e) { return 16 * np + 8 * nt + 2 * (lane & 3) + (e & 1); }

// The item's scores over its n-tiles holding one of the tile's nk keys (the others stay 0).
__device__ __forceinline__ uint32_t item_scores(float (&acc)[2][4], const bf16* A, const bf16* B, int ld, int K, int mt,
                                                int np, int nk, int lane) {
  const uint32_t live = live_columns<2>(16 * np, 0, nk - 1);
  zero_acc(acc);
  if (live) mma_abt_live<2, true>(acc, A, ld, 16 * mt, B + 16 * np * ld, ld, K, lane, live);
  return live;
}

// sum over the item's 16 rows of v(row, nt, e) per key, into part[mt * kT + key] (lanes g = 0 write).
template <class F>
__device__ __forceinline__ void item_column_sums(int mt, int np, int lane, F v, float* part) {
  float s[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e & 1] += v(nt, e);
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      float y = s[nt][x];
      y += __shfl_xor_sync(0xffffffffu, y, 4);
      y += __shfl_xor_sync(0xffffffffu, y, 8);
      y += __shfl_xor_sync(0xffffffffu, y, 16);
      if (lane < 4) part[mt * kT + item_key(np, lane, nt, x)] = y;
    }
}

// acc[x] += A[r0, +16) [k0, +16) B[k0, +16) [8 (ct0 + x), +8) for x < n: A and B row-major shared
// tiles (B's rows along the k of the product: keys for dS kI, heads for dS'^T qI).
template <int kN>
__device__ __forceinline__ void mma_step_kn(float (&acc)[kN][4], const bf16* A, int lda, int r0, int k0, const bf16* B,
                                            int ldb, int ct0, int n, int lane) {
  uint32_t a[4];
  load_a(a, A, lda, r0, k0, lane);
#pragma unroll
  for (int x = 0; x < kN; ++x) {
    if (x >= n) break;
    uint32_t b[2];
    load_b_kn(b, B, ldb, k0, (ct0 + x) * 8, lane);
    mma_bf16_16816(acc[x], a, b);
  }
}

// Key j's total over the score tile's m-tiles [0, mts) of item_column_sums, in order.
__device__ __forceinline__ float column_total(const Sm& m, int mts, int j) {
  float s = 0.f;
  for (int x = 0; x < mts; ++x) s += m.part[x * kT + j];
  return s;
}

// The gathered tile of keys [i0, i0 + nk) of the list: rows of `base` at stride rstride, width
// `width` zero-padded to `padded`.
__device__ __forceinline__ void gather(bf16* s, int ld, const void* base, int64_t rstride, const int32_t* list, int nk,
                                       int64_t width, int padded) {
  load_tile_padded(s, ld, static_cast<const bf16*>(base), rstride, kT, nk, int(width), padded, list);
}

// Pass 0 (no given lse): lseC of the chunk's rows [0, nh) over the n candidates, an online
// logsumexp per row over the key tiles (the Q chunk in m.A), into m.lseC (+inf past nh).
__device__ void chunk_lse(const IndexerKlParams& p, const Sm& m, const bf16* kbase, int n, int nh) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, mts = (nh + 15) / 16;
  const int mt = warp >> 1, np = warp & 1;  // at most 2 x 4 items: one per warp
  float mx[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  for (int i0 = 0; i0 < n; i0 += kT) {
    const int nk = n - i0 < kT ? n - i0 : kT;
    __syncthreads();
    gather(m.B, m.ldq, kbase, p.k_rstride, m.list + i0, nk, p.Dqk, m.Dqkp);
    __syncthreads();
    if (mt >= mts) continue;
    float acc[2][4];
    item_scores(acc, m.A, m.B, m.ldq, m.Dqkp, mt, np, nk, lane);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[nt][e] = item_key(np, lane, nt, e) < nk ? p.scale * acc[nt][e] : -INFINITY;
    online_lse_tile(acc, mx, l);
  }
  __syncthreads();
  if (mt < mts)
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      float* slot = m.part + (item_row(mt, lane, 2 * hi) * 8 + np * 4 + (lane & 3)) * 2;
      slot[0] = mx[hi], slot[1] = l[hi];
    }
  __syncthreads();
  for (int r = threadIdx.x; r < kHc; r += blockDim.x) {  // the row's 8 lanes' (m, l), in order
    float M = -INFINITY, L = 0.f;
    if (r < nh) {
      const float* rv = m.part + r * 16;
      for (int i = 0; i < 8; ++i) M = fmaxf(M, rv[2 * i]);
      if (M > -INFINITY)
        for (int i = 0; i < 8; ++i)
          if (rv[2 * i] > -INFINITY) L += rv[2 * i + 1] * expf(rv[2 * i] - M);
    }
    m.lseC[r] = L > 0.f ? M + logf(L) : INFINITY;
  }
}

// m.P[i] = P(t, list[i]) = mean_h exp(scale q_h . k(list[i]) - lseC_h) for i < n.
__device__ void target(const IndexerKlParams& p, const Sm& m, int64_t row, int n) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t bb = row / p.sq, tl = row % p.sq, group = p.H / p.Hkv;
  for (int i = threadIdx.x; i < n; i += blockDim.x) m.P[i] = 0.f;
  for (int64_t hk = 0; hk < p.Hkv; ++hk)
    for (int64_t c0 = 0; c0 < group; c0 += kHc) {
      const int nh = int(group - c0 < kHc ? group - c0 : kHc), mts = (nh + 15) / 16;
      const int64_t h0 = hk * group + c0;
      const bf16* kbase = static_cast<const bf16*>(p.k) + bb * p.k_bstride + hk * p.k_hstride;
      __syncthreads();  // the previous chunk's Q and lseC are read
      load_tile_padded(m.A, m.ldq, static_cast<const bf16*>(p.q) + bb * p.q_bstride + tl * p.q_rstride + h0 * p.q_hstride,
                       p.q_hstride, 16 * mts, nh, int(p.Dqk), m.Dqkp);
      if (p.lse_c) {
        for (int r = threadIdx.x; r < kHc; r += blockDim.x) m.lseC[r] = r < nh ? p.lse_c[(bb * p.H + h0 + r) * p.sq + tl] : INFINITY;
      } else {
        chunk_lse(p, m, kbase, n, nh);
      }
      for (int i0 = 0; i0 < n; i0 += kT) {
        const int nk = n - i0 < kT ? n - i0 : kT;
        __syncthreads();
        gather(m.B, m.ldq, kbase, p.k_rstride, m.list + i0, nk, p.Dqk, m.Dqkp);
        __syncthreads();
        const int mt = warp >> 1, np = warp & 1;
        if (mt < mts) {
          float acc[2][4];
          item_scores(acc, m.A, m.B, m.ldq, m.Dqkp, mt, np, nk, lane);
          item_column_sums(mt, np, lane, [&](int nt, int e) {
            return item_key(np, lane, nt, e) < nk ? expf(p.scale * acc[nt][e] - m.lseC[item_row(mt, lane, e)]) : 0.f;
          }, m.part);
        }
        __syncthreads();
        for (int j = threadIdx.x; j < nk; j += blockDim.x) m.P[i0 + j] += column_total(m, mts, j);
      }
    }
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) m.P[i] /= float(p.H);
}

// m.I[i] = I(t, list[i]) = sum_h w_h relu(qI_h . kI(list[i])) for i < n (qI in m.A).
__device__ void index_scores(const IndexerKlParams& p, const Sm& m, const bf16* kIb, int n) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, mts = m.HIp / 16;
  for (int i0 = 0; i0 < n; i0 += kT) {
    const int nk = n - i0 < kT ? n - i0 : kT;
    __syncthreads();
    gather(m.B, m.ldi, kIb, p.DI, m.list + i0, nk, p.DI, m.DIp);
    __syncthreads();
    for (int item = warp; item < 2 * mts; item += kWarps) {
      const int mt = item >> 1, np = item & 1;
      float acc[2][4];
      item_scores(acc, m.A, m.B, m.ldi, m.DIp, mt, np, nk, lane);
      item_column_sums(mt, np, lane, [&](int nt, int e) { return m.w[item_row(mt, lane, e)] * fmaxf(acc[nt][e], 0.f); },
                       m.part);
    }
    __syncthreads();
    for (int j = threadIdx.x; j < nk; j += blockDim.x) m.I[i0 + j] = column_total(m, mts, j);
  }
}

// One block per row of the chunk [r0, r0 + gridDim.x): kl[row], dqI, dw, and the row's dkI
// contributions contrib[(local * K + i) * DI + :DI] for its candidates i < n.
__global__ void __launch_bounds__(kThreads, 1) kl_sparse_mma_kernel(IndexerKlParams p, int64_t r0, float* contrib, float* kl) {
  HMLA_DYNAMIC_SHARED(float, smem);
  const Sm m = carve(p, reinterpret_cast<unsigned char*>(smem));
  __shared__ int s_nc;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, c = lane & 3;
  const int64_t local = blockIdx.x, row = r0 + local, bb = row / p.sq;
  const int n = compact(p.topk + row * (p.K + p.W), int(p.K), int(p.K), m.list, &s_nc);
  float* dq = p.dqI + row * p.HI * p.DI;
  if (n == 0) {  // no candidates: no loss, zero gradients, no contributions
    for (int64_t i = threadIdx.x; i < p.HI * p.DI; i += blockDim.x) dq[i] = 0.f;
    for (int64_t h = threadIdx.x; h < p.HI; h += blockDim.x) p.dw[row * p.HI + h] = 0.f;
    if (threadIdx.x == 0) kl[row] = 0.f;
    return;
  }
  target(p, m, row, n);

  // The index scores: qI stays in m.A from here on.
  const bf16* kIb = static_cast<const bf16*>(p.kI) + bb * p.s * p.DI;
  __syncthreads();
  load_tile_padded(m.A, m.ldi, static_cast<const bf16*>(p.qI) + row * p.HI * p.DI, p.DI, m.HIp, int(p.HI), int(p.DI), m.DIp);
  for (int h = threadIdx.x; h < m.HIp; h += blockDim.x) m.w[h] = h < p.HI ? p.w[row * p.HI + h] : 0.f;
  index_scores(p, m, kIb, n);

  // lseI, kl, dI (over I in place).
  __syncthreads();
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < n; i += blockDim.x) mx = fmaxf(mx, m.I[i]);
  const float M = block_max<kThreads>(mx, m.red);
  float z = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) z += expf(m.I[i] - M);
  const float lseI = M + logf(block_sum<kThreads>(z, m.red));
  const float gr = p.coeff * p.row_weight[row];
  float klp = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float Pv = m.P[i], logq = m.I[i] - lseI;
    if (Pv > 0.f) klp += Pv * (logf(Pv) - logq);
    m.I[i] = gr * (expf(logq) - Pv);
  }
  klp = block_sum<kThreads>(klp, m.red);  // its barriers also publish dI
  if (threadIdx.x == 0) kl[row] = klp;

  // G and the dkI contributions. G: warp (gm, gc) owns index-head m-tile gm and n-tiles
  // [gc gper, +gper) of DI; a contribution tile [kT keys, DI]: warp (km, kc) keys [16 km, +16),
  // n-tiles [kc cper, +cper).
  const int mts = m.HIp / 16, cts = m.DIp / 8, groups = kWarps / mts;
  const int gm = warp % mts, gc = warp / mts, gper = (cts + groups - 1) / groups, gct0 = gc * gper;
  const bool owns_g = warp < mts * groups;
  const int km = warp & 1, kc = warp >> 1, cper = (cts + 3) / 4, cct0 = kc * cper;
  const int gn = max(0, min(gper, cts - gct0)), cn = max(0, min(cper, cts - cct0));  // the warp's n-tiles
  float G[kMaxCt][4];
  zero_acc(G);
  for (int i0 = 0; i0 < n; i0 += kT) {
    const int nk = n - i0 < kT ? n - i0 : kT;
    __syncthreads();  // the previous tile's dS tiles are read
    gather(m.B, m.ldi, kIb, p.DI, m.list + i0, nk, p.DI, m.DIp);
    __syncthreads();
    for (int item = warp; item < 2 * mts; item += kWarps) {  // relu'(s) again, into the dS tiles
      const int mt = item >> 1, np = item & 1;
      float acc[2][4];
      item_scores(acc, m.A, m.B, m.ldi, m.DIp, mt, np, nk, lane);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = item_row(mt, lane, e), k = item_key(np, lane, nt, e);
          const bool on = k < nk && acc[nt][e] > 0.f;
          const bf16 d = __float2bfloat16(on ? m.I[i0 + k] : 0.f);
          m.dSg[r * m.ldg + k] = d;
          m.dSkT[k * m.ldk + r] = __float2bfloat16(__bfloat162float(d) * m.w[r]);
        }
    }
    __syncthreads();
    if (owns_g)  // G += dS kI over the tile's 16-key steps
      for (int ks = 0; ks * 16 < nk; ++ks) mma_step_kn(G, m.dSg, m.ldg, 16 * gm, 16 * ks, m.B, m.ldi, gct0, gn, lane);
    if (16 * km < nk) {  // the contributions dS'^T qI of keys [16 km, +16)
      float C[kMaxCc][4];
      zero_acc(C);
      for (int kk = 0; kk < mts; ++kk) mma_step_kn(C, m.dSkT, m.ldk, 16 * km, 16 * kk, m.A, m.ldi, cct0, cn, lane);
#pragma unroll
      for (int x = 0; x < kMaxCc; ++x) {
        if (x >= cn) break;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int k = 16 * km + g + 8 * (e >> 1), col = (cct0 + x) * 8 + 2 * c + (e & 1);
          if (k < nk && col < p.DI) contrib[((local * p.K) + i0 + k) * p.DI + col] = C[x][e];
        }
      }
    }
  }

  // dqI_h = w_h G_h (each element owned by one lane); dw_h = qI_h . G_h: the lane's columns, its
  // quad, then the column groups in order.
  float dwp[2] = {0.f, 0.f};
  if (owns_g)
#pragma unroll
    for (int x = 0; x < kMaxCt; ++x) {
      if (x >= gn) break;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = 16 * gm + g + 8 * (e >> 1), col = (gct0 + x) * 8 + 2 * c + (e & 1);
        if (h < p.HI && col < p.DI) {
          dq[h * p.DI + col] = m.w[h] * G[x][e];
          dwp[e >> 1] += __bfloat162float(m.A[h * m.ldi + col]) * G[x][e];
        }
      }
    }
  __syncthreads();  // the partials' space is free
  if (owns_g)
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const float y = quad_sum(dwp[hi]);
      if (c == 0) m.part[gc * m.HIp + 16 * gm + g + 8 * hi] = y;
    }
  __syncthreads();
  for (int h = threadIdx.x; h < p.HI; h += blockDim.x) {
    float s = 0.f;
    for (int x = 0; x < groups; ++x) s += m.part[x * m.HIp + h];
    p.dw[row * p.HI + h] = s;
  }
}

}  // namespace

int64_t set_indexer_kl_workspace_bytes(int64_t bytes) { return g_workspace_bytes.exchange(std::max<int64_t>(bytes, 1)); }

void indexer_kl_sparse_mma(const IndexerKlParams& p, float* kl) {
  cudaStream_t st = current_stream().get();
  if (p.b * p.s > 0) check(cudaMemsetAsync(p.dkI, 0, size_t(p.b * p.s * p.DI) * sizeof(float), st), "cudaMemsetAsync");
  const int64_t rows = p.b * p.sq;
  if (rows == 0) return;
  const TableRows t{p.topk, p.b, p.sq, p.s, p.K + p.W, p.K, p.K};  // the candidates only
  const int64_t per_row = std::max<int64_t>(p.K * p.DI * int64_t(sizeof(float)), 1);
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(rows, g_workspace_bytes.load() / per_row));
  Scratch<float> ws(chunk * p.K * p.DI);
  InverseIndex index(t, chunk, "indexer_kl_sparse");
  const size_t smem = size_t(Traits::sp_smem_bytes(p.HI, p.Dqk, p.DI, p.K));
  check(cudaFuncSetAttribute(kl_sparse_mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
        "indexer KL smem");
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t nr = std::min(chunk, rows - r0);
    index.build(t, r0, nr);
    HMLA_LAUNCH(kl_sparse_mma_kernel, unsigned(nr), kThreads, smem, st, p, r0, ws.get(), kl);
    check_launch("indexer KL sparse (mma)");
    inverse_reduce(index, t, ws.get(), p.DI, 1, p.dkI, "indexer KL sparse: dkI reduce");
  }
}

}  // namespace hmla::cuda
