// What the tensor-core kernels of DeepSeek-V4's attention core (attn_compressed_mma.cu, the forward
// and the row clean-up; attn_compressed_mma_bwd.cu, the backward) share: a query row's key list and
// the gather of its keys into a shared tile. A row's keys, in the order every kernel numbers them:
// positions [0, n_w) the window keys u0 + j (kv rows), then the entries: dense mode lo + (j - n_w)
// (one contiguous range: entry_range.cuh), selected mode list[j - n_w], the row's slots visible to
// it, sorted ascending, each entry once (sort_entries). Padding rows (doc_start > t) have no key.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "entry_range.cuh"
#include "hmla/ops/compressed_attention.h"
#include "mma.cuh"
#include "sparse_index.cuh"  // compact

namespace hmla::cuda {

// Local query row `row` (b * sq + local) of the call: its global position and its keys' geometry.
struct CompressedRow {
  int64_t bb, tl, t, st, u0, lo;
  int n_w, n_ent;  // window keys; entries (dense: the range's length; selected: set by the caller)
  __device__ CompressedRow(const AttnCompressedParams& p, int64_t row)
      : bb(row / p.sq), tl(row % p.sq), t(p.q_row0 + row % p.sq) {
    st = p.doc_start[bb * p.s + t];
    u0 = st > t - p.window + 1 ? st : t - p.window + 1;
    n_w = st > t ? 0 : int(t - u0 + 1);
    lo = 0, n_ent = 0;
    if (p.n_e > 0 && p.k == 0 && st <= t) {
      int64_t hi = 0;
      visible_entries(p.ent_doc + bb * p.n_e, p.ent_last + bb * p.n_e, p.n_e, st, t, lo, hi);
      n_ent = int(hi - lo);
    }
  }
};

// Where a row's keys live, in few registers (what the kernels keep over their key loop): row(j) is
// the bf16 row of key position j < n_w + n_ent; list: the selected mode's entries, else null.
struct RowKeys {
  const __nv_bfloat16 *win, *ent;  // the row's first window key; its first entry (dense) or entry 0
  const int32_t* list;
  int n_w;
  int64_t d;
  __device__ RowKeys(const AttnCompressedParams& p, const CompressedRow& r, const int32_t* lst)
      : win(static_cast<const __nv_bfloat16*>(p.kv) + (r.bb * p.s + r.u0) * p.d),
        ent(static_cast<const __nv_bfloat16*>(p.ent) + (r.bb * p.n_e + (lst ? 0 : r.lo)) * p.d),
        list(lst), n_w(r.n_w), d(p.d) {}
  __device__ const __nv_bfloat16* row(int j) const {
    if (j < n_w) return win + int64_t(j) * d;
    return ent + int64_t(list ? list[j - n_w] : j - n_w) * d;
  }
};

__device__ __forceinline__ int64_t lmin(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t lmax(int64_t a, int64_t b) { return a > b ? a : b; }
__device__ __forceinline__ int pow2_ceil(int64_t n) {  // CompressedMmaTraits::pow2_at_least on the device
  int r = 1;
  while (r < n) r *= 2;
  return r;
}

// The selected mode's entries of a row: its k slots that hold an entry visible to it, sorted
// ascending (bitonic, in shared memory), repeats dropped, compacted to the front of buf; returns
// their count. buf and tmp: pow2_at_least(k) int32 each. All threads take part; ends with a barrier.
// Static, as compact(): its __shared__ counter is each TU's own.
__device__ static inline int sort_entries(const AttnCompressedParams& p, int64_t row, const CompressedRow& r, int32_t* buf,
                                   int32_t* tmp) {
  const int P = pow2_ceil(p.k);
  const int32_t* slots = p.idx + row * p.k;
  const int32_t* doc = p.ent_doc + r.bb * p.n_e;
  const int32_t* last = p.ent_last + r.bb * p.n_e;
  for (int i = threadIdx.x; i < P; i += blockDim.x) {
    const int32_t e = i < p.k ? slots[i] : -1;
    const bool vis = e >= 0 && e < p.n_e && doc[e] == r.st && last[e] <= r.t;
    buf[i] = vis ? e : INT32_MAX;
  }
  bitonic_sort(buf, P);
  for (int i = threadIdx.x; i < P; i += blockDim.x)
    tmp[i] = buf[i] != INT32_MAX && (i == 0 || buf[i - 1] != buf[i]) ? buf[i] : -1;
  __shared__ int s_unused;
  return compact(tmp, P, P, buf, &s_unused);  // starts and ends with a barrier
}

// Rows [0, nrows) of a bf16 tile [nrows, dp] in shared memory (row stride ld): row r < valid is
// src(r)'s first d elements, zero-padded to dp; rows >= valid are zero. 16-byte accesses when `vec`
// (d a multiple of 8, every row 16-byte aligned). All threads of the block take part.
template <class Src>
__device__ __forceinline__ void load_rows(__nv_bfloat16* s, int ld, int nrows, int valid, int d, int dp, bool vec,
                                          Src src) {
  if (vec) {
    const int per_row = dp / 8;
    for (int i = threadIdx.x; i < nrows * per_row; i += blockDim.x) {
      const int r = i / per_row, c = (i % per_row) * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < valid && c < d) v = *reinterpret_cast<const uint4*>(src(r) + c), HMLA_COUNT_LOAD(16);
      *reinterpret_cast<uint4*>(s + r * ld + c) = v;
    }
  } else {
    const __nv_bfloat16 zero = __float2bfloat16(0.f);
    for (int i = threadIdx.x; i < nrows * dp; i += blockDim.x) {
      const int r = i / dp, c = i % dp;
      s[r * ld + c] = r < valid && c < d ? (HMLA_COUNT_LOAD(2), src(r)[c]) : zero;
    }
  }
}

// Host side (attn_compressed_mma.cu): whether the query rows (query_side) or the key and entry rows
// allow 16-byte loads; the selected mode's cleaned table of the local rows (clean_table_kernel):
// clean [b sq, k] their visible entries sorted, each once, then -1, count [b sq] their number.
bool compressed_rows_aligned(const AttnCompressedParams& p, bool query_side);
void attn_compressed_clean_table(const AttnCompressedParams& p, int32_t* clean, int32_t* count);

}  // namespace hmla::cuda
