// Index tables as the sparse kernels walk them (DESIGN.md section 4: [b, sq, K + W] key positions,
// -1 = no key), shared by the sparse attention (attn_sparse_fwd.cu, attn_sparse_bwd.cu) and the sparse indexer KL
// (indexer_kl_sparse.cu):
//   bitonic_sort()  a row's keys sorted in shared memory (the table check, V4's selected entries);
//   compact()       a row's listed keys into shared memory, candidates (slots < K) first, then the
//                   window's, each in slot order, -1 slots dropped: the positions every kernel of
//                   a row numbers its keys by;
//   InverseIndex    for a chunk of rows, per key the (row, position) entries that list it, in row
//                   order, built on the device (sparse_index.cu), so a per-(row, position)
//                   contribution workspace reduces into per-key sums in a fixed order without
//                   float atomics (inverse_reduce).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "hmla/core/tensor.h"

namespace hmla::cuda {

// v[0, P) in shared memory sorted ascending in place (bitonic; P a power of two). All threads take
// part; starts and ends with a barrier.
__device__ __forceinline__ void bitonic_sort(int32_t* v, int P) {
  __syncthreads();
  for (int k = 2; k <= P; k *= 2)
    for (int jj = k / 2; jj > 0; jj /= 2) {
      for (int i = threadIdx.x; i < P; i += blockDim.x) {
        const int ixj = i ^ jj;
        if (ixj > i) {
          const int32_t a = v[i], b = v[ixj];
          if ((a > b) == ((i & k) == 0)) v[i] = b, v[ixj] = a;
        }
      }
      __syncthreads();
    }
}

// The row's listed keys among its first KW slots, candidates (slots < K) first, each in slot
// order; returns their count and sets *nc to the candidates'. All threads take part; ends with a
// barrier. (KW = K lists the candidates only.) Static: its __shared__ counters are each TU's own.
__device__ static inline int compact(const int32_t* row, int KW, int K, int32_t* list, int* nc) {
  __shared__ int warp_counts[32];
  __shared__ int total;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, nwarps = int(blockDim.x) / 32;
  if (tid == 0) total = 0;
  for (int pass = 0; pass < 2; ++pass) {
    const int begin = pass ? K : 0, end = pass ? KW : K;
    for (int base = begin; base < end; base += int(blockDim.x)) {
      __syncthreads();
      const int i = base + tid;
      const int32_t j = i < end ? row[i] : -1;
      const uint32_t ballot = __ballot_sync(0xffffffffu, j >= 0);
      if (lane == 0) warp_counts[warp] = __popc(ballot);
      __syncthreads();
      int pos = total + __popc(ballot & ((1u << lane) - 1u));
      int sum = 0;
      for (int w = 0; w < nwarps; ++w) {
        if (w < warp) pos += warp_counts[w];
        sum += warp_counts[w];
      }
      if (j >= 0) list[pos] = j;
      __syncthreads();
      if (tid == 0) total += sum;
    }
    __syncthreads();
    if (pass == 0 && tid == 0) *nc = total;
  }
  __syncthreads();
  return total;
}

// A [b, sq, KW] table's rows as listed: the first `listed` slots of each row (KW: candidates and
// window, the attention; K: candidates only, the KL), in compact() order. Keys index [b, skv].
struct TableRows {
  const int32_t* idx;
  int64_t b, sq, skv, KW, K, listed;
};

// The inverse index of a chunk of rows, on the device: for key k = batch * skv + j,
// entries[offsets[k] .. offsets[k + 1]) = local row * listed + position of every row of the chunk
// listing j, in row order (a row lists a key once: the contract). Built by three kernels queued on
// the current stream (sparse_index.cu); nothing crosses to the host.
struct InverseIndex {
  Tensor keys, nlist, counts, cursor, offsets, entries;
  InverseIndex(const TableRows& t, int64_t chunk_rows, const char* op);
  void build(const TableRows& t, int64_t r0, int64_t nr);  // rows [r0, r0 + nr), nr <= chunk_rows
};

// acc[key, :width] += sum over the index's entries of key, in order, of sum over hg < groups of
// ws[((local * groups + hg) * listed + position) * width + :width]: a chunk's per-(row, head group,
// position) contributions reduced per key, f32, deterministic.
void inverse_reduce(const InverseIndex& ix, const TableRows& t, const float* ws, int64_t width, int groups, float* acc,
                    const char* op);

}  // namespace hmla::cuda
