// The indexer's KLs with SIMT kernels, f32 math (f32 qI/kI or q/k, and the sparse KL where the
// tensor cores decline it; kl_rows/kl_keys; the algebra of docs/indexer.md): qI, kI of one type TI,
// q, k of one type TA, widened on load (exact, so bf16 inputs give the bits f32 tensors of the
// same values give; f32 inputs are never rounded to bf16 behind the caller's back).
//   rows  (one block per query row t): pass 1 finds lseI (and lseC per head, unless the
//         attention's lse stands in) over the row's keys; pass 2 walks the keys in tiles of
//         kTile, one key per thread, rebuilding I(t, j), P(t, j) and dI = g (Q - P); then the
//         tile's dI turns into dw (a thread per head) and dqI (a thread per (head, channel)),
//         summed over the tile's keys in order. kl(t) is a block sum.
//   keys  (one block per key j): walks the query rows that see j in tiles of kTile, one row per
//         thread, rebuilding the same dI(t, j) (dense: from the saved lseI/lseC; sparse: looked
//         up by binary search in row t's sorted candidates) and adds sum_t sum_h dS qI into dkI[j]
//         with a thread per channel. The rows of j's document are consecutive, so the walk stops
//         at the first tile without one.
// Workspace O(b s (H + 1)) for the dense KL (lseI, lseC, kl per row) and O(b s K) for the sparse
// one (each row's candidates sorted, with their dI). Limits: IndexerKlTraits (kMaxHI, kMaxH, kMaxK).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "cuda_kernels.h"
#include "indexer_kl.cuh"
#include "mma.cuh"  // HMLA_DYNAMIC_SHARED
#include "reduce.cuh"
#include "runtime.h"
#include "traits.h"

namespace hmla::cuda {

namespace {

using detail::Work;
using detail::widen;

constexpr int kTile = IndexerKlTraits::kTile;  // threads per block = keys (rows pass) or rows (keys pass) per tile

// Shared memory: S [HI, kTile] (the tile's scores per index head), dI [kTile], lC [H] (rows pass),
// then, for the sparse rows pass, the row's candidates [pow2 >= K].
size_t smem_bytes(const IndexerKlParams& p, int64_t cand) {
  return size_t(IndexerKlTraits::smem_bytes(p.HI, p.H, cand));  // the plan bounds it
}

__host__ __device__ int64_t pow2_at_least(int64_t n) {
  int64_t r = 1;
  while (r < n) r *= 2;
  return r;
}

// Element i of an input of element type T, as f32.
template <class T>
__device__ __forceinline__ float at(const void* p, int64_t i) {
  return widen(static_cast<const T*>(p)[i]);
}

// I(t, j) with the per-head scores S[h * kTile] of query row `row` (local, over b * sq) and key j.
template <class TI>
__device__ float score(const IndexerKlParams& p, int64_t row, int64_t bb, int64_t j, float* S) {
  const int64_t q = row * p.HI * p.DI, k = (bb * p.s + j) * p.DI;
  float I = 0.f;
  for (int64_t h = 0; h < p.HI; ++h) {
    float acc = 0.f;
    for (int64_t c = 0; c < p.DI; ++c) acc += at<TI>(p.qI, q + h * p.DI + c) * at<TI>(p.kI, k + c);
    S[h * kTile] = acc;
    I += p.w[row * p.HI + h] * (acc > 0.f ? acc : 0.f);
  }
  return I;
}

// The attention logit of head h between local row tl and key j.
template <class TA>
__device__ float logit(const IndexerKlParams& p, int64_t bb, int64_t tl, int64_t h, int64_t j) {
  const int64_t q = bb * p.q_bstride + tl * p.q_rstride + h * p.q_hstride;
  const int64_t k = bb * p.k_bstride + j * p.k_rstride + (h / (p.H / p.Hkv)) * p.k_hstride;
  float acc = 0.f;
  for (int64_t c = 0; c < p.Dqk; ++c) acc += at<TA>(p.q, q + c) * at<TA>(p.k, k + c);
  return p.scale * acc;
}

// P(t, j) = mean_h exp(l_h - lseC_h).
template <class TA>
__device__ float target_prob(const IndexerKlParams& p, int64_t bb, int64_t tl, int64_t j, const float* lC) {
  float P = 0.f;
  for (int64_t h = 0; h < p.H; ++h) P += expf(logit<TA>(p, bb, tl, h, j) - lC[h]);
  return P / float(p.H);
}

// log sum_i exp(v(i)) over i in [0, n), by every thread of the block (fixed partition and tree).
template <class F>
__device__ float block_lse(int64_t n, F v, float* red) {
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += kTile) m = fmaxf(m, v(i));
  const float M = block_max<kTile>(m, red);
  float z = 0.f;
  if (M > -INFINITY)
    for (int64_t i = threadIdx.x; i < n; i += kTile) z += expf(v(i) - M);
  const float Z = block_sum<kTile>(z, red);
  return Z > 0.f ? M + logf(Z) : INFINITY;
}

// Ascending bitonic sort of a[0, n) in shared memory, n a power of two.
__device__ void block_sort(int32_t* a, int64_t n) {
  for (int64_t k = 2; k <= n; k *= 2)
    for (int64_t jj = k / 2; jj > 0; jj /= 2) {
      for (int64_t i = threadIdx.x; i < n; i += kTile) {
        const int64_t o = i ^ jj;
        if (o <= i) continue;
        const bool up = (i & k) == 0;
        const int32_t x = a[i], y = a[o];
        if ((x > y) == up) a[i] = y, a[o] = x;
      }
      __syncthreads();
    }
}

// One block per query row (over b * sq). Dense: keys [doc_start[t], t]; sparse: the row's
// candidates (the table's first K slots), sorted ascending into the workspace.
template <bool kSparse, class TI, class TA>
__global__ void __launch_bounds__(kTile) kl_rows_kernel(IndexerKlParams p, Work ws) {
  HMLA_DYNAMIC_SHARED(float, smem);
  __shared__ float red[kTile];
  float* S = smem;                     // [HI, kTile]
  float* dIs = S + p.HI * kTile;       // [kTile]
  float* lC = dIs + kTile;             // [H]
  int32_t* cand = reinterpret_cast<int32_t*>(lC + p.H);  // sparse: [pow2 >= K]
  const int tid = threadIdx.x;
  const int64_t row = blockIdx.x, bb = row / p.sq, tl = row % p.sq, t = p.q_row0 + tl;
  float* dq = p.dqI + row * p.HI * p.DI;
  for (int64_t e = tid; e < p.HI * p.DI; e += kTile) dq[e] = 0.f;
  for (int64_t h = tid; h < p.HI; h += kTile) p.dw[row * p.HI + h] = 0.f;

  // The row's keys: key(i) for i in [0, n).
  int64_t n = 0, lo = 0;
  if (kSparse) {
    const int64_t P2 = pow2_at_least(p.K);
    for (int64_t i = tid; i < P2; i += kTile) {
      const int32_t j = i < p.K ? p.topk[row * (p.K + p.W) + i] : -1;
      cand[i] = j >= 0 ? j : INT_MAX;
    }
    __syncthreads();
    block_sort(cand, P2);
    int cnt = 0;
    for (int64_t i = tid; i < p.K; i += kTile) cnt += cand[i] != INT_MAX;
    n = block_sum<kTile>(cnt, reinterpret_cast<int*>(red));
    for (int64_t i = tid; i < p.K; i += kTile) {
      ws.sorted[row * p.K + i] = cand[i];
      ws.dI[row * p.K + i] = 0.f;
    }
  } else {
    lo = p.doc_start[bb * p.s + t];
    n = lo <= t ? t - lo + 1 : 0;
  }
  auto key = [&](int64_t i) -> int64_t { return kSparse ? int64_t(cand[i]) : lo + i; };
  if (n == 0) {  // an empty row: no loss, zero gradients
    if (tid == 0) ws.kl[row] = 0.f, ws.lseI[row] = INFINITY;
    return;
  }

  // Pass 1: lseC per head (the attention's lse when it is lseC), then lseI. A thread's scores go
  // to its own column of S, a scratch here.
  for (int64_t h = 0; h < p.H; ++h) {
    float l;
    if (!kSparse && p.lse_c) {
      l = p.lse_c[(bb * p.H + h) * p.sq + tl];
    } else {
      l = block_lse(n, [&](int64_t i) { return logit<TA>(p, bb, tl, h, key(i)); }, red);
    }
    if (tid == 0) lC[h] = l;
    if (tid == 0 && !kSparse) ws.lseC[row * p.H + h] = l;
  }
  const float lseI = block_lse(n, [&](int64_t i) { return score<TI>(p, row, bb, key(i), S + tid); }, red);
  if (tid == 0) ws.lseI[row] = lseI;
  __syncthreads();  // lC

  // Pass 2: tiles of keys, one per thread.
  const float g = p.coeff * p.row_weight[row];
  float kl = 0.f;
  for (int64_t i0 = 0; i0 < n; i0 += kTile) {
    const int64_t i = i0 + tid, nk = n - i0 < kTile ? n - i0 : kTile;
    float dI = 0.f;
    if (i < n) {
      const int64_t j = key(i);
      const float I = score<TI>(p, row, bb, j, S + tid), P = target_prob<TA>(p, bb, tl, j, lC);
      const float logq = I - lseI;
      if (P > 0.f) kl += P * (logf(P) - logq);
      dI = g * (expf(logq) - P);
      if (kSparse) ws.dI[row * p.K + i] = dI;
    } else {
      for (int64_t h = 0; h < p.HI; ++h) S[h * kTile + tid] = 0.f;
    }
    dIs[tid] = dI;
    __syncthreads();
    for (int64_t h = tid; h < p.HI; h += kTile) {  // dw[h] += sum_j dI relu(S)
      float acc = 0.f;
      for (int64_t c = 0; c < nk; ++c) acc += S[h * kTile + c] > 0.f ? dIs[c] * S[h * kTile + c] : 0.f;
      p.dw[row * p.HI + h] += acc;
    }
    for (int64_t e = tid; e < p.HI * p.DI; e += kTile) {  // dqI[h, c] += sum_j dS[h, j] kI[j, c]
      const int64_t h = e / p.DI, c = e % p.DI;
      const float wh = p.w[row * p.HI + h];
      float acc = 0.f;
      for (int64_t x = 0; x < nk; ++x)
        if (S[h * kTile + x] > 0.f)
          acc += dIs[x] * wh * at<TI>(p.kI, (bb * p.s + key(i0 + x)) * p.DI + c);
      dq[e] += acc;
    }
    __syncthreads();
  }
  kl = block_sum<kTile>(kl, red);
  if (tid == 0) ws.kl[row] = kl;
}

// Position of j in the ascending list a[0, n), or -1.
__device__ int64_t find(const int32_t* a, int64_t n, int64_t j) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (a[mid] < j) lo = mid + 1;
    else hi = mid;
  }
  return lo < n && a[lo] == j ? lo : -1;
}

// One block per key (over b * s): dkI[j] = sum over the rows t that see j of sum_h dS(t, h, j) qI[t, h].
template <bool kSparse, class TI, class TA>
__global__ void __launch_bounds__(kTile) kl_keys_kernel(IndexerKlParams p, Work ws) {
  HMLA_DYNAMIC_SHARED(float, smem);
  __shared__ float red[kTile];
  __shared__ int64_t rows[kTile];
  float* S = smem;                // [HI, kTile]
  float* dIs = S + p.HI * kTile;  // [kTile]
  const int tid = threadIdx.x;
  const int64_t bb = blockIdx.x / p.s, j = blockIdx.x % p.s;
  float* dk = p.dkI + int64_t(blockIdx.x) * p.DI;
  for (int64_t c = tid; c < p.DI; c += kTile) dk[c] = 0.f;
  const int64_t first = j > p.q_row0 ? j : p.q_row0, end = p.q_row0 + p.sq;
  for (int64_t t0 = first; t0 < end; t0 += kTile) {
    const int64_t t = t0 + tid, tl = t - p.q_row0, row = bb * p.sq + tl;
    float dI = 0.f;
    const bool in_doc = t < end && p.doc_start[bb * p.s + t] <= j;  // t >= j by the walk
    bool sees = in_doc;
    if (sees) {
      const float I = score<TI>(p, row, bb, j, S + tid);
      if (kSparse) {
        const int64_t at = find(ws.sorted + row * p.K, p.K, j);
        sees = at >= 0;
        dI = sees ? ws.dI[row * p.K + at] : 0.f;
      } else {
        const float P = target_prob<TA>(p, bb, tl, j, ws.lseC + row * p.H);
        dI = p.coeff * p.row_weight[row] * (expf(I - ws.lseI[row]) - P);
      }
    }
    if (!sees)
      for (int64_t h = 0; h < p.HI; ++h) S[h * kTile + tid] = 0.f;
    dIs[tid] = dI;
    rows[tid] = row;
    const int any = block_sum<kTile>(int(in_doc), reinterpret_cast<int*>(red));
    if (any == 0) break;  // past j's document: no later row sees j
    const int64_t nt = end - t0 < kTile ? end - t0 : kTile;
    for (int64_t c = tid; c < p.DI; c += kTile) {
      float acc = 0.f;
      for (int64_t x = 0; x < nt; ++x) {
        if (dIs[x] == 0.f) continue;
        const int64_t q = rows[x] * p.HI * p.DI;
        for (int64_t h = 0; h < p.HI; ++h)
          if (S[h * kTile + x] > 0.f) acc += dIs[x] * p.w[rows[x] * p.HI + h] * at<TI>(p.qI, q + h * p.DI + c);
      }
      dk[c] += acc;
    }
    __syncthreads();
  }
}

template <bool kSparse, class TI, class TA>
void run_kl(const IndexerKlParams& p) {
  const int64_t rows = p.b * p.sq;
  Scratch<float> lseI(rows), lseC(kSparse ? 1 : rows * p.H), kl(rows);
  Scratch<int32_t> sorted(kSparse ? rows * p.K : 1);
  Scratch<float> dI(kSparse ? rows * p.K : 1);
  const Work ws{lseI.get(), lseC.get(), kl.get(), sorted.get(), dI.get()};
  cudaStream_t st = current_stream().get();
  if (p.b * p.s > 0) {  // every key's dkI, zero where no row sees it
    const size_t smem = smem_bytes(p, 0);
    auto* kernel = kl_keys_kernel<kSparse, TI, TA>;
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)), "indexer KL smem");
    if (rows > 0) {
      const size_t rsmem = smem_bytes(p, kSparse ? pow2_at_least(p.K) : 0);
      auto* rk = kl_rows_kernel<kSparse, TI, TA>;
      check(cudaFuncSetAttribute(rk, cudaFuncAttributeMaxDynamicSharedMemorySize, int(rsmem)), "indexer KL smem");
      HMLA_LAUNCH(rk, unsigned(rows), kTile, rsmem, st, p, ws);
      check_launch("indexer KL rows");
    }
    HMLA_LAUNCH(kernel, unsigned(p.b * p.s), kTile, smem, st, p, ws);
    check_launch("indexer KL keys");
  }
  detail::kl_sum(p, kl.get(), rows);
}

// The instantiation for the inputs' element types (the plan: f32 or bf16 each).
template <bool kSparse, class TI>
void run_kl_qk(const IndexerKlParams& p) {
  if (p.qk_dtype == DType::bf16) run_kl<kSparse, TI, __nv_bfloat16>(p);
  else run_kl<kSparse, TI, float>(p);
}

}  // namespace

template <bool kSparse>
void detail::kl_simt(const IndexerKlParams& p) {
  if (p.dtype == DType::bf16) run_kl_qk<kSparse, __nv_bfloat16>(p);
  else run_kl_qk<kSparse, float>(p);
}
template void detail::kl_simt<false>(const IndexerKlParams&);
template void detail::kl_simt<true>(const IndexerKlParams&);

}  // namespace hmla::cuda
