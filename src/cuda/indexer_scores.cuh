// The lightning indexers' tensor-core scores and exact selection (indexer_topk.cu), shared by the
// DSA indexer over token keys (indexer_topk.cu, DESIGN.md section 5) and DeepSeek-V4's CSA indexer
// over compressed entries (compressed_index.cu, section 10). What differs is which keys a query row
// sees, one contiguous range [lo, hi) either way: IndexKeys.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "entry_range.cuh"

namespace hmla::cuda {

// Element i of an input held in f32 or, when bf, bf16, as f32 (bf16 widens exactly): the SIMT
// kernels' loads of the CSA indexer's qI, kI (and its KL's q, ent) in either dtype.
__device__ __forceinline__ float input_at(const void* base, int64_t i, bool bf) {
  return bf ? __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]) : static_cast<const float*>(base)[i];
}

// The keys of query row t (global) of batch row bb: DSA (!entries) the rows [doc_start[t], t]
// of its document; CSA its visible entries (ent_doc[e] == doc_start[t], ent_last[e] <= t), one range
// by binary search (entry_range.cuh). Padding rows (doc_start > t): none. n_keys: keys per batch
// row (s, or n_e), the stride of kI and of a score row.
struct IndexKeys {
  const int32_t* doc_start = nullptr;  // [b, s]
  int64_t s = 0;
  bool entries = false;               // CSA
  const int32_t* ent_doc = nullptr;   // CSA: [b, n_e]
  const int32_t* ent_last = nullptr;  // CSA: [b, n_e]
  int64_t n_keys = 0;
  __device__ void range(int64_t bb, int64_t t, int64_t& lo, int64_t& hi) const {
    const int64_t st = doc_start[bb * s + t];
    lo = hi = 0;
    if (st > t) return;
    if (!entries) {
      lo = st, hi = t + 1;
    } else if (n_keys > 0) {
      visible_entries(ent_doc + bb * n_keys, ent_last + bb * n_keys, n_keys, st, t, lo, hi);
    }
  }
};

// Scores I(t, j) = sum_h w[t, h] relu(qI[t, h] . kI[j]) of the local rows [r_begin, r_begin + nrows)
// of batch row bb (qI [b, sq, HI, DI] bf16, kI [b, n_keys, DI] bf16, w [b, sq, HI] f32; HI and DI
// multiples of 16) into ws[(row - r_begin) ld + j] for the row's keys j (nothing else is written),
// on mma.sync. vec: DI % 8 == 0 and qI, kI 16-byte aligned.
void launch_index_scores(const __nv_bfloat16* qI, const __nv_bfloat16* kI, const float* w, const IndexKeys& keys,
                         int64_t bb, int64_t sq, int64_t q_row0, int HI, int DI, int64_t r_begin, int64_t nrows,
                         bool vec, float* ws, int64_t ld, cudaStream_t st);

// The selection of rows [row0, row0 + nrows) of the b sq local rows from their scores (row row0 + i
// at scores + i ld, indexed by key): per row R = its keys [lo, hi) without the last W, the K of
// largest score by descending score (ties and -0 / +0: the smaller key first), then the last W keys
// ascending, then -1, into table [b sq, K + W]. K <= TopkTraits::kMaxK. Exact: given the same f32
// scores, the CPU's tables bit for bit.
void launch_index_select(const float* scores, int64_t ld, int64_t row0, int64_t nrows, int64_t sq, int64_t q_row0,
                         const IndexKeys& keys, int K, int W, int32_t* table, cudaStream_t st);

// The shared memory launch_index_scores asks for (the host checks it against the device's limit).
int64_t index_scores_smem_bytes(int64_t HI, int64_t DI);

}  // namespace hmla::cuda
