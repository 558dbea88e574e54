// DeepSeek-V4's attention core backward on the tensor cores (bf16 in and out, f32 accumulation;
// hmla/ops/compressed_attention.h, docs/v4_attention.md), the sparse backward's scheme
// (attn_sparse_bwd.cu) over a row's own key list (attn_compressed_mma.cuh):
//   D[h] = rowsum(dO_h * O_h);  P = exp(z - lse);  dS = P (dP - D) scale with dP = dO_h . key_j
//   dq_h = sum_j dS[h, j] key_j;  dkey_j = sum over (row, h) attending j of dS[h, j] q_h + P[h, j] dO_h
// Kernel bwd: a block per (query row, group of kBwdHeads heads) walks the row's keys in tiles of
// kBwdKeys: S and dP once per tile over the whole width, P and dS through shared memory, dq in
// registers over the whole list, and the tile's key gradients dS^T Q + P^T dO summed over the
// group's heads written to a workspace per (row, group, key position): ws_w for the window's
// positions (u - u0), ws_e for the entries'. No float atomics: three reductions add a chunk's
// contributions per key in a fixed order into f32 accumulators:
//   window key u   the rows t in [u, u + W) of u's document (the call's rows), t ascending, at
//                  position u - max(doc_start, t - W + 1);
//   dense entry e  the rows t from ent_last[e] to its document's end, t ascending, at position
//                  n_w(t) + e - (the document's first entry);
//   selected e     the rows whose cleaned slots hold e, by the inverse index of sparse_index.cuh
//                  built over the cleaned table (sorted, each entry once), in row order.
// Each sum runs over the head groups in order. Chunks of rows (the workspace's budget) go in order.
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <optional>

#include "attn_compressed_mma.cuh"
#include "attn_dense.cuh"  // bf, kLog2e, launch_rowdot, launch_dsink
#include "attn_tile.cuh"
#include "cuda_kernels.h"
#include "hmla/core/tensor.h"
#include "runtime.h"
#include "traits.h"

namespace hmla::cuda {

namespace {

using T = CompressedMmaTraits;
constexpr int kPad = T::kPad, kBwdHeads = T::kBwdHeads, kBwdKeys = T::kBwdKeys, kBwdSplit = T::kBwdSplit;
constexpr int kBwdPartLd = T::kBwdPartLd;

struct CompressedBwdParams {
  AttnCompressedParams f;  // with the saved out and lse, dout, dq
  const float* D;          // [b, H, sq]
  const int32_t* clean;    // [b * sq, k] selected mode: the rows' entries (clean_table_kernel)
  const int32_t* count;    // [b * sq] their number
  float *ws_w, *ws_e;      // [chunk rows, groups, Wc | Ec, dp]
  int64_t Wc, Ec;          // window and entry positions per row in the workspace
};

// Row r0 + blockIdx.x, heads [32 blockIdx.y, +32), all of dp. Warp w: head tile ht = w / 4, part
// q = w % 4. Per tile of 32 keys: 1. partial S (q 0, 1: the halves of dp) or dP (q 2, 3); 2. P and
// dS per (head, key), bf16 dS [head][key], dS^T and P^T [key][head]; 3. dq += dS K over q's quarter
// of the column pairs; 4. key m-tile w / 4: dS^T Q + P^T dO over the group's heads to the workspace.
__global__ void __launch_bounds__(32 * T::kBwdWarps)
    compressed_bwd_kernel(const CompressedBwdParams bp, int64_t r0, int dp, bool vec_q, bool vec_k, bool vec_o) {
  const AttnCompressedParams& p = bp.f;
  constexpr int kNt = kBwdKeys / 8, kPairs = int(T::kMaxD) / 16 / kBwdSplit;
  HMLA_DYNAMIC_SHARED(unsigned char, smem);
  const int ld = dp + kPad, ldt = kBwdHeads + kPad, d = int(p.d);
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem);  // [kBwdHeads, dp]
  __nv_bfloat16* dOs = Qs + kBwdHeads * ld;                      // [kBwdHeads, dp]
  __nv_bfloat16* Ks = dOs + kBwdHeads * ld;                      // [kBwdKeys, dp] gathered keys = values
  __nv_bfloat16* dSs = Ks + kBwdKeys * ld;                       // [kBwdHeads, kBwdKeys]
  __nv_bfloat16* dSt = dSs + kBwdKeys * ldt;                     // [kBwdKeys, kBwdHeads]
  __nv_bfloat16* Pt = dSt + kBwdKeys * ldt;                      // [kBwdKeys, kBwdHeads]
  float* part = reinterpret_cast<float*>(Pt + kBwdKeys * ldt);   // [kBwdSplit, kBwdHeads, kBwdPartLd]
  __shared__ float s_lse[kBwdHeads], s_D[kBwdHeads];

  const int64_t local = blockIdx.x, row = r0 + local;
  CompressedRow r(p, row);
  const int32_t* list = p.k > 0 ? bp.clean + row * p.k : nullptr;
  if (p.k > 0) r.n_ent = p.n_e > 0 ? bp.count[row] : 0;
  const int n = r.n_w + r.n_ent;
  const RowKeys keys(p, r, list);
  const int hg = blockIdx.y, groups = int(gridDim.y);
  const int h0 = hg * kBwdHeads, nh = int(p.H - h0 < kBwdHeads ? p.H - h0 : kBwdHeads);
  const __nv_bfloat16* q = bf(p.q) + r.bb * p.q_bstride + r.tl * p.q_rstride + h0 * p.q_hstride;
  load_rows(Qs, ld, kBwdHeads, nh, d, dp, vec_q, [&](int i) { return q + i * p.q_hstride; });
  const __nv_bfloat16* dout = bf(p.dout) + (row * p.H + h0) * p.d;
  load_rows(dOs, ld, kBwdHeads, nh, d, dp, vec_o, [&](int i) { return dout + i * p.d; });
  if (threadIdx.x < kBwdHeads) {
    const int h = h0 + int(threadIdx.x);
    s_lse[threadIdx.x] = h < p.H ? p.lse[(r.bb * p.H + h) * p.sq + r.tl] * kLog2e : INFINITY;
    s_D[threadIdx.x] = h < p.H ? bp.D[(r.bb * p.H + h) * p.sq + r.tl] : 0.f;
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int ht = warp / kBwdSplit, qq = warp % kBwdSplit;
  const bool heads_live = ht * 16 < nh;  // warp-uniform: a head tile past H does nothing
  const float c2 = p.scale * kLog2e;
  const int npairs = dp / 16, per = (npairs + kBwdSplit - 1) / kBwdSplit;
  const int pair0 = qq * per, mine = npairs - pair0 < per ? (npairs - pair0 > 0 ? npairs - pair0 : 0) : per;
  const int half = ((dp / 16 + 1) / 2) * 16;  // S's and dP's k-steps split in two halves
  const int klo = qq % 2 == 0 ? 0 : half, khi = qq % 2 == 0 ? half : dp;
  const __nv_bfloat16* A = qq < 2 ? Qs : dOs;

  float dq[2 * kPairs][4];
  zero_acc(dq);
  for (int j0 = 0; j0 < n; j0 += kBwdKeys) {
    const int nk = n - j0 < kBwdKeys ? n - j0 : kBwdKeys;
    __syncthreads();
    load_rows(Ks, ld, kBwdKeys, nk, d, dp, vec_k, [&](int i) { return keys.row(j0 + i); });
    __syncthreads();
    // 1-3. S and dP (K = V), P and dS, dq += dS K.
    bwd_tile_dq<kBwdHeads, kBwdKeys, kBwdSplit, kBwdPartLd, kPairs>(dq, part, dSs, dSt, Pt, ldt, A, ld, Ks, ld, klo, khi,
                                                                   s_lse, s_D, c2, p.scale, nh, j0, n, ht, qq,
                                                                   heads_live, 0, pair0, mine, lane);
    // 4. The key gradients of the warp's 16 keys: dS^T Q + P^T dO over the group's live heads.
    const int mt = warp / kBwdSplit;
    if (mt * 16 < nk) {
      const int nht = (nh + 15) / 16;
      uint32_t as[kBwdHeads / 16][4], ap[kBwdHeads / 16][4];
      bwd_key_grad_frags<kBwdHeads>(as, ap, dSt, Pt, ldt, mt, nht, lane);
      const int pA = j0 + mt * 16 + g, pB = pA + 8;
      float* wA = pA < r.n_w ? bp.ws_w + ((local * groups + hg) * bp.Wc + pA) * dp
                             : bp.ws_e + ((local * groups + hg) * bp.Ec + pA - r.n_w) * dp;
      float* wB = pB < r.n_w ? bp.ws_w + ((local * groups + hg) * bp.Wc + pB) * dp
                             : bp.ws_e + ((local * groups + hg) * bp.Ec + pB - r.n_w) * dp;
      for (int i = 0; i < mine; ++i) {
        const int col = (pair0 + i) * 16;
        float acc[2][4];
        bwd_key_grad_pair<kBwdHeads>(acc, as, ap, Qs, ld, dOs, ld, col, nht, true, lane);
#pragma unroll
        for (int h8 = 0; h8 < 2; ++h8) {
          const int cc = col + h8 * 8 + 2 * c;
          if (pA < n) wA[cc] = acc[h8][0], wA[cc + 1] = acc[h8][1];
          if (pB < n) wB[cc] = acc[h8][2], wB[cc + 1] = acc[h8][3];
        }
      }
    }
  }
  if (!heads_live) return;
  const int hA = h0 + ht * 16 + g, hB = hA + 8;
  __nv_bfloat16* dqo = bf(p.dq) + row * p.H * p.d;
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    if (i >= mine) break;
#pragma unroll
    for (int h8 = 0; h8 < 2; ++h8)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = (pair0 + i) * 16 + h8 * 8 + 2 * c + e;
        if (col >= d) continue;
        if (hA < p.H) dqo[hA * p.d + col] = __float2bfloat16(dq[2 * i + h8][e]);
        if (hB < p.H) dqo[hB * p.d + col] = __float2bfloat16(dq[2 * i + h8][2 + e]);
      }
  }
}

// The window keys' and the dense mode's entries' reductions of a chunk of local rows [r0, r0 + nr):
// a block per key (entries: e = blockIdx.x), a thread per column, the rows that attend the key in
// ascending order, each row's head groups in order, into acc [key, dp].
__global__ void reduce_keys_kernel(const CompressedBwdParams bp, int64_t r0, int64_t nr, int groups, int dp,
                                   bool entries, float* acc) {
  const AttnCompressedParams& p = bp.f;
  const int64_t key = blockIdx.x;
  int64_t bb, t0, t1, lo_doc = 0;
  if (!entries) {  // window key u: rows [u, u + W) of its document
    bb = key / p.s;
    const int64_t u = key % p.s, st = p.doc_start[key];
    t0 = u, t1 = st > u ? u : lmin(u + p.window, p.doc_end[key]);
  } else {  // entry e: rows from ent_last[e] to its document's end
    bb = key / p.n_e;
    const int64_t st = p.ent_doc[key];
    t0 = p.ent_last[key], t1 = st < 0 ? t0 : p.doc_end[bb * p.s + st];
    if (t0 < t1) {
      int64_t hi = 0;
      visible_entries(p.ent_doc + bb * p.n_e, p.ent_last + bb * p.n_e, p.n_e, st, t0, lo_doc, hi);
    }
  }
  // The chunk's local rows of batch row bb: flat rows bb sq + (t - q_row0) within [r0, r0 + nr).
  const int64_t f0 = bb * p.sq - p.q_row0, lo = lmax(t0, lmax(p.q_row0, r0 - f0));
  const int64_t hi = lmin(t1, lmin(p.q_row0 + p.sq, r0 + nr - f0));
  if (lo >= hi) return;
  const float* ws = entries ? bp.ws_e : bp.ws_w;
  const int64_t width = entries ? bp.Ec : bp.Wc;
  for (int col = threadIdx.x; col < dp; col += blockDim.x) {
    float a = acc[key * dp + col];
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t local = f0 + t - r0;
      const int64_t st = p.doc_start[bb * p.s + t], u0 = lmax(st, t - p.window + 1);
      const int64_t pos = entries ? key % p.n_e - lo_doc : key % p.s - u0;  // ws_e holds the entries alone
      for (int h = 0; h < groups; ++h) a += ws[((local * groups + h) * width + pos) * dp + col];
    }
    acc[key * dp + col] = a;
  }
}

// dst [n, d] bf16 = acc [n, dp]'s first d columns.
__global__ void narrow_kernel(const float* acc, int64_t n, int d, int dp, __nv_bfloat16* dst) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n * d) dst[i] = __float2bfloat16(acc[(i / d) * dp + i % d]);
}

std::atomic<int64_t> g_workspace_bytes{T::kBwdWorkspaceBytes};

}  // namespace

int64_t set_attn_compressed_bwd_workspace_bytes(int64_t bytes) {
  return g_workspace_bytes.exchange(std::max<int64_t>(bytes, 1));
}

void attn_compressed_bwd_mma(const AttnCompressedParams& f) {
  cudaStream_t st = current_stream().get();
  const int64_t rows = f.b * f.sq, dp = T::pad16(f.d);
  const int groups = int((f.H + kBwdHeads - 1) / kBwdHeads);
  Tensor acc_w = Tensor::empty({f.b * f.s, dp}, DType::f32, Device::cuda);
  Tensor acc_e = Tensor::empty({std::max<int64_t>(f.b * f.n_e, 1), dp}, DType::f32, Device::cuda);
  check(cudaMemsetAsync(acc_w.raw_data(), 0, acc_w.nbytes(), st), "cudaMemsetAsync");
  check(cudaMemsetAsync(acc_e.raw_data(), 0, acc_e.nbytes(), st), "cudaMemsetAsync");
  if (rows > 0) {
    Tensor D = Tensor::empty({f.b, f.H, f.sq}, DType::f32, Device::cuda);
    launch_rowdot(bf(f.out), bf(f.dout), f.b, f.sq, f.H, f.d, D.data<float>());
    CompressedBwdParams bp{f, D.data<float>(), nullptr, nullptr, nullptr, nullptr, std::min(f.window, f.s), 0};
    bp.Ec = f.n_e == 0 ? 0 : f.k > 0 ? f.k : f.n_e;  // a row's entries: at most its slots, or all
    Tensor clean, count;
    if (f.k > 0 && f.n_e > 0) {
      clean = Tensor::empty({rows, f.k}, DType::i32, Device::cuda);
      count = Tensor::empty({rows}, DType::i32, Device::cuda);
      attn_compressed_clean_table(f, clean.data<int32_t>(), count.data<int32_t>());
      bp.clean = clean.data<int32_t>(), bp.count = count.data<int32_t>();
    }
    const int64_t per_row = groups * (bp.Wc + bp.Ec) * dp * int64_t(sizeof(float));
    const int64_t chunk_rows = std::max<int64_t>(1, std::min<int64_t>(rows, g_workspace_bytes.load() / per_row));
    Tensor ws_w = Tensor::empty({chunk_rows * groups * bp.Wc, dp}, DType::f32, Device::cuda);
    Tensor ws_e = Tensor::empty({std::max<int64_t>(chunk_rows * groups * bp.Ec, 1), dp}, DType::f32, Device::cuda);
    bp.ws_w = ws_w.data<float>(), bp.ws_e = ws_e.data<float>();
    const TableRows t{bp.clean, f.b, f.sq, f.n_e, f.k, f.k, f.k};
    std::optional<InverseIndex> index;
    if (bp.clean) index.emplace(t, chunk_rows, "attn_compressed_bwd");
    const size_t smem = size_t(T::bwd_smem_bytes(f.d));
    check(cudaFuncSetAttribute(compressed_bwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
          "attn_compressed_bwd: shared memory");
    const bool vec_o = f.d % 8 == 0 && reinterpret_cast<uintptr_t>(f.dout) % 16 == 0;
    for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
      const int64_t nr = std::min(chunk_rows, rows - r0);
      if (index) index->build(t, r0, nr);
      HMLA_LAUNCH(compressed_bwd_kernel, dim3(unsigned(nr), unsigned(groups)), 32 * T::kBwdWarps, smem, st, bp, r0,
                  int(dp), compressed_rows_aligned(f, true), compressed_rows_aligned(f, false), vec_o);
      check_launch("attn_compressed_bwd (mma)");
      HMLA_LAUNCH(reduce_keys_kernel, unsigned(f.b * f.s), 128, 0, st, bp, r0, nr, groups, int(dp), false,
                  acc_w.data<float>());
      check_launch("attn_compressed_bwd: window keys");
      if (f.n_e > 0 && !index) {
        HMLA_LAUNCH(reduce_keys_kernel, unsigned(f.b * f.n_e), 128, 0, st, bp, r0, nr, groups, int(dp), true,
                    acc_e.data<float>());
        check_launch("attn_compressed_bwd: entries");
      }
      if (index) inverse_reduce(*index, t, bp.ws_e, dp, groups, acc_e.data<float>(), "attn_compressed_bwd: entries");
    }
    if (f.dsink) launch_dsink(f.lse, D.data<float>(), f.sink, f.b, f.sq, f.H, f.dsink);
  }
  const int64_t nw = f.b * f.s * f.d, ne = f.b * f.n_e * f.d;
  if (nw > 0) {
    HMLA_LAUNCH(narrow_kernel, unsigned((nw + 255) / 256), 256, 0, st, acc_w.data<float>(), f.b * f.s, int(f.d),
                int(dp), bf(f.dkv));
    check_launch("attn_compressed_bwd: dkv to bf16");
  }
  if (ne > 0) {
    HMLA_LAUNCH(narrow_kernel, unsigned((ne + 255) / 256), 256, 0, st, acc_e.data<float>(), f.b * f.n_e, int(f.d),
                int(dp), bf(f.dent));
    check_launch("attn_compressed_bwd: dent to bf16");
  }
}

}  // namespace hmla::cuda
