// The tables cuDNN's ragged (THD) SDPA runs on, made on the device from the layout's device form
// (no host round trip; the host supplies only the bound on the document count), and the
// conversions between its lse layout and hmla's. attn_cudnn.h says what each holds.
#include <cuda_bf16.h>

#include <cmath>

#include "attn_cudnn.h"
#include "runtime.h"

namespace hmla::cuda {

namespace {

constexpr int kTableThreads = 1024;

struct ThdStrides {
  int64_t b[kThdLayouts], r[kThdLayouts];  // per layout: batch-row and row strides in elements
};

// One block: each thread counts the documents of a contiguous slice of the b s tokens that hold a
// query row of the slice [r0, r1) (a start doc_start[t] == t with t < r1 and doc_end[t] > r0), an
// exclusive scan of the counts numbers them, and each writes its document's query and key lengths
// and offsets: the query-side layouts (q, out, dq, stats) at the document's first row in the
// slice, local to it; the key-side ones (k, v, dk, dv) at the document's first row. Then the
// padding entries and entry B: the end of the last document (offsets never decrease).
__global__ void __launch_bounds__(kTableThreads)
    thd_tables_kernel(const int32_t* ds, const int32_t* de, int64_t b, int64_t s, int64_t r0, int64_t r1,
                      ThdStrides st, int64_t B, int32_t* off, int32_t* len_q, int32_t* len_kv) {
  __shared__ int count[kTableThreads];
  __shared__ int64_t end[kThdLayouts];
  const int64_t n = b * s, per = (n + kTableThreads - 1) / kTableThreads;
  const int64_t i0 = min(n, int64_t(threadIdx.x) * per), i1 = min(n, i0 + per);
  const auto counted = [&](int64_t i) {
    const int64_t t = i % s;
    return ds[i] == t && t < r1 && de[i] > r0;
  };
  int c = 0;
  for (int64_t i = i0; i < i1; ++i) c += counted(i);
  count[threadIdx.x] = c;
  if (threadIdx.x < kThdLayouts) end[threadIdx.x] = 0;
  __syncthreads();
  if (threadIdx.x == 0) {
    int acc = 0;
    for (int k = 0; k < kTableThreads; ++k) {
      const int x = count[k];
      count[k] = acc;
      acc += x;
    }
    count[0] = acc;  // thread 0's own start is 0: the total goes where it read it
  }
  __syncthreads();
  const int total = count[0];
  __syncthreads();
  int d = threadIdx.x == 0 ? 0 : count[threadIdx.x];
  for (int64_t i = i0; i < i1; ++i) {
    if (!counted(i)) continue;
    const int64_t r = i / s, a = i % s, qa = max(a, r0), qe = min(int64_t(de[i]), r1);
    if (d < B) {
      len_q[d] = int32_t(qe - qa);
      len_kv[d] = int32_t(qe - a);
      for (int L = 0; L < kThdLayouts; ++L) {
        const bool query_side = L == kThdQ || L == kThdO || L == kThdDq || L == kThdStats;
        const int64_t row = query_side ? qa - r0 : a, rows = query_side ? qe - qa : qe - a;
        const int64_t o = r * st.b[L] + row * st.r[L];
        off[L * (B + 1) + d] = int32_t(o);
        if (d == total - 1) end[L] = o + rows * st.r[L];
      }
    }
    ++d;
  }
  __syncthreads();
  for (int64_t e = total + threadIdx.x; e <= B; e += kTableThreads) {
    if (e < B) len_q[e] = len_kv[e] = 0;
    for (int L = 0; L < kThdLayouts; ++L) off[L * (B + 1) + e] = int32_t(end[L]);
  }
}

// Over [b, H, sq]: local row l is global row r0 + l.
__global__ void stats_to_lse_kernel(const float* stats, const int32_t* ds, int64_t b, int64_t s, int64_t sq,
                                    int64_t r0, int64_t H, float* lse) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= b * H * sq) return;
  const int64_t r = i / (H * sq), h = i / sq % H, l = i % sq, t = r0 + l;
  lse[i] = ds[r * s + t] > t ? INFINITY : stats[(r * sq + l) * H + h];
}

__global__ void lse_to_stats_kernel(const float* lse, int64_t b, int64_t sq, int64_t H, float* stats) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= b * H * sq) return;
  const int64_t r = i / (H * sq), h = i / sq % H, l = i % sq;
  stats[(r * sq + l) * H + h] = lse[i];
}

// One block per row of x [b, rows, row_elems]; a block whose row no sequence covers zeroes it,
// every other returns at once. Query side (rows = sq): local row l, global r0 + l, is padding.
// Key side (rows = s): key j is padding, or no query of the slice [r0, r1) sees it (j >= r1, or
// its document ends by r0).
__global__ void zero_uncovered_rows_kernel(__nv_bfloat16* x, const int32_t* ds, const int32_t* de, int64_t s,
                                           int64_t rows, int64_t r0, int64_t r1, bool query_side, int64_t row_elems) {
  const int64_t row = blockIdx.x, bb = row / rows, l = row % rows;
  const int64_t t = query_side ? r0 + l : l, i = bb * s + t;
  const bool covered = ds[i] <= t && (query_side || (t < r1 && de[i] > r0));
  if (covered) return;
  for (int64_t e = threadIdx.x; e < row_elems; e += blockDim.x) x[row * row_elems + e] = __float2bfloat16(0.f);
}

unsigned blocks(int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }

}  // namespace

void cudnn_thd_tables(const AttnDenseParams& p, int64_t B, int32_t* tables) {
  ThdStrides st{};
  const int64_t s = p.s, sq = p.sq;
  const int64_t b[kThdLayouts] = {p.q_bstride, p.k_bstride, p.v_bstride, sq * p.H * p.Dv, sq * p.H * p.Dqk,
                                  s * p.Hkv * p.Dqk, s * p.Hkv * p.Dv, sq * p.H};
  const int64_t r[kThdLayouts] = {p.q_rstride, p.k_rstride, p.v_rstride, p.H * p.Dv, p.H * p.Dqk,
                                  p.Hkv * p.Dqk, p.Hkv * p.Dv, p.H};
  for (int L = 0; L < kThdLayouts; ++L) st.b[L] = b[L], st.r[L] = r[L];
  int32_t* len = tables + kThdLayouts * (B + 1);
  HMLA_LAUNCH(thd_tables_kernel, 1, kTableThreads, 0, current_stream().get(), p.doc_start, p.doc_end, p.b, s,
              p.q_row0, p.q_row0 + sq, st, B, tables, len, len + B);
  check_launch("cuDNN attention: document tables");
}

void cudnn_stats_to_lse(const AttnDenseParams& p, const float* stats) {
  HMLA_LAUNCH(stats_to_lse_kernel, blocks(p.b * p.H * p.sq, 256), 256, 0, current_stream().get(), stats, p.doc_start,
              p.b, p.s, p.sq, p.q_row0, p.H, p.lse);
  check_launch("cuDNN attention: lse from stats");
}

void cudnn_lse_to_stats(const AttnDenseParams& p, float* stats) {
  HMLA_LAUNCH(lse_to_stats_kernel, blocks(p.b * p.H * p.sq, 256), 256, 0, current_stream().get(), p.lse, p.b, p.sq,
              p.H, stats);
  check_launch("cuDNN attention: stats from lse");
}

void cudnn_zero_uncovered_rows(const AttnDenseParams& p, void* x, bool query_side, int64_t row_elems) {
  const int64_t rows = query_side ? p.sq : p.s;
  HMLA_LAUNCH(zero_uncovered_rows_kernel, unsigned(p.b * rows), 128, 0, current_stream().get(),
              static_cast<__nv_bfloat16*>(x), p.doc_start, p.doc_end, p.s, rows, p.q_row0, p.q_row0 + p.sq,
              query_side, row_elems);
  check_launch("cuDNN attention: uncovered rows");
}

}  // namespace hmla::cuda
