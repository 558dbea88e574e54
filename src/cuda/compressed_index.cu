// The CSA indexer's scores and top-k over compressed entries on the GPU (hmla/ops/compressed_index.h).
// f32 qI and kI: the CPU's order (src/cpu/compressed_index.cpp), I(t, e) as the header's chain of
// fmaf, so the scores and the tables equal the CPU's bit for bit; simple SIMT kernels, correct rather
// than fast (bf16 inputs at widths the tensor cores do not take run them too, widened on load).
// bf16 qI and kI (nI and dI multiples of 16): the DSA indexer's tensor-core scores and exact radix
// selection (indexer_topk.cu, indexer_scores.cuh) over each row's visible entry range, rows in chunks
// whose scores fit TopkTraits::kWorkspaceBytes (never [s, n_e] at long s): f32 accumulation in the
// tensor cores' order, so the scores are not the CPU's bits (the registry's bf16 rows bound them).
//   topk    a grid of at most kMaxBlocks blocks walks the query rows; per row one thread per visible
//           entry writes its score into the block's slice of a [blocks, n_e] f32 scratch; when more
//           than K are visible, a radix select (8 passes of 8 bits, shared histograms) finds the
//           K-th smallest 64-bit key (descending I, then ascending e: all keys distinct), the keys
//           up to it are gathered into shared memory (in any order: the sort fixes it) and a
//           bitonic sort orders them. Scratch O(kMaxBlocks n_e); shared memory 8 nextpow2(min(K, n_e)).
//   scores  one block per query row, one thread per entry (tests and the KL: [b, sq, n_e]).
// Query rows at an offset (context parallelism): the kernels walk the sq local rows; the layout and
// the visibility read global position q_row0 + local row, as the CPU.
// Costs per row O(nI dI n) for the scores, O(8 n) for the select, O(K log^2 K) for the sort.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include <cmath>
#include <cstdint>
#include <string>

#include "cuda_kernels.h"
#include "entry_range.cuh"
#include "hmla/ops/compressed_index.h"
#include "indexer_scores.cuh"
#include "mma.cuh"  // HMLA_DYNAMIC_SHARED
#include "runtime.h"
#include "traits.h"

namespace hmla::cuda {

namespace {

// kThreads: one entry per thread per pass, a power of two for the bitonic sort's strides. kMaxBlocks:
// the rows in flight, so the scores' scratch is kMaxBlocks n_e floats whatever s is (two blocks per
// SM of an H100 and then some). kMaxK: the selected keys (8 bytes each) sort in 32 KB of shared
// memory, within the 48 KB every device gives without opting in.
struct CompressedIndexTraits {
  static constexpr int kThreads = 128;
  static constexpr int64_t kMaxBlocks = 256;
  static constexpr int64_t kMaxK = 4096;
};
static_assert((CompressedIndexTraits::kThreads & (CompressedIndexTraits::kThreads - 1)) == 0, "2^n threads");
static_assert(CompressedIndexTraits::kMaxK * 8 <= 48 * 1024, "the sort's keys within 48 KB of shared memory");
constexpr int kThreads = CompressedIndexTraits::kThreads;
using u64 = unsigned long long;

cudaStream_t stream() { return current_stream().get(); }

// Query row `row`'s visible entry range [lo, hi) (empty for padding rows), as the CPU finds it: row
// is local (of the sq query rows), its position t = q_row0 + row % sq global (the layout's).
__device__ void visible_range(const CompressedIndexParams& p, int64_t row, int64_t& lo, int64_t& hi) {
  const int64_t bb = row / p.sq, t = p.q_row0 + row % p.sq, st = p.doc_start[bb * p.s + t];
  lo = hi = 0;
  if (st > t || p.n_e == 0) return;
  visible_entries(p.ent_doc + bb * p.n_e, p.ent_last + bb * p.n_e, p.n_e, st, t, lo, hi);
}

// I(row, e) in the header's order.
__device__ float score(const CompressedIndexParams& p, int64_t row, int64_t e) {
  const bool bf = p.dtype == DType::bf16;
  const int64_t q = row * p.nI * p.dI, k = ((row / p.sq) * p.n_e + e) * p.dI;
  const float* w = p.w + row * p.nI;
  float I = 0.f;
  for (int64_t h = 0; h < p.nI; ++h) {
    float d = 0.f;
    for (int64_t c = 0; c < p.dI; ++c) d = fmaf(input_at(p.qI, q + h * p.dI + c, bf), input_at(p.kI, k + c, bf), d);
    I = fmaf(w[h], d > 0.f ? d : 0.f, I);
  }
  return I;
}

// The selection's order as one unsigned key, smaller first: descending I (-0 as +0), then ascending e.
__device__ u64 sort_key(float I, int64_t e) {
  if (I == 0.f) I = 0.f;
  uint32_t u = __float_as_uint(I);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // ascending in I
  return (u64(~u) << 32) | u64(uint32_t(e));
}

__global__ void __launch_bounds__(kThreads) topk_kernel(CompressedIndexParams p, float* scratch) {
  HMLA_DYNAMIC_SHARED(u64, keys);  // [nextpow2(min(K, n_e))]
  __shared__ unsigned hist[256];
  __shared__ u64 s_prefix;
  __shared__ unsigned s_rem, s_cnt;
  float* sc = scratch + int64_t(blockIdx.x) * p.n_e;
  for (int64_t row = blockIdx.x; row < p.b * p.sq; row += gridDim.x) {
    int64_t lo, hi;
    visible_range(p, row, lo, hi);
    const int64_t n = hi - lo, kk = n < p.K ? n : p.K;
    int32_t* out = p.idx + row * p.K;
    for (int64_t i = kk + threadIdx.x; i < p.K; i += kThreads) out[i] = -1;
    if (kk == 0) continue;  // block-uniform
    for (int64_t i = threadIdx.x; i < n; i += kThreads) sc[i] = score(p, row, lo + i);
    __syncthreads();
    u64 thr = ~u64(0);  // every key, unless more than K are visible
    if (n > p.K) {      // the K-th smallest key, 8 bits a pass from the top
      u64 prefix = 0, mask = 0;
      unsigned rem = unsigned(p.K);
      for (int shift = 56; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += kThreads) hist[i] = 0;
        __syncthreads();
        for (int64_t i = threadIdx.x; i < n; i += kThreads) {
          const u64 key = sort_key(sc[i], lo + i);
          if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1u);  // counts: order-free
        }
        __syncthreads();
        if (threadIdx.x == 0) {
          unsigned r = rem, dg = 0;
          while (hist[dg] < r) r -= hist[dg++];
          s_prefix = prefix | (u64(dg) << shift), s_rem = r;
        }
        __syncthreads();
        prefix = s_prefix, rem = s_rem, mask |= u64(255) << shift;
      }
      thr = prefix;
    }
    if (threadIdx.x == 0) s_cnt = 0;
    int64_t P = 1;
    while (P < kk) P <<= 1;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
      const u64 key = sort_key(sc[i], lo + i);
      if (key <= thr) keys[atomicAdd(&s_cnt, 1u)] = key;  // exactly kk of them, in any order
    }
    for (int64_t i = kk + threadIdx.x; i < P; i += kThreads) keys[i] = ~u64(0);
    __syncthreads();
    for (int64_t k = 2; k <= P; k <<= 1)  // bitonic sort, ascending; each pair has one owner i < i ^ j
      for (int64_t j = k >> 1; j > 0; j >>= 1) {
        for (int64_t i = threadIdx.x; i < P; i += kThreads) {
          const int64_t ij = i ^ j;
          if (ij <= i) continue;
          const u64 a = keys[i], c = keys[ij];
          if ((a > c) == ((i & k) == 0)) keys[i] = c, keys[ij] = a;
        }
        __syncthreads();
      }
    for (int64_t i = threadIdx.x; i < kk; i += kThreads) out[i] = int32_t(uint32_t(keys[i]));
    __syncthreads();  // sc and keys are the next row's
  }
}

__global__ void __launch_bounds__(kThreads) scores_kernel(CompressedIndexParams p) {
  const int64_t row = blockIdx.x;
  int64_t lo, hi;
  visible_range(p, row, lo, hi);
  float* out = p.scores + row * p.n_e;
  for (int64_t e = threadIdx.x; e < p.n_e; e += kThreads) out[e] = e >= lo && e < hi ? score(p, row, e) : -INFINITY;
}

int64_t next_pow2(int64_t n) {
  int64_t P = 1;
  while (P < n) P <<= 1;
  return P;
}

__global__ void fill_kernel(float* out, int64_t n, float v) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) out[i] = v;
}

// The tensor-core path (plan: Variant::mma): bf16 qI, kI with nI, dI multiples of kMmaK.
IndexKeys entry_keys(const CompressedIndexParams& p) {
  return IndexKeys{p.doc_start, p.s, true, p.ent_doc, p.ent_last, p.n_e};
}
bool aligned(const CompressedIndexParams& p) {
  return p.dI % 8 == 0 && reinterpret_cast<uintptr_t>(p.qI) % 16 == 0 && reinterpret_cast<uintptr_t>(p.kI) % 16 == 0;
}
const __nv_bfloat16* bf(const void* v) { return static_cast<const __nv_bfloat16*>(v); }

void topk_mma(const CompressedIndexParams& p) {
  const int64_t sq = p.sq, n_e = std::max<int64_t>(p.n_e, 1), rows_per_block = TopkTraits::kRowsPerBlock;
  const int64_t chunk = std::max(rows_per_block, std::min(sq, TopkTraits::kWorkspaceBytes / (4 * n_e)) /
                                                     rows_per_block * rows_per_block);
  Scratch<float> ws(chunk * n_e);
  const IndexKeys keys = entry_keys(p);
  for (int64_t bb = 0; bb < p.b; ++bb)
    for (int64_t r = 0; r < sq; r += chunk) {
      const int64_t n = std::min(chunk, sq - r);
      if (p.n_e > 0)
        launch_index_scores(bf(p.qI), bf(p.kI), p.w, keys, bb, sq, p.q_row0, int(p.nI), int(p.dI), r, n, aligned(p),
                            ws.get(), n_e, stream());
      launch_index_select(ws.get(), n_e, bb * sq + r, n, sq, p.q_row0, keys, int(p.K), 0, p.idx, stream());
    }
}

void scores_mma(const CompressedIndexParams& p) {
  const int64_t n = p.b * p.sq * p.n_e;
  HMLA_LAUNCH(fill_kernel, unsigned(std::min<int64_t>((n + 255) / 256, 4096)), 256, 0, stream(), p.scores, n, -INFINITY);
  check_launch("compressed_index_scores: -inf");
  for (int64_t bb = 0; bb < p.b; ++bb)
    launch_index_scores(bf(p.qI), bf(p.kI), p.w, entry_keys(p), bb, p.sq, p.q_row0, int(p.nI), int(p.dI), 0, p.sq,
                        aligned(p), p.scores + bb * p.sq * p.n_e, p.n_e, stream());
}

bool mma_fits(Op op, const CompressedIndexParams& p) {
  return p.dtype == DType::bf16 && p.nI % kMmaK == 0 && p.dI % kMmaK == 0 &&
         (op == Op::compressed_index_scores || p.K <= TopkTraits::kMaxK) &&
         index_scores_smem_bytes(p.nI, p.dI) <= TopkTraits::kMaxSmemBytes;
}

}  // namespace

void compressed_index_topk(const CompressedIndexParams& p) {
  const int64_t rows = p.b * p.sq;
  if (rows == 0) return;
  if (mma_fits(Op::compressed_index_topk, p)) return topk_mma(p);
  const int64_t blocks = rows < CompressedIndexTraits::kMaxBlocks ? rows : CompressedIndexTraits::kMaxBlocks;
  Scratch<float> sc(blocks * p.n_e);
  const int64_t P = next_pow2(p.K < p.n_e ? p.K : p.n_e);
  HMLA_LAUNCH(topk_kernel, unsigned(blocks), kThreads, size_t(P) * sizeof(u64), stream(), p, sc.get());
  check_launch("compressed_index_topk");
}

void compressed_index_scores(const CompressedIndexParams& p) {
  if (p.b * p.sq == 0 || p.n_e == 0) return;
  if (mma_fits(Op::compressed_index_scores, p)) return scores_mma(p);
  HMLA_LAUNCH(scores_kernel, unsigned(p.b * p.sq), kThreads, 0, stream(), p);
  check_launch("compressed_index_scores");
}

// The plan (cuda_kernels.h): bf16 qI, kI with nI and dI multiples of kMmaK, K up to
// TopkTraits::kMaxK and the scores' tiles within shared memory on the tensor cores; everything else
// SIMT (f32: the CPU's bits; bf16 widened), whose top-k's sort holds min(K, n_e) keys in shared
// memory; the scores' grid is a block per row.
Plan plan(Op op, const CompressedIndexParams& p) {
  if (p.b * p.sq >= (int64_t(1) << 31)) return {Variant::none, "compressed index: more than 2^31 query rows"};
  if (mma_fits(op, p)) return {Variant::mma, {}};
  if (op == Op::compressed_index_topk && (p.K < p.n_e ? p.K : p.n_e) > CompressedIndexTraits::kMaxK)
    return {Variant::none, "compressed index: K = " + std::to_string(p.K) + " above " +
                               std::to_string(CompressedIndexTraits::kMaxK) + " (the SIMT top-k's shared memory)"};
  return {Variant::simt, {}};
}

}  // namespace hmla::cuda
