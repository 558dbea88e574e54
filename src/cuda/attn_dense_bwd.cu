// Dense per-document causal attention backward on the GPU (bf16 in and out, f32 accumulation),
// deterministic by construction: no atomics, each output element written by one thread.
//   D[t] = rowsum(dO * O);  P = exp(scale q.k - lse);  dS = P (dO.v - D)
//   dq = scale dS K  (kernel dq: blocks own query rows, walk their key range)
//   dk = scale dS^T Q, dv = P^T dO  (kernel dkdv: blocks own keys of one kv head, walk every
//        query of its head group that sees them, heads in order)
// Both recompute P from q, k and the saved lse (flash style; nothing of size s*s). A block
// computes S and dP once per tile and shares P / dS through shared memory (bf16) with warps that
// split the gradient's columns, all of them in one block up to 576 / 512 wide (BwdWarp). dsink[h] =
// -sum_t exp(sink_h - lse[t]) D[t] by a fixed-order block reduction.
#include <cuda_bf16.h>

#include "attn_cudnn.h"
#include "attn_dense.cuh"
#include "hmla/core/tensor.h"
#include "mma.cuh"
#include "runtime.h"

namespace hmla::cuda {

namespace {

// D[b, h, t] = sum_c dO[t, h, c] O[t, h, c]; one warp per (row, head).
__global__ void rowdot_kernel(const __nv_bfloat16* out, const __nv_bfloat16* dout, int64_t rows, int64_t sq, int64_t H,
                              int64_t Dv, float* D) {
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= rows * H) return;
  const int64_t row = w / H, h = w % H;  // row = b * sq + t
  const __nv_bfloat16* o = out + (row * H + h) * Dv;
  const __nv_bfloat16* d = dout + (row * H + h) * Dv;
  float acc = 0.f;
  for (int64_t c = lane; c < Dv; c += 32) acc += __bfloat162float(o[c]) * __bfloat162float(d[c]);
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) D[((row / sq) * H + h) * sq + row % sq] = acc;
}

// dsink[h] += -sum over (b, t) with finite lse of exp(sink_h - lse) D; one block per head.
__global__ void dsink_kernel(const float* lse, const float* D, const float* sink, int64_t b, int64_t sq, int64_t H,
                             float* dsink) {
  __shared__ float part[256];
  const int h = blockIdx.x;
  float acc = 0.f;
  for (int64_t i = threadIdx.x; i < b * sq; i += blockDim.x) {
    const int64_t k = ((i / sq) * H + h) * sq + i % sq;
    const float l = lse[k];
    if (l != INFINITY) acc -= expf(sink[h] - l) * D[k];
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int n = blockDim.x / 2; n > 0; n /= 2) {
    if (threadIdx.x < n) part[threadIdx.x] += part[threadIdx.x + n];
    __syncthreads();
  }
  if (threadIdx.x == 0) dsink[h] += part[0];  // a parameter's gradient: added (hmla/ops/nn.h)
}

// acc0/acc1 (n-tiles n0, n0 + 8) += A B over one 16-deep k-step, or over its one live half of 8
// (m16n8k8) when the other half of A is masked (zeros): `halves` bit 0 the low, bit 1 the high.
// b0, b1 as load_b_kn_x2 gives them: b[0] the low 8 rows of k, b[1] the high.
__device__ __forceinline__ void mma_k16_or_half(float (&acc0)[4], float (&acc1)[4], const uint32_t a[4],
                                                const uint32_t b0[2], const uint32_t b1[2], uint32_t halves) {
  if (halves == 3u) {
    mma_bf16_16816(acc0, a, b0);
    mma_bf16_16816(acc1, a, b1);
  } else {
    const bool lo = halves == 1u;
    const uint32_t ah[2] = {lo ? a[0] : a[2], lo ? a[1] : a[3]};
    mma_bf16_1688(acc0, ah, lo ? b0[0] : b0[1]);
    mma_bf16_1688(acc1, ah, lo ? b1[0] : b1[1]);
  }
}

// The block's warps: kWarps row tiles of 16 (query rows in dq, keys in dkdv) times kBwdSplit
// parts. A warp computes S and dP of its row tile for its kNt / kBwdSplit n-tiles of the tile
// (over the whole Dqk / Dv), turns them into P and dS and writes them to shared memory (bf16, the
// rounding the A operand would take anyway); after a barrier it accumulates its row tile's
// gradient for the 16-column pairs part, part + kBwdSplit, ... of column group `cg`.
template <bool kWide>
struct BwdWarp {
  using T = AttnCudaTraits<kWide>;
  static constexpr int kNt = T::kBk / 8, kNs = kNt / T::kBwdSplit;
  int warp, m, part, lane, g, c;
  __device__ BwdWarp()
      : warp(threadIdx.x / 32),
        m(warp / T::kBwdSplit),
        part(warp % T::kBwdSplit),
        lane(threadIdx.x % 32),
        g(lane / 4),
        c(lane % 4) {}
  // This warp's n-tiles of a row tile's live mask (bit nt for its nt-th).
  __device__ uint32_t mine(uint32_t live) const { return (live >> (part * kNs)) & ((1u << kNs) - 1u); }
  // Its two 32-bit values of n-tile nt (rows g and g + 8 of its row tile) into a [rows, kBk] tile.
  __device__ void store(__nv_bfloat16* s, int ld, int nt, const float (&v)[4]) const {
    const int col = (part * kNs + nt) * 8 + 2 * c;
    *reinterpret_cast<uint32_t*>(s + (m * 16 + g) * ld + col) = pack_bf16(v[0], v[1]);
    *reinterpret_cast<uint32_t*>(s + (m * 16 + g + 8) * ld + col) = pack_bf16(v[2], v[3]);
  }
};

// dq for kRows query rows of one (b, h) and column group cg (all of Dqk up to 576 wide: one
// group), walking the rows' key range.
template <bool kWide>
__global__ void __launch_bounds__(AttnCudaTraits<kWide>::kBwdThreads)
    attn_bwd_dq_kernel(const AttnDenseParams p, const float* D, int ngroups, VecFlags vec, int stages, bool v_in_k) {
  using T = AttnCudaTraits<kWide>;
  using W = BwdWarp<kWide>;
  constexpr int kNt = W::kNt, kNs = W::kNs, kPairs = T::kDqPairs, kS = T::kBwdSplit;
  HMLA_DYNAMIC_SHARED(unsigned char, smem);
  // ldvt: the V tile's row stride (the K tile's when the values are the keys' first columns).
  const int ldq = p.Dqk + T::kPad, ldv = p.Dv + T::kPad, ldt = T::kBk + T::kPad, ldvt = v_in_k ? ldq : ldv;
  const int stage_elems = T::kBk * ldq + (v_in_k ? 0 : T::kBk * ldv);
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem);  // [kRows, Dqk]
  __nv_bfloat16* dOs = Qs + T::kRows * ldq;                      // [kRows, Dv]
  __nv_bfloat16* dSs = dOs + T::kRows * ldv;                     // [kRows, kBk]: dS of the tile
  __nv_bfloat16* stage0 = dSs + T::kRows * ldt;                  // stages x {K [kBk, Dqk], V [kBk, Dv]}
  __shared__ MaskRanges<T::kWarps> mr;

  const int tiles = (p.sq + T::kRows - 1) / T::kRows;
  const int tile = tiles - 1 - blockIdx.x;
  const int h = blockIdx.y / ngroups, cg = blockIdx.y % ngroups, b = blockIdx.z;
  const int hk = h / (p.H / p.Hkv);
  const int npairs = int(p.Dqk) / 16, q0 = cg * kPairs * kS;
  const int lr0 = tile * T::kRows, nrows = min(T::kRows, int(p.sq) - lr0);
  const int32_t* ds = p.doc_start + int64_t(b) * p.s;

  // The block's key range and each row tile's (the forward's mask policy, attn_dense_fwd.cu).
  {
    const int64_t t = p.q_row0 + lr0 + threadIdx.x;
    const bool sees = int(threadIdx.x) < nrows && ds[t] <= t;
    mr.fill(sees, sees ? ds[t] : 0, int(t));
  }
  load_tile(Qs, ldq, bf(p.q) + b * p.q_bstride + int64_t(lr0) * p.q_rstride + h * p.q_hstride, p.q_rstride,
            T::kRows, nrows, p.Dqk, vec.q);
  load_tile(dOs, ldv, bf(p.dout) + ((int64_t(b) * p.sq + lr0) * p.H + h) * p.Dv, p.H * p.Dv, T::kRows, nrows, p.Dv,
            vec.o);
  __syncthreads();
  const int jmin = mr.lo, jmax = mr.hi;

  const W w;
  const int lane = w.lane, c = w.c;
  const int rA = w.m * 16 + w.g, rB = rA + 8;
  const int wlo = mr.ulo[w.m], whi = mr.uhi[w.m];
  const int64_t tA = p.q_row0 + lr0 + rA, tB = tA + 8;
  const int dsA = rA < nrows ? ds[tA] : INT32_MAX, dsB = rB < nrows ? ds[tB] : INT32_MAX;
  const int64_t lrow = (int64_t(b) * p.H + h) * p.sq + lr0;
  const float lseA = rA < nrows ? p.lse[lrow + rA] * kLog2e : INFINITY;
  const float lseB = rB < nrows ? p.lse[lrow + rB] * kLog2e : INFINITY;
  const float DA = rA < nrows ? D[lrow + rA] : 0.f, DB = rB < nrows ? D[lrow + rB] : 0.f;
  const float c2 = p.scale * kLog2e;
  float dq[2 * kPairs][4];
  zero_acc(dq);

  const __nv_bfloat16* kbase = bf(p.k) + b * p.k_bstride + hk * p.k_hstride;
  const __nv_bfloat16* vbase = bf(p.v) + b * p.v_bstride + hk * p.v_hstride;
  // The K and V tiles at j0 into stage st (cp.async; two stages overlap tile i + 1's copies with
  // tile i's products: pipeline_step).
  auto issue = [&](int j0, int st) {
    __nv_bfloat16* K = stage0 + st * stage_elems;
    const int nk = min(T::kBk, jmax + 1 - j0);
    load_tile_async(K, ldq, kbase + int64_t(j0) * p.k_rstride, p.k_rstride, T::kBk, nk, p.Dqk, vec.k);
    if (!v_in_k)
      load_tile_async(K + T::kBk * ldq, ldv, vbase + int64_t(j0) * p.v_rstride, p.v_rstride, T::kBk, nk, p.Dv, vec.v);
  };
  pipeline_start(stages, jmin <= jmax, [&](int, int st) { issue(jmin, st); });
  int it = 0;
  for (int j0 = jmin; j0 <= jmax; j0 += T::kBk, ++it) {
    const int st = pipeline_step(stages, it, j0 + T::kBk <= jmax, [&](int ahead, int sb) { issue(j0 + ahead * T::kBk, sb); });
    const __nv_bfloat16* Ks = stage0 + st * stage_elems;
    const __nv_bfloat16* Vs = v_in_k ? Ks : Ks + T::kBk * ldq;

    // Column tiles outside the row tile's key range are masked for all its rows: no products
    // (their dS is +-0, which adds nothing to dq); written as zeros.
    const uint32_t live = live_columns<kNt>(j0, wlo, whi), mine = w.mine(live);
    float s[kNs][4], dp[kNs][4];
    zero_acc(s);
    zero_acc(dp);
    if (mine) {
      mma_abt_live<kNs, true>(s, Qs, ldq, w.m * 16, Ks + w.part * kNs * 8 * ldq, ldq, int(p.Dqk), lane, mine);
      mma_abt_live<kNs, true>(dp, dOs, ldv, w.m * 16, Vs + w.part * kNs * 8 * ldvt, ldvt, int(p.Dv), lane, mine);
    }
    // dS = P (dP - D) * scale, in place of s; a tile every row of the row tile sees whole needs
    // no per-element test.
    const bool whole = mr.whole(w.m, j0, T::kBk);
#pragma unroll
    for (int nt = 0; nt < kNs; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t j = j0 + (w.part * kNs + nt) * 8 + 2 * c + (e & 1);
        const bool lo = e < 2;
        const bool ok = whole || (((mine >> nt) & 1u) && (lo ? allowed(dsA, tA, j) : allowed(dsB, tB, j)));
        const float pr = ok ? exp2f(s[nt][e] * c2 - (lo ? lseA : lseB)) : 0.f;
        s[nt][e] = pr * (dp[nt][e] - (lo ? DA : DB)) * p.scale;
      }
      w.store(dSs, ldt, nt, s[nt]);
    }
    __syncthreads();
    // dq += dS K over the row tile's live keys, 16 a step or 8 where half a step is masked.
#pragma unroll 1
    for (int kt = 0; kt < kNt / 2; ++kt) {
      const uint32_t halves = (live >> (2 * kt)) & 3u;
      if (!halves) continue;
      uint32_t a[4];
      load_a(a, dSs, ldt, w.m * 16, kt * 16, lane);
#pragma unroll
      for (int i = 0; i < kPairs; ++i) {
        const int q = q0 + w.part + kS * i;
        if (q >= npairs) break;
        uint32_t b0[2], b1[2];
        load_b_kn_x2(b0, b1, Ks, ldq, kt * 16, q * 16, lane);
        mma_k16_or_half(dq[2 * i], dq[2 * i + 1], a, b0, b1, halves);
      }
    }
  }
  __nv_bfloat16* dQ = bf(p.dq);
#pragma unroll
  for (int i = 0; i < 2 * kPairs; ++i) {
    const int q = q0 + w.part + kS * (i / 2);
    if (q >= npairs) break;
    const int col = q * 16 + (i % 2) * 8 + 2 * c;
    if (rA < nrows)
      *reinterpret_cast<uint32_t*>(dQ + ((int64_t(b) * p.sq + lr0 + rA) * p.H + h) * p.Dqk + col) =
          pack_bf16(dq[i][0], dq[i][1]);
    if (rB < nrows)
      *reinterpret_cast<uint32_t*>(dQ + ((int64_t(b) * p.sq + lr0 + rB) * p.H + h) * p.Dqk + col) =
          pack_bf16(dq[i][2], dq[i][3]);
  }
}

// dk and dv for kRows keys of one (b, kv head) and column group cg of [dk | dv]'s Dqk + Dv
// columns (all of them up to 576 + 512: one group): the keys' queries are [max(j0, q_row0),
// max doc_end - 1] within the local rows; heads of the group in order.
template <bool kWide>
__global__ void __launch_bounds__(AttnCudaTraits<kWide>::kBwdThreads)
    attn_bwd_dkdv_kernel(const AttnDenseParams p, const float* D, int ngroups, VecFlags vec, int stages, bool v_in_k) {
  using T = AttnCudaTraits<kWide>;
  using W = BwdWarp<kWide>;
  constexpr int kNt = W::kNt, kNs = W::kNs, kPairs = T::kDkdvPairs, kS = T::kBwdSplit;
  HMLA_DYNAMIC_SHARED(unsigned char, smem);
  // ldvk: the block's V rows' stride (its K rows' when the values are the keys' first columns).
  const int ldq = p.Dqk + T::kPad, ldv = p.Dv + T::kPad, ldt = T::kBk + T::kPad, ldvk = v_in_k ? ldq : ldv;
  const int stage_elems = T::kBk * (ldq + ldv);
  __nv_bfloat16* Ks = reinterpret_cast<__nv_bfloat16*>(smem);  // [kRows, Dqk] this block's keys
  __nv_bfloat16* Vs = v_in_k ? Ks : Ks + T::kRows * ldq;         // [kRows, Dv]
  __nv_bfloat16* Ps = Ks + T::kRows * ldq + (v_in_k ? 0 : T::kRows * ldv);  // [kRows, kBk]: P^T of the tile
  __nv_bfloat16* dSs = Ps + T::kRows * ldt;                      // [kRows, kBk]: dS^T
  __nv_bfloat16* stage0 = dSs + T::kRows * ldt;                  // stages x {Q [kBk, Dqk], dO [kBk, Dv]}
  __shared__ MaskRanges<T::kWarps> mr;

  const int ktiles = (p.s + T::kRows - 1) / T::kRows;
  const int ktile = ktiles - 1 - blockIdx.x;  // early keys have the most queries
  const int hk = blockIdx.y / ngroups, cg = blockIdx.y % ngroups, b = blockIdx.z;
  const int nqk = int(p.Dqk) / 16, npairs = nqk + int(p.Dv) / 16, q0 = cg * kPairs * kS;
  const int j0 = ktile * T::kRows, nkeys = min(T::kRows, int(p.s) - j0);
  const int32_t* ds = p.doc_start + int64_t(b) * p.s;
  const int32_t* de = p.doc_end + int64_t(b) * p.s;

  // Queries that see these keys: t in [j, doc_end[j] - 1], intersected with the local rows.
  // Each row tile's (its 16 keys') query range too: the mask policy of the other kernels, transposed.
  {
    const int j = j0 + threadIdx.x;
    const bool sees = int(threadIdx.x) < nkeys && ds[j] <= j;
    mr.fill(sees, j, sees ? de[j] - 1 : 0);
  }
  const __nv_bfloat16* kbase = bf(p.k) + b * p.k_bstride + hk * p.k_hstride;
  const __nv_bfloat16* vbase = bf(p.v) + b * p.v_bstride + hk * p.v_hstride;
  load_tile(Ks, ldq, kbase + int64_t(j0) * p.k_rstride, p.k_rstride, T::kRows, nkeys, p.Dqk, vec.k);
  if (!v_in_k) load_tile(Vs, ldv, vbase + int64_t(j0) * p.v_rstride, p.v_rstride, T::kRows, nkeys, p.Dv, vec.v);
  __syncthreads();
  const int64_t tmin = mr.lo > p.q_row0 ? int64_t(mr.lo) : p.q_row0;
  const int64_t tmax = mr.hi < p.q_row0 + p.sq - 1 ? int64_t(mr.hi) : p.q_row0 + p.sq - 1;

  const W w;
  const int lane = w.lane, c = w.c;
  const int64_t jA = j0 + w.m * 16 + w.g, jB = jA + 8;  // this thread's two keys
  const int wlo = mr.ulo[w.m], whi = mr.uhi[w.m];
  const float c2 = p.scale * kLog2e;
  float acc[2 * kPairs][4];
  zero_acc(acc);

  // The (head, query tile) pairs in order, heads of the group outer: tile i = (h0 + i / ntq, tmin +
  // (i % ntq) kBk). Its Q and dO tiles into stage st (cp.async; two stages overlap tile i + 1's
  // copies with tile i's products: pipeline_step).
  const int group = int(p.H / p.Hkv);
  const int ntq = tmin <= tmax ? int((tmax - tmin) / T::kBk + 1) : 0, ntiles = group * ntq;
  struct QueryTile {
    int h;
    int64_t t0;
    int nq;  // its queries: [t0, t0 + nq)
  };
  auto tile_of = [&](int i) {
    const int64_t t0 = tmin + int64_t(i % ntq) * T::kBk;
    return QueryTile{hk * group + i / ntq, t0, int(tmax + 1 - t0 < T::kBk ? tmax + 1 - t0 : T::kBk)};
  };
  auto issue = [&](int i, int st) {
    const QueryTile qt = tile_of(i);
    const int64_t lt0 = qt.t0 - p.q_row0;  // local row of the tile's first query
    __nv_bfloat16* Q = stage0 + st * stage_elems;
    load_tile_async(Q, ldq, bf(p.q) + b * p.q_bstride + qt.h * p.q_hstride + lt0 * p.q_rstride, p.q_rstride, T::kBk,
                    qt.nq, p.Dqk, vec.q);
    load_tile_async(Q + T::kBk * ldq, ldv, bf(p.dout) + ((int64_t(b) * p.sq + lt0) * p.H + qt.h) * p.Dv, p.H * p.Dv,
                    T::kBk, qt.nq, p.Dv, vec.o);
  };
  pipeline_start(stages, ntiles > 0, [&](int, int st) { issue(0, st); });
  for (int i = 0; i < ntiles; ++i) {
    const int st = pipeline_step(stages, i, i + 1 < ntiles, [&](int ahead, int sb) { issue(i + ahead, sb); });
    const auto [h, t0, nq] = tile_of(i);
    const int64_t lrow = (int64_t(b) * p.H + h) * p.sq;
    const __nv_bfloat16* Qs = stage0 + st * stage_elems;
    const __nv_bfloat16* dOs = Qs + T::kBk * ldq;

    // S^T = K Q^T and dP^T = V dO^T (rows: keys, columns: queries), then P^T and dS^T; query
    // tiles outside the row tile's range are masked for all its keys: no products, zeros.
    const uint32_t live = live_columns<kNt>(t0, wlo, whi), mine = w.mine(live);
    // Every key of the row tile seen by every query of the tile (t in [max j, min doc_end - 1],
    // all of them local rows): no per-element test, no doc_start read.
    const bool whole = nq == T::kBk && mr.whole(w.m, t0, T::kBk);
    float s[kNs][4], dp[kNs][4];
    zero_acc(s);
    zero_acc(dp);
    if (mine) {
      mma_abt_live<kNs, true>(s, Ks, ldq, w.m * 16, Qs + w.part * kNs * 8 * ldq, ldq, int(p.Dqk), lane, mine);
      mma_abt_live<kNs, true>(dp, Vs, ldvk, w.m * 16, dOs + w.part * kNs * 8 * ldv, ldv, int(p.Dv), lane, mine);
    }
#pragma unroll
    for (int nt = 0; nt < kNs; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qi = (w.part * kNs + nt) * 8 + 2 * c + (e & 1);
        const int64_t t = t0 + qi, j = e < 2 ? jA : jB;
        const bool ok = whole || (((mine >> nt) & 1u) && qi < nq && j < p.s && allowed(ds[t], t, j));
        const int64_t row = lrow + t - p.q_row0;
        const float pr = ok ? exp2f(s[nt][e] * c2 - p.lse[row] * kLog2e) : 0.f;
        s[nt][e] = pr;
        dp[nt][e] = ok ? pr * (dp[nt][e] - D[row]) * p.scale : 0.f;
      }
      w.store(Ps, ldt, nt, s[nt]);
      w.store(dSs, ldt, nt, dp[nt]);
    }
    __syncthreads();
    // dk += dS^T Q, dv += P^T dO over the row tile's live queries, 16 a step or 8 where half
    // a step is masked.
#pragma unroll 1
    for (int kt = 0; kt < kNt / 2; ++kt) {
      const uint32_t halves = (live >> (2 * kt)) & 3u;
      if (!halves) continue;
      uint32_t aP[4], aS[4];
      load_a(aP, Ps, ldt, w.m * 16, kt * 16, lane);
      load_a(aS, dSs, ldt, w.m * 16, kt * 16, lane);
#pragma unroll
      for (int i = 0; i < kPairs; ++i) {
        const int q = q0 + w.part + kS * i;
        if (q >= npairs) break;
        const bool is_dk = q < nqk;
        uint32_t a[4], b0[2], b1[2];
#pragma unroll
        for (int r = 0; r < 4; ++r) a[r] = is_dk ? aS[r] : aP[r];  // selects: a pointer would put them on the stack
        if (is_dk) load_b_kn_x2(b0, b1, Qs, ldq, kt * 16, q * 16, lane);
        else load_b_kn_x2(b0, b1, dOs, ldv, kt * 16, (q - nqk) * 16, lane);
        mma_k16_or_half(acc[2 * i], acc[2 * i + 1], a, b0, b1, halves);
      }
    }
  }
  // Keys no local query sees (and padding keys) get zeros, written like the rest.
#pragma unroll
  for (int i = 0; i < 2 * kPairs; ++i) {
    const int q = q0 + w.part + kS * (i / 2);
    if (q >= npairs) break;
    const bool is_dk = q < nqk;
    __nv_bfloat16* out = bf(is_dk ? p.dk : p.dv);
    const int64_t width = is_dk ? p.Dqk : p.Dv;
    const int col = (is_dk ? q : q - nqk) * 16 + (i % 2) * 8 + 2 * c;
    if (jA < j0 + nkeys)
      *reinterpret_cast<uint32_t*>(out + ((int64_t(b) * p.s + jA) * p.Hkv + hk) * width + col) =
          pack_bf16(acc[i][0], acc[i][1]);
    if (jB < j0 + nkeys)
      *reinterpret_cast<uint32_t*>(out + ((int64_t(b) * p.s + jB) * p.Hkv + hk) * width + col) =
          pack_bf16(acc[i][2], acc[i][3]);
  }
}

template <bool kWide>
void launch_bwd(const AttnDenseParams& p, const float* D, VecFlags vec) {
  using T = AttnCudaTraits<kWide>;
  cudaStream_t st = current_stream().get();
  // Values read from the keys' tiles when they are their first columns (the latent form); two
  // pipeline stages where they fit the smallest target's shared memory.
  const bool v_in_k = attn_v_in_k(p);
  if (p.sq > 0) {  // without query rows dq is empty, and dk/dv below come out zero
    const int stages = attn_bwd_dq_smem<kWide>(p.Dqk, p.Dv, 2, v_in_k) <= kAttnMaxSmemBytes ? 2 : 1;
    const size_t smem = size_t(attn_bwd_dq_smem<kWide>(p.Dqk, p.Dv, stages, v_in_k));
    const int per = T::kDqPairs * T::kBwdSplit * 16, ngroups = int((p.Dqk + per - 1) / per);
    check(cudaFuncSetAttribute(attn_bwd_dq_kernel<kWide>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
          "attn_dense_bwd dq: shared memory");
    dim3 grid(unsigned((p.sq + T::kRows - 1) / T::kRows), unsigned(p.H * ngroups), unsigned(p.b));
    HMLA_LAUNCH(attn_bwd_dq_kernel<kWide>, grid, T::kBwdThreads, smem, st, p, D, ngroups, vec, stages, v_in_k);
    check_launch("attn_dense_bwd dq");
  }
  {
    const int stages = attn_bwd_dkdv_smem<kWide>(p.Dqk, p.Dv, 2, v_in_k) <= kAttnMaxSmemBytes ? 2 : 1;
    const size_t smem = size_t(attn_bwd_dkdv_smem<kWide>(p.Dqk, p.Dv, stages, v_in_k));
    const int per = T::kDkdvPairs * T::kBwdSplit * 16, ngroups = int((p.Dqk + p.Dv + per - 1) / per);
    check(cudaFuncSetAttribute(attn_bwd_dkdv_kernel<kWide>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
          "attn_dense_bwd dkdv: shared memory");
    dim3 grid(unsigned((p.s + T::kRows - 1) / T::kRows), unsigned(p.Hkv * ngroups), unsigned(p.b));
    HMLA_LAUNCH(attn_bwd_dkdv_kernel<kWide>, grid, T::kBwdThreads, smem, st, p, D, ngroups, vec, stages, v_in_k);
    check_launch("attn_dense_bwd dkdv");
  }
}

}  // namespace

void launch_rowdot(const __nv_bfloat16* out, const __nv_bfloat16* dout, int64_t b, int64_t sq, int64_t H, int64_t Dv,
                   float* D) {
  if (b * sq * H == 0) return;
  HMLA_LAUNCH(rowdot_kernel, unsigned((b * sq * H * 32 + 255) / 256), 256, 0, current_stream().get(), out, dout, b * sq,
              sq, H, Dv, D);
  check_launch("attention backward: rowsum(dO * O)");
}

void launch_dsink(const float* lse, const float* D, const float* sink, int64_t b, int64_t sq, int64_t H, float* dsink) {
  HMLA_LAUNCH(dsink_kernel, unsigned(H), 256, 0, current_stream().get(), lse, D, sink, b, sq, H, dsink);
  check_launch("attention backward: dsink");
}

void attn_dense_bwd(const AttnDenseParams& p) {
  if (p.b == 0 || p.s == 0) return;
#ifdef HMLA_HAVE_CUDNN
  if (plan(Op::attn_dense_bwd, p).variant == Variant::cudnn && cudnn_attn_bwd(p)) return;  // else cuDNN refused the graph
#endif
  Tensor D = Tensor::empty({p.b, p.H, p.sq}, DType::f32, Device::cuda);
  launch_rowdot(bf(p.out), bf(p.dout), p.b, p.sq, p.H, p.Dv, D.data<float>());
  if (attn_is_wide(p)) launch_bwd<true>(p, D.data<float>(), vec_flags(p));
  else launch_bwd<false>(p, D.data<float>(), vec_flags(p));
  if (p.dsink) launch_dsink(p.lse, D.data<float>(), p.sink, p.b, p.sq, p.H, p.dsink);
  // D is freed (returned to the cache) when this returns; the stream orders its reuse.
}

}  // namespace hmla::cuda
