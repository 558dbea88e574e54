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

// One block: each thread counts the document starts (doc_start[t] == t) of a contiguous slice of
// the b s tokens, an exclusive scan of the counts numbers the documents, and each start writes its
// document's length and offsets. Then the padding entries and entry B: the end of the last
// document (offsets never decrease).
__global__ void __launch_bounds__(kTableThreads)
    thd_tables_kernel(const int32_t* ds, const int32_t* de, int64_t b, int64_t s, ThdStrides st, int64_t B,
                      int32_t* off, int32_t* len) {
  __shared__ int count[kTableThreads];
  __shared__ int64_t end[kThdLayouts];
  const int64_t n = b * s, per = (n + kTableThreads - 1) / kTableThreads;
  const int64_t i0 = min(n, int64_t(threadIdx.x) * per), i1 = min(n, i0 + per);
  int c = 0;
  for (int64_t i = i0; i < i1; ++i) c += ds[i] == i % s;
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
    const int64_t r = i / s, t = i % s;
    if (ds[i] != t) continue;
    if (d < B) {
      len[d] = de[i] - int32_t(t);
      for (int L = 0; L < kThdLayouts; ++L) {
        const int64_t o = r * st.b[L] + t * st.r[L];
        off[L * (B + 1) + d] = int32_t(o);
        if (d == total - 1) end[L] = o + (de[i] - t) * st.r[L];
      }
    }
    ++d;
  }
  __syncthreads();
  for (int64_t e = total + threadIdx.x; e <= B; e += kTableThreads) {
    if (e < B) len[e] = 0;
    for (int L = 0; L < kThdLayouts; ++L) off[L * (B + 1) + e] = int32_t(end[L]);
  }
}

__global__ void stats_to_lse_kernel(const float* stats, const int32_t* ds, int64_t b, int64_t s, int64_t H,
                                    float* lse) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= b * H * s) return;
  const int64_t r = i / (H * s), h = i / s % H, t = i % s;
  lse[i] = ds[r * s + t] > t ? INFINITY : stats[(r * s + t) * H + h];
}

__global__ void lse_to_stats_kernel(const float* lse, int64_t b, int64_t s, int64_t H, float* stats) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= b * H * s) return;
  const int64_t r = i / (H * s), h = i / s % H, t = i % s;
  stats[(r * s + t) * H + h] = lse[i];
}

// One block per row; a padding row's block zeroes it, every other returns at once.
__global__ void zero_padding_rows_kernel(__nv_bfloat16* x, const int32_t* ds, int64_t s, int64_t row_elems) {
  const int64_t row = blockIdx.x;
  if (ds[row] <= row % s) return;
  for (int64_t e = threadIdx.x; e < row_elems; e += blockDim.x) x[row * row_elems + e] = __float2bfloat16(0.f);
}

unsigned blocks(int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }

}  // namespace

void cudnn_thd_tables(const AttnDenseParams& p, int64_t B, int32_t* tables) {
  ThdStrides st{};
  const int64_t s = p.s;
  const int64_t b[kThdLayouts] = {p.q_bstride, p.k_bstride, p.v_bstride, s * p.H * p.Dv, s * p.H * p.Dqk,
                                  s * p.Hkv * p.Dqk, s * p.Hkv * p.Dv, s * p.H};
  const int64_t r[kThdLayouts] = {p.q_rstride, p.k_rstride, p.v_rstride, p.H * p.Dv, p.H * p.Dqk,
                                  p.Hkv * p.Dqk, p.Hkv * p.Dv, p.H};
  for (int L = 0; L < kThdLayouts; ++L) st.b[L] = b[L], st.r[L] = r[L];
  HMLA_LAUNCH(thd_tables_kernel, 1, kTableThreads, 0, current_stream().get(), p.doc_start, p.doc_end, p.b, s, st, B,
              tables, tables + kThdLayouts * (B + 1));
  check_launch("cuDNN attention: document tables");
}

void cudnn_stats_to_lse(const AttnDenseParams& p, const float* stats) {
  HMLA_LAUNCH(stats_to_lse_kernel, blocks(p.b * p.H * p.s, 256), 256, 0, current_stream().get(), stats, p.doc_start,
              p.b, p.s, p.H, p.lse);
  check_launch("cuDNN attention: lse from stats");
}

void cudnn_lse_to_stats(const AttnDenseParams& p, float* stats) {
  HMLA_LAUNCH(lse_to_stats_kernel, blocks(p.b * p.H * p.s, 256), 256, 0, current_stream().get(), p.lse, p.b, p.s,
              p.H, stats);
  check_launch("cuDNN attention: stats from lse");
}

void cudnn_zero_padding_rows(const AttnDenseParams& p, void* x, int64_t row_elems) {
  HMLA_LAUNCH(zero_padding_rows_kernel, unsigned(p.b * p.s), 128, 0, current_stream().get(),
              static_cast<__nv_bfloat16*>(x), p.doc_start, p.s, row_elems);
  check_launch("cuDNN attention: padding rows");
}

}  // namespace hmla::cuda
