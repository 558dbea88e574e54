// Sparse latent MQA attention backward on the GPU (bf16 in and out, f32 accumulation), the same
// contract as the CPU op (hmla/ops/sparse_attention.h); the forward, the table check and the plan:
// attn_sparse_fwd.cu.
//   D[h] = rowsum(dO_h * O_h);  P = exp(l - lse);  dS = P (dP - D) scale with dP = dO_h . v_j
//   dq_h = sum_j dS[h, j] kv_j
//   dkv_j = sum over (row, h) listing j of dS[h, j] q_h + P[h, j] dO_h (value channels)
// Kernel bwd computes S and dP once per (row, head group, tile of listed keys) over the full
// Dqk / Dv and takes dq and dkv's contributions from the same P and dS (docs/sparse_attention.md,
// "The CUDA backward"). dkv is deterministic without float atomics: bwd writes each (row, head
// group, listed key)'s contribution, summed over the group's heads in order, to a workspace for a
// chunk of rows; kernel reduce adds, per key, the chunk's contributions in (row, position, head
// group) order through an inverse index built on the device (sparse_index.cuh), into an f32
// accumulator; chunks go in row order.
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "attn_dense.cuh"
#include "attn_tile.cuh"
#include "cuda_kernels.h"
#include "hmla/core/tensor.h"
#include "mma.cuh"
#include "runtime.h"
#include "sparse_index.cuh"
#include "traits.h"

namespace hmla::cuda {

namespace {

constexpr int kPad = SparseTraits::kPad;
constexpr int kBwdWarps = SparseTraits::kBwdWarps, kBwdHeads = SparseTraits::kBwdHeads, kBwdKeys = SparseTraits::kBwdKeys;
constexpr int kBwdSplit = SparseTraits::kBwdSplit, kBwdDqChunk = SparseTraits::kBwdDqChunk;
constexpr int kBwdPartLd = SparseTraits::kBwdPartLd;

struct SparseBwdParams {
  AttnSparseParams f;  // with the saved out and lse, dout, dq
  const float* D;      // [b, H, sq]
};

// Row `row0 + blockIdx.x`, heads [32 by, +32), columns [c0, c0 + 576) of Dqk (c0 = 576 bz: one
// chunk at every width up to 576). Warp w: head tile ht = w / 4 (16 heads), part q = w % 4.
// Per tile of 32 listed keys:
//   1. partial S (q 0, 1: the two halves of Dqk) and dP (q 2, 3: of Dv) of the warp's heads;
//   2. the block sums them: P = exp(S scale - lse), dS = P (dP - D) scale, kept as bf16 dS
//      [head][key] (dq's A operand) and dS^T, P^T [key][head] (dkv's);
//   3. dq[heads, q's quarter of the column pairs] += dS K, K read from the shared key tile
//      (ldmatrix.trans); the accumulators stay in registers over the whole list;
//   4. key m-tile w / 4, q's quarter of the column pairs: dS^T Q + P^T dO over the block's
//      heads, written to ws[((local row * groups + group) * KW + position) * Dqk + col].
__global__ void __launch_bounds__(32 * kBwdWarps)
    sparse_bwd_kernel(const SparseBwdParams bp, int64_t row0, bool vec, float* ws) {
  const AttnSparseParams& p = bp.f;
  constexpr int kNt = kBwdKeys / 8, kPairs = kBwdDqChunk / 16 / kBwdSplit;
  HMLA_DYNAMIC_SHARED(unsigned char, smem);
  const int ldq = int(p.Dqk) + kPad, ldv = int(p.Dv) + kPad, ldt = kBwdHeads + kPad;
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem);  // [kBwdHeads, Dqk]
  __nv_bfloat16* Ks = Qs + kBwdHeads * ldq;                      // [kBwdKeys, Dqk] gathered keys
  __nv_bfloat16* dOs = Ks + kBwdKeys * ldq;                      // [kBwdHeads, Dv]
  __nv_bfloat16* dSs = dOs + kBwdHeads * ldv;                    // [kBwdHeads, kBwdKeys] (row stride ldt)
  __nv_bfloat16* dSt = dSs + kBwdKeys * ldt;                     // [kBwdKeys, kBwdHeads]
  __nv_bfloat16* Pt = dSt + kBwdKeys * ldt;                      // [kBwdKeys, kBwdHeads]
  float* part = reinterpret_cast<float*>(Pt + kBwdKeys * ldt);   // [kBwdSplit, kBwdHeads, kBwdPartLd]
  int32_t* list = reinterpret_cast<int32_t*>(part + kBwdSplit * kBwdHeads * kBwdPartLd);  // [KW]
  __shared__ float s_lse[kBwdHeads], s_D[kBwdHeads];
  __shared__ int s_nc;

  const int64_t local = blockIdx.x, row = row0 + local, bb = row / p.sq, t = row % p.sq;
  const int hg = blockIdx.y, groups = int(gridDim.y);
  const int h0 = hg * kBwdHeads, nh = int(p.H - h0 < kBwdHeads ? p.H - h0 : kBwdHeads);
  const int c0 = int(blockIdx.z) * kBwdDqChunk, cn = int(p.Dqk - c0 < kBwdDqChunk ? p.Dqk - c0 : kBwdDqChunk);
  const int n = compact(p.idx + row * p.KW, int(p.KW), int(p.K), list, &s_nc);
  load_tile(Qs, ldq, bf(p.q) + bb * p.q_bstride + t * p.q_rstride + h0 * p.q_hstride, p.q_hstride, kBwdHeads, nh, int(p.Dqk), vec);
  load_tile(dOs, ldv, bf(p.dout) + (row * p.H + h0) * p.Dv, p.Dv, kBwdHeads, nh, int(p.Dv), vec && p.Dv % 8 == 0);
  if (threadIdx.x < kBwdHeads) {
    const int h = h0 + int(threadIdx.x);
    s_lse[threadIdx.x] = h < p.H ? p.lse[(bb * p.H + h) * p.sq + t] * kLog2e : INFINITY;
    s_D[threadIdx.x] = h < p.H ? bp.D[(bb * p.H + h) * p.sq + t] : 0.f;
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int ht = warp / kBwdSplit, q = warp % kBwdSplit;
  const bool heads_live = ht * 16 < nh;  // warp-uniform: a head tile past H does nothing
  const float c2 = p.scale * kLog2e;
  // The warp's column pairs (16 columns each) of the chunk, for dq and for dkv.
  const int npairs = cn / 16, per = (npairs + kBwdSplit - 1) / kBwdSplit;
  const int pair0 = q * per, mine = npairs - pair0 < per ? (npairs - pair0 > 0 ? npairs - pair0 : 0) : per;
  // The halves of S's and dP's k-steps (multiples of 16 columns).
  const int sk = ((int(p.Dqk) / 16 + 1) / 2) * 16, pk = ((int(p.Dv) / 16 + 1) / 2) * 16;
  const int klo = q == 0 ? 0 : q == 1 ? sk : q == 2 ? 0 : pk;
  const int khi = q == 0 ? sk : q == 1 ? int(p.Dqk) : q == 2 ? pk : int(p.Dv);
  const __nv_bfloat16* A = q < 2 ? Qs : dOs;
  const int lda = q < 2 ? ldq : ldv;

  float dq[2 * kPairs][4];
  zero_acc(dq);
  const __nv_bfloat16* kv = bf(p.kv) + bb * p.skv * p.Dqk;
  const int64_t wbase = (local * groups + hg) * p.KW;
  for (int j0 = 0; j0 < n; j0 += kBwdKeys) {
    const int nk = n - j0 < kBwdKeys ? n - j0 : kBwdKeys;
    __syncthreads();
    load_tile(Ks, ldq, kv, p.Dqk, kBwdKeys, nk, int(p.Dqk), vec, list + j0);  // gathered keys (v: their first Dv)
    __syncthreads();
    // 1-3. S and dP, P and dS, dq += dS K.
    bwd_tile_dq<kBwdHeads, kBwdKeys, kBwdSplit, kBwdPartLd, kPairs>(dq, part, dSs, dSt, Pt, ldt, A, lda, Ks, ldq, klo, khi,
                                                                   s_lse, s_D, c2, p.scale, nh, j0, n, ht, q,
                                                                   heads_live, c0, pair0, mine, lane);
    // 4. dkv's contributions of the warp's 16 keys: dS^T Q + P^T dO over the block's live heads.
    const int mt = warp / kBwdSplit;
    if (mt * 16 < nk) {
      const int nht = (nh + 15) / 16;
      uint32_t as[kBwdHeads / 16][4], ap[kBwdHeads / 16][4];
      bwd_key_grad_frags<kBwdHeads>(as, ap, dSt, Pt, ldt, mt, nht, lane);
      const int pA = j0 + mt * 16 + g, pB = pA + 8;
      for (int i = 0; i < mine; ++i) {
        const int col = c0 + (pair0 + i) * 16;
        float acc[2][4];  // P^T dO on the value columns only: Dv is a multiple of 16
        bwd_key_grad_pair<kBwdHeads>(acc, as, ap, Qs, ldq, dOs, ldv, col, nht, col < p.Dv, lane);
#pragma unroll
        for (int h8 = 0; h8 < 2; ++h8) {
          const int cc = col + h8 * 8 + 2 * c;
          if (pA < n) ws[(wbase + pA) * p.Dqk + cc] = acc[h8][0], ws[(wbase + pA) * p.Dqk + cc + 1] = acc[h8][1];
          if (pB < n) ws[(wbase + pB) * p.Dqk + cc] = acc[h8][2], ws[(wbase + pB) * p.Dqk + cc + 1] = acc[h8][3];
        }
      }
    }
  }
  if (!heads_live) return;
  const int hA = h0 + ht * 16 + g, hB = hA + 8;
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    if (i >= mine) break;
#pragma unroll
    for (int h8 = 0; h8 < 2; ++h8) {
      const int col = c0 + (pair0 + i) * 16 + h8 * 8 + 2 * c;
      const float* d = dq[2 * i + h8];
      if (hA < p.H) *reinterpret_cast<uint32_t*>(bf(p.dq) + (row * p.H + hA) * p.Dqk + col) = pack_bf16(d[0], d[1]);
      if (hB < p.H) *reinterpret_cast<uint32_t*>(bf(p.dq) + (row * p.H + hB) * p.Dqk + col) = pack_bf16(d[2], d[3]);
    }
  }
}

__global__ void to_bf16_kernel(const float* x, int64_t n, __nv_bfloat16* y) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __float2bfloat16(x[i]);
}

std::atomic<int64_t> g_bwd_workspace_bytes{SparseTraits::kBwdWorkspaceBytes};

// The attention lists every slot: candidates, then the window.
TableRows table_rows(const AttnSparseParams& p) { return {p.idx, p.b, p.sq, p.skv, p.KW, p.K, p.KW}; }

}  // namespace

SparseInverseIndex sparse_inverse_index(const AttnSparseParams& p, int64_t r0, int64_t nr) {
  const TableRows t = table_rows(p);
  InverseIndex ix(t, nr, "attn_sparse_bwd");
  if (nr > 0) ix.build(t, r0, nr);
  else check(cudaMemsetAsync(ix.offsets.raw_data(), 0, ix.offsets.nbytes(), current_stream().get()), "cudaMemsetAsync");
  SparseInverseIndex r{ix.offsets.to(Device::cpu).to_vector<int64_t>(), {}};
  const std::vector<int64_t> all = ix.entries.to(Device::cpu).to_vector<int64_t>();
  r.entries.assign(all.begin(), all.begin() + r.offsets.back());
  return r;
}

int64_t set_sparse_bwd_workspace_bytes(int64_t bytes) { return g_bwd_workspace_bytes.exchange(std::max<int64_t>(bytes, 1)); }

void attn_sparse_bwd(const AttnSparseParams& f) {
  const int64_t rows = f.b * f.sq;
  Tensor D = Tensor::empty({f.b, f.H, f.sq}, DType::f32, Device::cuda);
  Tensor acc = Tensor::empty({f.b * f.skv, f.Dqk}, DType::f32, Device::cuda);
  check(cudaMemsetAsync(acc.raw_data(), 0, acc.nbytes(), current_stream().get()), "cudaMemsetAsync");
  SparseBwdParams bp{f, D.data<float>()};
  cudaStream_t st = current_stream().get();
  if (rows > 0) {
    launch_rowdot(bf(f.out), bf(f.dout), f.b, f.sq, f.H, f.Dv, D.data<float>());
    const bool vec = rows_aligned(f.q, f.q_rstride, f.q_bstride, f.q_hstride, f.Dqk) &&
                     rows_aligned(f.kv, f.Dqk, f.skv * f.Dqk, 0, f.Dqk) && reinterpret_cast<uintptr_t>(f.dout) % 16 == 0;
    // One kernel for dq and dkv's contributions, a chunk of rows at a time (the workspace).
    const int groups = int((f.H + kBwdHeads - 1) / kBwdHeads), nz = int((f.Dqk + kBwdDqChunk - 1) / kBwdDqChunk);
    const size_t smem = size_t(SparseTraits::bwd_smem_bytes(f.Dqk, f.Dv, f.KW));
    check(cudaFuncSetAttribute(sparse_bwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
          "attn_sparse_bwd: shared memory");
    // Workspace: SparseTraits::kBwdWorkspaceBytes of rows (set_sparse_bwd_workspace_bytes).
    const int64_t budget = g_bwd_workspace_bytes.load();
    const int64_t per_row = groups * f.KW * f.Dqk * int64_t(sizeof(float));
    const int64_t chunk_rows = std::max<int64_t>(1, std::min<int64_t>(rows, budget / per_row));
    Tensor ws = Tensor::empty({chunk_rows * groups * f.KW, f.Dqk}, DType::f32, Device::cuda);
    const TableRows t = table_rows(f);
    InverseIndex index(t, chunk_rows, "attn_sparse_bwd");
    for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
      const int64_t nr = std::min(chunk_rows, rows - r0);
      index.build(t, r0, nr);
      HMLA_LAUNCH(sparse_bwd_kernel, dim3(unsigned(nr), unsigned(groups), unsigned(nz)), 32 * kBwdWarps, smem, st, bp,
                  r0, vec, ws.data<float>());
      check_launch("attn_sparse_bwd dq and dkv contributions");
      inverse_reduce(index, t, ws.data<float>(), f.Dqk, groups, acc.data<float>(), "attn_sparse_bwd dkv reduce");
    }
    if (f.sink) launch_dsink(f.lse, D.data<float>(), f.sink, f.b, f.sq, f.H, f.dsink);
  }  // no rows: dsink gains nothing
  const int64_t n = acc.numel();
  if (n > 0) {
    HMLA_LAUNCH(to_bf16_kernel, unsigned((n + 255) / 256), 256, 0, st, acc.data<float>(), n,
                bf(f.dkv));
    check_launch("attn_sparse_bwd dkv to bf16");
  }
}

}  // namespace hmla::cuda
