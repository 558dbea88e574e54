// Sparse latent MQA attention forward on the GPU (bf16 in and out, f32 accumulation, f32 lse and
// lse_c), the same contract as the CPU op (hmla/ops/sparse_attention.h). A block owns one query
// row, up to 64 of its heads and all of its value columns (up to 512; wider ones in groups of 512),
// one warp per (16 heads, 128 value columns). It compacts the row's index list (candidates first,
// then window keys; -1 slots dropped, so they cost nothing), then walks it in tiles of 32 gathered
// keys: S = Q K^T once per tile, split between the warps of a head subgroup by 8-key column tiles
// into shared memory; then each warp's online softmax over every listed key and, for lse_c, a
// second running (max, sum) over the candidates alone, and O += P V for its columns with P in
// registers and V read from the gathered keys. Column tiles past the last listed key issue nothing.
// No atomics: deterministic.
// Also here: the device-side check of the index table's contract (entries in [-1, skv), no
// duplicate in a row), one block per row sorting its entries in shared memory, and the family's
// plan. The backward: attn_sparse_bwd.cu.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "attn_dense.cuh"
#include "attn_tile.cuh"
#include "cuda_kernels.h"
#include "hmla/core/tensor.h"
#include "mma.cuh"
#include "runtime.h"
#include "sparse_index.cuh"  // compact
#include "traits.h"

namespace hmla::cuda {

namespace {

constexpr int kPad = SparseTraits::kPad, kMaxKW = SparseTraits::kMaxKW;

constexpr int kFwdBk = SparseTraits::kFwdBk, kFwdChunk = SparseTraits::kFwdChunk, kFwdWarps = SparseTraits::kFwdWarps;

// A block: one query row, 16 head_warps heads (h0 on), value chunks [vg chunks, +chunks) of
// kFwdChunk columns; warp = (head subgroup hw, chunk vc), hw fastest. Per key tile of kFwdBk
// gathered keys the warp computes the scores of its 16 heads over the tile's 8-key column tiles
// nt with nt % chunks == vc (each product issued once per block) into the shared tile Ss; after a
// barrier every warp of the subgroup reads the whole tile's 16 rows for its softmax and O += P V.
// Column tiles past the row's last listed key issue nothing.
__global__ void __launch_bounds__(32 * kFwdWarps)
    sparse_fwd_kernel(const AttnSparseParams p, int head_warps, int chunks, int vgroups, bool vec) {
  constexpr int kNt = kFwdBk / 8, kDt = kFwdChunk / 8;
  HMLA_DYNAMIC_SHARED(unsigned char, smem);
  const int heads = 16 * head_warps, ldq = int(p.Dqk) + kPad, lds = kFwdBk + kPad;
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem);  // [heads, Dqk]
  __nv_bfloat16* Ks = Qs + heads * ldq;                          // [kFwdBk, Dqk] gathered keys (and values)
  float* Ss = reinterpret_cast<float*>(Ks + kFwdBk * ldq);      // [heads, kFwdBk] the tile's raw scores
  int32_t* list = reinterpret_cast<int32_t*>(Ss + heads * lds);  // [KW]
  __shared__ int s_nc;

  const int64_t row = blockIdx.x;  // b * sq + t
  const int64_t bb = row / p.sq;
  const int hg = blockIdx.y / vgroups, vg = blockIdx.y % vgroups;
  const int h0 = hg * heads, nh = int(p.H - h0 < heads ? p.H - h0 : heads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int hw = warp % head_warps, vc = warp / head_warps, r0 = hw * 16;
  const int dv0 = (vg * chunks + vc) * kFwdChunk;
  const int dvn = int(p.Dv - dv0 < kFwdChunk ? (p.Dv - dv0 > 0 ? p.Dv - dv0 : 0) : kFwdChunk);
  const int n = compact(p.idx + row * p.KW, int(p.KW), int(p.K), list, &s_nc);
  const int nc = s_nc;  // compact ends with a barrier after writing it
  load_tile(Qs, ldq, bf(p.q) + bb * p.q_bstride + (row % p.sq) * p.q_rstride + h0 * p.q_hstride, p.q_hstride, heads, nh, int(p.Dqk), vec);

  uint32_t mine = 0;  // the column tiles whose scores this warp computes
#pragma unroll
  for (int nt = 0; nt < kNt; ++nt)
    if (nt % chunks == vc) mine |= 1u << nt;
  const float c2 = p.scale * kLog2e;
  float mA = -INFINITY, mB = -INFINITY, lA = 0.f, lB = 0.f;     // all listed keys
  float cmA = -INFINITY, cmB = -INFINITY, clA = 0.f, clB = 0.f;  // candidates only (lse_c)
  float o[kDt][4];
  zero_acc(o);
  const __nv_bfloat16* kv = bf(p.kv) + bb * p.skv * p.Dqk;
  for (int j0 = 0; j0 < n; j0 += kFwdBk) {
    const int nk = n - j0 < kFwdBk ? n - j0 : kFwdBk;
    const uint32_t live = (1u << ((nk + 7) / 8)) - 1u;  // column tiles holding listed keys
    __syncthreads();
    load_tile(Ks, ldq, kv, p.Dqk, kFwdBk, nk, int(p.Dqk), vec, list + j0);  // gathered keys
    __syncthreads();
    tile_scores_to_shared<kNt>(Ss, lds, Qs, ldq, r0, Ks, ldq, int(p.Dqk), live & mine, lane);
    __syncthreads();
    if (j0 < nc) {  // lse_c: no output, no sink (a tile past the candidates would change nothing)
      float sc[kNt][4], alA, alB;
      read_scores(sc, Ss, lds, r0, j0, nc, c2, live, lane);
      online_max_sum(sc, cmA, cmB, clA, clB, alA, alB);
    }
    float s[kNt][4];
    read_scores(s, Ss, lds, r0, j0, n, c2, live, lane);
    online_softmax_step(s, mA, mB, lA, lB, o);
    mma_acc_pv(o, s, Ks + dv0, ldq, dvn, lane, live);  // the chunk's values: its key columns [dv0, dv0 + dvn)
  }

  lA = quad_sum(lA), lB = quad_sum(lB), clA = quad_sum(clA), clB = quad_sum(clB);
  // out = O / (l + exp(sink - m)); lse = ln(that); lse_c over the candidates; empty rows 0, +inf.
  const int hA = h0 + r0 + g, hB = hA + 8;
  float invA = 0.f, invB = 0.f, lseA = INFINITY, lseB = INFINITY, lsecA = INFINITY, lsecB = INFINITY, unused;
  if (hA < p.H) softmax_finish(mA, lA, p.sink != nullptr, p.sink ? p.sink[hA] * kLog2e : 0.f, invA, lseA);
  if (hB < p.H) softmax_finish(mB, lB, p.sink != nullptr, p.sink ? p.sink[hB] * kLog2e : 0.f, invB, lseB);
  softmax_finish(cmA, clA, false, 0.f, unused, lsecA);
  softmax_finish(cmB, clB, false, 0.f, unused, lsecB);
#pragma unroll
  for (int dt = 0; dt < kDt; ++dt) {
    if (dt * 8 >= dvn) break;
    const int col = dv0 + dt * 8 + 2 * c;
    if (hA < p.H)
      *reinterpret_cast<uint32_t*>(bf(p.out) + (row * p.H + hA) * p.Dv + col) = pack_bf16(o[dt][0] * invA, o[dt][1] * invA);
    if (hB < p.H)
      *reinterpret_cast<uint32_t*>(bf(p.out) + (row * p.H + hB) * p.Dv + col) = pack_bf16(o[dt][2] * invB, o[dt][3] * invB);
  }
  if (vg == 0 && vc == 0 && c == 0) {
    const int64_t t = row % p.sq;
    if (hA < p.H) {
      p.lse[(bb * p.H + hA) * p.sq + t] = lseA;
      if (p.lse_c) p.lse_c[(bb * p.H + hA) * p.sq + t] = lsecA;
    }
    if (hB < p.H) {
      p.lse[(bb * p.H + hB) * p.sq + t] = lseB;
      if (p.lse_c) p.lse_c[(bb * p.H + hB) * p.sq + t] = lsecB;
    }
  }
}

// Each row's entries: in [-1, skv) and no key twice. err[0] = the smallest bad row (atomicMin from
// INT32_MAX: the first bad row whatever the blocks' order, so the message is deterministic).
__global__ void check_table_kernel(const int32_t* idx, int64_t KW, int64_t skv, int* err) {
  __shared__ int32_t v[kMaxKW];
  const int64_t row = blockIdx.x;
  int P = 1;
  while (P < KW) P *= 2;
  for (int i = threadIdx.x; i < P; i += blockDim.x) {
    const int32_t j = i < KW ? idx[row * KW + i] : INT32_MAX;
    if (i < KW && (j < -1 || j >= skv)) atomicMin(err, int(row));
    v[i] = j < 0 ? INT32_MAX : j;  // -1 slots never collide
  }
  bitonic_sort(v, P);
  for (int i = threadIdx.x; i + 1 < P; i += blockDim.x)
    if (v[i] != INT32_MAX && v[i] == v[i + 1]) atomicMin(err, int(row));
}

}  // namespace

void attn_sparse_check_table(const AttnSparseParams& p) {
  const int64_t rows = p.b * p.sq, KW = p.KW, skv = p.skv;
  Tensor err = Tensor::from_vector<int32_t>({1}, {INT32_MAX}).to(Device::cuda);
  if (rows > 0) {
    HMLA_LAUNCH(check_table_kernel, unsigned(rows), 256, 0, current_stream().get(), p.idx, KW, skv,
                                                                           err.data<int32_t>());
    check_launch("sparse attention: table check");
  }
  const int bad = err.to(Device::cpu).data<int32_t>()[0];
  HMLA_CHECK(bad == INT32_MAX, ShapeError, "sparse attention: row ", bad % p.sq, " of batch ", bad / p.sq,
             " lists a key outside [-1, ", skv, ") or a key twice");
}

void attn_sparse_fwd(const AttnSparseParams& p) {
  if (p.b * p.sq == 0) return;
  const bool vec = rows_aligned(p.q, p.q_rstride, p.q_bstride, p.q_hstride, p.Dqk) &&
                   rows_aligned(p.kv, p.Dqk, p.skv * p.Dqk, 0, p.Dqk);
  // All of a head group's value chunks in one block (groups of at most kFwdChunks: 512 columns),
  // so the scores are computed once per row and head group up to Dv = 512.
  const int nchunks = std::max(1, int((p.Dv + kFwdChunk - 1) / kFwdChunk));
  const int vgroups = (nchunks + SparseTraits::kFwdChunks - 1) / SparseTraits::kFwdChunks;
  const int chunks = (nchunks + vgroups - 1) / vgroups;
  const int head_warps = int(SparseTraits::fwd_head_warps(p.H)), heads = 16 * head_warps;
  const int hgroups = int((p.H + heads - 1) / heads);
  const size_t smem = size_t(SparseTraits::fwd_smem_bytes(p.H, p.Dqk, p.KW));
  check(cudaFuncSetAttribute(sparse_fwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
        "attn_sparse_fwd: shared memory");
  dim3 grid(unsigned(p.b * p.sq), unsigned(hgroups * vgroups));
  HMLA_LAUNCH(sparse_fwd_kernel, grid, 32 * head_warps * chunks, smem, current_stream().get(), p, head_warps, chunks,
              vgroups, vec);
  check_launch("attn_sparse_fwd");
}

// The plan (cuda_kernels.h): the table check scans any table; both passes run the tensor-core
// kernels on bf16 with Dqk and Dv multiples of kMmaK, K + W up to kMaxKW and tiles within shared
// memory; the backward also needs H a multiple of kHeadStep (traits.h says why).
Plan plan(Op op, const AttnSparseParams& p) {
  using T = SparseTraits;
  if (op == Op::attn_sparse_check_table) return {Variant::simt, {}};
  const bool fwd = p.dtype == DType::bf16 && p.Dqk % kMmaK == 0 && p.Dv % kMmaK == 0 && p.KW <= T::kMaxKW &&
                   T::fwd_smem_bytes(p.H, p.Dqk, p.KW) <= T::kFwdMaxSmemBytes;
  if (op == Op::attn_sparse_fwd) return plan_if(fwd, Variant::mma);
  return plan_if(fwd && p.H % T::kHeadStep == 0 && T::bwd_smem_bytes(p.Dqk, p.Dv, p.KW) + 1024 <= T::kBwdMaxSmemBytes,
                 Variant::mma);
}

}  // namespace hmla::cuda
