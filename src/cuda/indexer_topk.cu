// The lightning indexer's selection on the GPU (DESIGN.md section 5), and its kernels for the CSA
// indexer over compressed entries (indexer_scores.cuh: a row's keys are one range [lo, hi) either
// way: DSA [doc_start[t], t], CSA the row's visible entries).
//
// Scores: I(t, j) = sum_h w[t, h] relu(qI[t, h] . kI[j]) for the row's keys j, bf16 qI/kI
// and f32 w, on mma.sync. A block is 4 warps = 4 consecutive query rows sharing key tiles of 64;
// a warp runs its row's HI heads 16 at a time and reduces relu * w over the heads in registers
// (quad shuffles), so the [HI, keys] products never leave the SM. Rows go through in chunks whose
// scores fit a workspace of at most kWorkspaceBytes: never the [s, s] matrix at long s.
//
// Selection: one block per row, exact. Scores map to order-preserving 32-bit keys (-0 taken as +0,
// as the CPU's float compare does); four 8-bit radix passes find the K-th largest key T among
// R(t) (the row's keys without the last W); the keys above T and the first K - #above keys equal to T in ascending j are kept (ties
// to the smaller j); a bitonic sort orders them by (score desc, j asc); then the window and -1.
// Given the same f32 scores this is the CPU's table bit for bit.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "cuda_kernels.h"
#include "indexer_scores.cuh"
#include "mma.cuh"
#include "runtime.h"
#include "traits.h"

namespace hmla::cuda {

namespace {

constexpr int kSelThreads = TopkTraits::kSelThreads, kMaxK = TopkTraits::kMaxK;
constexpr int64_t kWorkspaceBytes = TopkTraits::kWorkspaceBytes;
constexpr int kRowsPerBlock = TopkTraits::kRowsPerBlock, kKeyTile = TopkTraits::kKeyTile, kPad = TopkTraits::kPad;

__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f == 0.f ? 0.f : f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Sorts ascending as (descending score, ascending j).
__device__ __forceinline__ uint64_t sort_key(uint32_t key, int64_t j) {
  return (uint64_t(~key) << 32) | uint64_t(uint32_t(j));
}

// One block per query row. I points at the row's scores (indexed by key position j); out at its
// [K + W] table row; t is the row's global position, [lo, hi) its keys.
__global__ void __launch_bounds__(kSelThreads)
    select_kernel(const float* scores, int64_t ld, int64_t row0, int64_t sq, int64_t q_row0, const IndexKeys keys,
                  int K, int W, int32_t* table) {
  __shared__ uint64_t sel[kMaxK];
  __shared__ uint32_t hist[256];
  __shared__ uint32_t s_prefix, s_mask, s_need, s_count, s_taken;
  __shared__ int warp_counts[kSelThreads / 32];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t row = row0 + blockIdx.x;  // over b * sq
  const int64_t bb = row / sq, t = q_row0 + row % sq;
  const float* I = scores + int64_t(blockIdx.x) * ld;
  int32_t* out = table + row * (K + W);
  for (int i = tid; i < K + W; i += kSelThreads) out[i] = -1;
  __syncthreads();  // the -1 fill before any thread writes a key over it
  int64_t lo, hi;
  keys.range(bb, t, lo, hi);
  if (lo >= hi) return;  // padding, or no key: all -1
  const int64_t r_end = lo > hi - W ? lo : hi - W;  // R(t) = [lo, r_end), the window [r_end, hi)
  for (int64_t j = r_end + tid; j < hi; j += kSelThreads) out[K + (j - r_end)] = int32_t(j);
  const int64_t n = r_end - lo;
  int m = 0;  // entries of sel
  if (n <= K) {
    for (int64_t j = lo + tid; j < r_end; j += kSelThreads) sel[j - lo] = sort_key(order_key(I[j]), j);
    m = int(n);
  } else {
    if (tid == 0) s_prefix = 0, s_mask = 0, s_need = uint32_t(K);
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = tid; i < 256; i += kSelThreads) hist[i] = 0;
      __syncthreads();
      const uint32_t prefix = s_prefix, mask = s_mask;
      for (int64_t j = lo + tid; j < r_end; j += kSelThreads) {
        const uint32_t k = order_key(I[j]);
        if ((k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 255u], 1u);
      }
      __syncthreads();
      if (tid == 0) {  // the digit holding the need-th largest key, from the top
        uint32_t above = 0;
        int d = 255;
        for (; d > 0; --d) {
          if (above + hist[d] >= s_need) break;
          above += hist[d];
        }
        s_need -= above;
        s_prefix |= uint32_t(d) << shift;
        s_mask |= 255u << shift;
      }
      __syncthreads();
    }
    const uint32_t T = s_prefix, need = s_need;  // keep every key > T and `need` keys == T
    const uint32_t above = uint32_t(K) - need;
    if (tid == 0) s_count = 0, s_taken = 0;
    __syncthreads();
    for (int64_t j = lo + tid; j < r_end; j += kSelThreads) {
      const uint32_t k = order_key(I[j]);
      if (k > T) sel[atomicAdd(&s_count, 1u)] = sort_key(k, j);
    }
    for (int64_t base = lo; base < r_end; base += kSelThreads) {  // ties in ascending j
      __syncthreads();
      if (s_taken >= need) break;  // uniform: read after the barrier
      const int64_t j = base + tid;
      const bool eq = j < r_end && order_key(I[j]) == T;
      const uint32_t ballot = __ballot_sync(0xffffffffu, eq);
      if (lane == 0) warp_counts[warp] = __popc(ballot);
      __syncthreads();
      uint32_t pos = s_taken + __popc(ballot & ((1u << lane) - 1u));
      uint32_t total = 0;
      for (int w = 0; w < kSelThreads / 32; ++w) {
        if (w < warp) pos += warp_counts[w];
        total += warp_counts[w];
      }
      if (eq && pos < need) sel[above + pos] = sort_key(T, j);
      __syncthreads();
      if (tid == 0) s_taken += total;
    }
    m = K;
  }
  // Bitonic sort of sel[0, P) ascending, P the power of two >= m, padded with the largest key.
  int P = 1;
  while (P < m) P *= 2;
  __syncthreads();
  for (int i = m + tid; i < P; i += kSelThreads) sel[i] = ~uint64_t(0);
  __syncthreads();
  for (int k = 2; k <= P; k *= 2)
    for (int jj = k / 2; jj > 0; jj /= 2) {
      for (int i = tid; i < P; i += kSelThreads) {
        const int ixj = i ^ jj;
        if (ixj > i) {
          const uint64_t a = sel[i], b = sel[ixj];
          if ((a > b) == ((i & k) == 0)) sel[i] = b, sel[ixj] = a;
        }
      }
      __syncthreads();
    }
  for (int i = tid; i < m; i += kSelThreads) out[i] = int32_t(uint32_t(sel[i]));
}

// Scores of rows [r_begin, r_begin + nrows) (local rows of batch row b_idx) into ws[row - r_begin, j]
// (row stride ld) for each row's keys j in [lo, hi).
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    scores_kernel(const __nv_bfloat16* qI, const __nv_bfloat16* kI, const float* w, const IndexKeys keys, int64_t b_idx,
                  int64_t sq, int64_t q_row0, int HI, int DI, int64_t r_begin, int64_t nrows, bool vec, float* ws,
                  int64_t ld) {
  HMLA_DYNAMIC_SHARED(unsigned char, smem);
  const int ldq = DI + kPad;
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem);  // [kRowsPerBlock * HI, DI]
  __nv_bfloat16* Ks = Qs + kRowsPerBlock * HI * ldq;            // [kKeyTile, DI]
  __shared__ int range[2];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int64_t lr = r_begin + int64_t(blockIdx.x) * kRowsPerBlock;  // first local row of the block
  const int rows = int(r_begin + nrows - lr < kRowsPerBlock ? r_begin + nrows - lr : kRowsPerBlock);
  if (threadIdx.x == 0) range[0] = INT32_MAX, range[1] = -1;
  __syncthreads();
  int64_t lo = 0, hi = 0;  // this thread's row's keys (thread < rows), then this warp's row's
  if (threadIdx.x < rows) {
    keys.range(b_idx, q_row0 + lr + threadIdx.x, lo, hi);
    if (lo < hi) {
      atomicMin(&range[0], int(lo));
      atomicMax(&range[1], int(hi - 1));
    }
  }
  load_tile(Qs, ldq, qI + (b_idx * sq + lr) * HI * DI, DI, kRowsPerBlock * HI, rows * HI, DI, vec);
  __syncthreads();
  const int jmin = range[0], jmax = range[1];
  lo = hi = 0;
  if (warp < rows) keys.range(b_idx, q_row0 + lr + warp, lo, hi);
  const bool live = lo < hi;
  const float* wt = w + (b_idx * sq + lr + warp) * HI;
  float* out = ws + (lr + warp - r_begin) * ld;
  for (int j0 = jmin; j0 <= jmax; j0 += kKeyTile) {
    const int nk = min(kKeyTile, jmax + 1 - j0);
    __syncthreads();
    load_tile(Ks, ldq, kI + (b_idx * keys.n_keys + j0) * DI, DI, kKeyTile, nk, DI, vec);
    __syncthreads();
    if (!live || j0 >= hi || j0 + kKeyTile <= lo) continue;
    for (int half = 0; half < kKeyTile / 32; ++half) {
      float part[4][2];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) part[nt][0] = part[nt][1] = 0.f;
      for (int mt = 0; mt < HI / 16; ++mt) {  // 16 heads at a time
        float acc[4][4];
        zero_acc(acc);
        mma_abt(acc, Qs + warp * HI * ldq, ldq, mt * 16, Ks + half * 32 * ldq, ldq, DI, lane);
        const float wa = wt[mt * 16 + g], wb = wt[mt * 16 + g + 8];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          part[nt][0] += wa * fmaxf(acc[nt][0], 0.f) + wb * fmaxf(acc[nt][2], 0.f);
          part[nt][1] += wa * fmaxf(acc[nt][1], 0.f) + wb * fmaxf(acc[nt][3], 0.f);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float v = part[nt][e];  // sum over the 8 lanes sharing c: every head
          v += __shfl_xor_sync(0xffffffffu, v, 4);
          v += __shfl_xor_sync(0xffffffffu, v, 8);
          v += __shfl_xor_sync(0xffffffffu, v, 16);
          const int64_t j = j0 + half * 32 + nt * 8 + 2 * c + e;
          if (g == 0 && j >= lo && j < hi) out[j] = v;
        }
    }
  }
}

}  // namespace

int64_t index_scores_smem_bytes(int64_t HI, int64_t DI) {
  return int64_t(sizeof(__nv_bfloat16)) * (kRowsPerBlock * HI + kKeyTile) * (DI + kPad);
}

void launch_index_scores(const __nv_bfloat16* qI, const __nv_bfloat16* kI, const float* w, const IndexKeys& keys,
                         int64_t bb, int64_t sq, int64_t q_row0, int HI, int DI, int64_t r_begin, int64_t nrows,
                         bool vec, float* ws, int64_t ld, cudaStream_t st) {
  if (nrows == 0) return;
  const size_t smem = size_t(index_scores_smem_bytes(HI, DI));
  check(cudaFuncSetAttribute(scores_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
        "indexer scores: shared memory");
  HMLA_LAUNCH(scores_kernel, unsigned((nrows + kRowsPerBlock - 1) / kRowsPerBlock), 32 * kRowsPerBlock, smem, st, qI,
              kI, w, keys, bb, sq, q_row0, HI, DI, r_begin, nrows, vec, ws, ld);
  check_launch("indexer scores");
}

void launch_index_select(const float* scores, int64_t ld, int64_t row0, int64_t nrows, int64_t sq, int64_t q_row0,
                         const IndexKeys& keys, int K, int W, int32_t* table, cudaStream_t st) {
  if (nrows == 0) return;
  HMLA_LAUNCH(select_kernel, unsigned(nrows), kSelThreads, 0, st, scores, ld, row0, sq, q_row0, keys, K, W, table);
  check_launch("indexer select");
}

void indexer_select(const IndexerTopkParams& p) {
  const IndexKeys keys{p.doc_start, p.s, false, nullptr, nullptr, p.s};
  launch_index_select(p.scores, p.s, 0, p.b * p.sq, p.sq, p.q_row0, keys, int(p.K), int(p.W), p.table,
                      current_stream().get());
}

void indexer_topk(const IndexerTopkParams& p) {
  const int64_t b = p.b, sq = p.sq, s = p.s;
  if (b * sq == 0) return;
  const int64_t chunk = std::max<int64_t>(kRowsPerBlock, std::min<int64_t>(sq, kWorkspaceBytes / (4 * s)) /
                                                             kRowsPerBlock * kRowsPerBlock);
  Tensor ws = Tensor::empty({chunk, s}, DType::f32, Device::cuda);
  cudaStream_t st = current_stream().get();
  const bool vec = p.DI % 8 == 0 && reinterpret_cast<uintptr_t>(p.qI) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(p.kI) % 16 == 0;
  const IndexKeys keys{p.doc_start, s, false, nullptr, nullptr, s};
  for (int64_t bb = 0; bb < b; ++bb)
    for (int64_t r = 0; r < sq; r += chunk) {
      const int64_t n = std::min(chunk, sq - r);
      launch_index_scores(static_cast<const __nv_bfloat16*>(p.qI), static_cast<const __nv_bfloat16*>(p.kI), p.w, keys,
                          bb, sq, p.q_row0, int(p.HI), int(p.DI), r, n, vec, ws.data<float>(), s, st);
      launch_index_select(ws.data<float>(), s, bb * sq + r, n, sq, p.q_row0, keys, int(p.K), int(p.W), p.table, st);
    }
}

// The plan (cuda_kernels.h): K up to kMaxK; the selection from given f32 scores any widths (SIMT),
// the scores on the tensor cores from bf16 qI, kI with HI and DI multiples of kMmaK.
Plan plan(Op op, const IndexerTopkParams& p) {
  if (p.K > TopkTraits::kMaxK) return {};
  if (op == Op::indexer_select) return {Variant::simt, {}};
  return plan_if(p.dtype == DType::bf16 && p.HI % kMmaK == 0 && p.DI % kMmaK == 0, Variant::mma);
}

}  // namespace hmla::cuda
