// The inverse index of a chunk of an index table's rows, on the device, and the per-key reduction
// through it (sparse_index.cuh). A stable counting sort by key of the chunk's entries taken in
// (row, position) order, positions as compact() numbers them: for key k = batch * skv + j,
// entries[offsets[k] .. offsets[k + 1]) holds local row * listed + position of every row listing j,
// in row order (a row lists a key once: the contract). That is the order the host walk of earlier
// versions produced, so the reduction sums in the same order; nothing is copied to or from the host.
//   count   a block per row: the row compacted into keys[local row], its length into nlist,
//           counts[k] += 1 per listed key (integer atomics: the counts do not depend on the order);
//           O(nr listed) work, parallel over rows and slots.
//   scan    one block: offsets = the exclusive scan of counts, cursor = offsets, counts zeroed for
//           the next chunk; O(b skv / kIndexThreads + kIndexThreads) steps.
//   scatter a block per batch element of the chunk (keys of different elements are disjoint):
//           its rows in order, a barrier after each, the row's keys in parallel; within a row the
//           keys are distinct, so each key's cursor is bumped once per row and its entries land in
//           row order. O(nr_b) barrier steps of O(listed / kIndexThreads) each for the nr_b <= nr
//           rows of one element.
// The cursor is bumped with an atomic only so that a table breaking the contract (a duplicate in
// a row, unchecked) still writes inside entries.
#include "sparse_index.cuh"

#include <algorithm>

#include "hmla/core/error.h"
#include "mma.cuh"  // HMLA_DYNAMIC_SHARED
#include "runtime.h"

namespace hmla::cuda {

namespace {

constexpr int kIndexThreads = 256;

__global__ void __launch_bounds__(kIndexThreads)
    inverse_count_kernel(const TableRows t, int64_t r0, int32_t* keys, int32_t* nlist, int32_t* counts) {
  HMLA_DYNAMIC_SHARED(unsigned char, smem);
  int32_t* list = reinterpret_cast<int32_t*>(smem);  // [listed]
  __shared__ int s_nc;
  const int64_t local = blockIdx.x, row = r0 + local, base = (row / t.sq) * t.skv;
  const int n = compact(t.idx + row * t.KW, int(t.listed), int(t.K), list, &s_nc);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    keys[local * t.listed + i] = list[i];
    atomicAdd(counts + base + list[i], 1);
  }
  if (threadIdx.x == 0) nlist[local] = n;
}

__global__ void __launch_bounds__(kIndexThreads)
    inverse_scan_kernel(int32_t* counts, int64_t nkeys, int64_t* offsets, int32_t* cursor) {
  __shared__ int64_t part[kIndexThreads];
  const int tid = threadIdx.x;
  const int64_t per = (nkeys + kIndexThreads - 1) / kIndexThreads;
  const int64_t k0 = tid * per < nkeys ? tid * per : nkeys, k1 = k0 + per < nkeys ? k0 + per : nkeys;
  int64_t sum = 0;
  for (int64_t k = k0; k < k1; ++k) sum += counts[k];
  part[tid] = sum;
  __syncthreads();
  if (tid == 0) {
    int64_t run = 0;
    for (int i = 0; i < kIndexThreads; ++i) {
      const int64_t v = part[i];
      part[i] = run;
      run += v;
    }
    offsets[nkeys] = run;
  }
  __syncthreads();
  int64_t run = part[tid];
  for (int64_t k = k0; k < k1; ++k) {
    offsets[k] = run;
    cursor[k] = int32_t(run);
    run += counts[k];
    counts[k] = 0;
  }
}

__global__ void __launch_bounds__(kIndexThreads)
    inverse_scatter_kernel(const TableRows t, int64_t r0, int64_t nr, const int32_t* keys, const int32_t* nlist,
                           int32_t* cursor, int64_t* entries) {
  const int64_t bb = r0 / t.sq + blockIdx.x;
  const int64_t lo = bb * t.sq > r0 ? bb * t.sq - r0 : 0;
  const int64_t hi = (bb + 1) * t.sq < r0 + nr ? (bb + 1) * t.sq - r0 : nr;  // local rows [lo, hi)
  for (int64_t local = lo; local < hi; ++local) {
    const int n = nlist[local];
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const int64_t key = bb * t.skv + keys[local * t.listed + i];
      entries[atomicAdd(cursor + key, 1)] = local * t.listed + i;
    }
    __syncthreads();  // this row's cursor bumps before the next row's
  }
}

// acc[key] += the chunk's contributions to it, in the inverse index's (row, position) order, each
// summed over the row's head groups in order.
__global__ void inverse_reduce_kernel(const int64_t* offsets, const int64_t* entries, const float* ws, int64_t width,
                                      int64_t listed, int groups, float* acc) {
  const int64_t key = blockIdx.x, e0 = offsets[key], e1 = offsets[key + 1];
  if (e0 == e1) return;
  for (int64_t col = threadIdx.x; col < width; col += blockDim.x) {
    float a = acc[key * width + col];
    for (int64_t e = e0; e < e1; ++e) {
      const int64_t local = entries[e] / listed, pos = entries[e] % listed;
      for (int hg = 0; hg < groups; ++hg) a += ws[((local * groups + hg) * listed + pos) * width + col];
    }
    acc[key * width + col] = a;
  }
}

}  // namespace

InverseIndex::InverseIndex(const TableRows& t, int64_t chunk_rows, const char* op) {
  const int64_t nkeys = t.b * t.skv, slots = std::max<int64_t>(chunk_rows * t.listed, 1);
  HMLA_CHECK(slots < INT32_MAX, ShapeError, op, ": a chunk of ", chunk_rows, " rows of ", t.listed,
             " slots is more entries than the inverse index's int32 cursor holds");
  keys = Tensor::empty({slots}, DType::i32, Device::cuda);
  nlist = Tensor::empty({std::max<int64_t>(chunk_rows, 1)}, DType::i32, Device::cuda);
  counts = Tensor::empty({std::max<int64_t>(nkeys, 1)}, DType::i32, Device::cuda);
  cursor = Tensor::empty({std::max<int64_t>(nkeys, 1)}, DType::i32, Device::cuda);
  offsets = Tensor::empty({nkeys + 1}, DType::i64, Device::cuda);
  entries = Tensor::empty({slots}, DType::i64, Device::cuda);
  check(cudaMemsetAsync(counts.raw_data(), 0, counts.nbytes(), current_stream().get()), "cudaMemsetAsync");
}

void InverseIndex::build(const TableRows& t, int64_t r0, int64_t nr) {
  cudaStream_t st = current_stream().get();
  HMLA_LAUNCH(inverse_count_kernel, unsigned(nr), kIndexThreads, sizeof(int32_t) * t.listed, st, t, r0,
              keys.data<int32_t>(), nlist.data<int32_t>(), counts.data<int32_t>());
  check_launch("inverse index: count");
  HMLA_LAUNCH(inverse_scan_kernel, 1, kIndexThreads, 0, st, counts.data<int32_t>(), t.b * t.skv, offsets.data<int64_t>(),
              cursor.data<int32_t>());
  check_launch("inverse index: scan");
  const int64_t batches = (r0 + nr - 1) / t.sq - r0 / t.sq + 1;
  HMLA_LAUNCH(inverse_scatter_kernel, unsigned(batches), kIndexThreads, 0, st, t, r0, nr, keys.data<int32_t>(),
              nlist.data<int32_t>(), cursor.data<int32_t>(), entries.data<int64_t>());
  check_launch("inverse index: scatter");
}

void inverse_reduce(const InverseIndex& ix, const TableRows& t, const float* ws, int64_t width, int groups, float* acc,
                    const char* op) {
  if (t.b * t.skv == 0) return;
  HMLA_LAUNCH(inverse_reduce_kernel, unsigned(t.b * t.skv), 128, 0, current_stream().get(), ix.offsets.data<int64_t>(),
              ix.entries.data<int64_t>(), ws, width, t.listed, groups, acc);
  check_launch(op);
}

}  // namespace hmla::cuda
