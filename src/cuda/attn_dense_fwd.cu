// Dense per-document causal attention forward on the GPU, bf16 in and out, f32 accumulation and
// lse: FlashAttention-2's scheme on mma.sync (portable to sm_80+; Hopper runs it too). A block
// owns kRows query rows of one (batch row, head) and its output columns (one chunk of <= 256, or
// for values wider than 256 two chunks, one warp each per 16 rows, that share the scores through
// shared memory); it walks only the key range of its rows' documents (tile skipping), skipping
// the 8-key column tiles its rows cannot see and masking the rest per element. Each warp keeps
// 16 rows' running max / sum and output in registers. Deterministic: no atomics, fixed order.
#include <cuda_bf16.h>

#include <cfloat>

#include "attn_cudnn.h"
#include "attn_dense.cuh"
#include "mma.cuh"
#include "runtime.h"
#include "traits.h"

namespace hmla::cuda {

namespace {

// kChunks value chunks of kDvChunk columns per block (2 for values wider than 256: the latent
// form's 512), one warp per (16 rows, chunk): the warps of a row group split each key tile's 8-key
// column tiles (nt % kChunks == vc), write their scores to a shared f32 tile, and after a barrier
// each reads all of its rows' scores for its softmax and its chunk's P V. The scores are computed
// once per block however wide the values (docs/cuda.md, the work counter).
template <bool kWide, int kDvChunk, int kChunks>
__global__ void __launch_bounds__(32 * AttnCudaTraits<kWide>::kWarps * kChunks)
    attn_dense_fwd_kernel(const AttnDenseParams p, int nchunks, VecFlags vec, int stages, bool v_in_k) {
  using T = AttnCudaTraits<kWide>;
  constexpr int kNt = T::kBk / 8, kDt = kDvChunk / 8;
  HMLA_DYNAMIC_SHARED(unsigned char, smem);
  // Per stage of the K/V pipeline (attn_fwd_smem): a K tile and, unless the values are the keys'
  // first columns (v_in_k), a V tile of the block's value columns, both row major.
  const int ldq = p.Dqk + T::kPad, lds = T::kBk + T::kPad, ldv = v_in_k ? ldq : kChunks * kDvChunk + T::kPad;
  const int stage_elems = T::kBk * ldq + (v_in_k ? 0 : T::kBk * ldv);
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem);  // [kRows, Dqk]
  __nv_bfloat16* stage0 = Qs + T::kRows * ldq;                   // stages x {K [kBk, Dqk], V [kBk, block's Dv]}
  float* Ss = reinterpret_cast<float*>(stage0 + stages * stage_elems);  // [kRows, kBk] scores (kChunks > 1)
  __shared__ MaskRanges<T::kWarps> mr;

  const int tiles = (p.sq + T::kRows - 1) / T::kRows;
  const int tile = tiles - 1 - blockIdx.x;  // longest key ranges first
  const int h = blockIdx.y / nchunks, chunk = blockIdx.y % nchunks, b = blockIdx.z;
  const int hk = h / (p.H / p.Hkv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int rw = warp % T::kWarps, vc = warp / T::kWarps;  // the warp's row group and value chunk
  const int bv0 = chunk * kChunks * kDvChunk, bvn = min(kChunks * kDvChunk, int(p.Dv) - bv0);  // the block's
  const int dv0 = bv0 + vc * kDvChunk, dvn = max(0, min(kDvChunk, int(p.Dv) - dv0));          // the warp's
  const int lr0 = tile * T::kRows;                        // first local row of the block
  const int nrows = min(T::kRows, int(p.sq) - lr0);
  const int32_t* ds = p.doc_start + int64_t(b) * p.s;

  // The block's key range, the union of its rows' [doc_start, t], and each row group's (the mask
  // policy below).
  {
    const int64_t t = p.q_row0 + lr0 + threadIdx.x;
    const bool sees = int(threadIdx.x) < nrows && ds[t] <= t;
    mr.fill(sees, sees ? ds[t] : 0, int(t));
  }
  const __nv_bfloat16* q = bf(p.q) + b * p.q_bstride + int64_t(lr0) * p.q_rstride + h * p.q_hstride;
  load_tile(Qs, ldq, q, p.q_rstride, T::kRows, nrows, p.Dqk, vec.q);
  __syncthreads();
  const int jmin = mr.lo, jmax = mr.hi;

  const int wlo = mr.ulo[rw], whi = mr.uhi[rw];  // the row group's keys: the mask policy below
  const int rA = rw * 16 + g, rB = rA + 8;  // this thread's two rows (block-local)
  const int64_t tA = p.q_row0 + lr0 + rA, tB = tA + 8;
  const int dsA = rA < nrows ? ds[tA] : INT32_MAX, dsB = rB < nrows ? ds[tB] : INT32_MAX;
  uint32_t mine = 0;  // the column tiles whose scores this warp computes
#pragma unroll
  for (int nt = 0; nt < kNt; ++nt)
    if (nt % kChunks == vc) mine |= 1u << nt;
  const float c2 = p.scale * kLog2e;  // scores in log2 units
  float mA = -INFINITY, mB = -INFINITY, lA = 0.f, lB = 0.f;
  float o[kDt][4];
  zero_acc(o);

  const __nv_bfloat16* kbase = bf(p.k) + b * p.k_bstride + hk * p.k_hstride;
  const __nv_bfloat16* vbase = bf(p.v) + b * p.v_bstride + hk * p.v_hstride + bv0;
  // The key tile at j0 into stage st's buffers, by cp.async (load_tile_async); two stages: tile
  // i + 1's copies are in flight while tile i's products run.
  auto issue = [&](int j0, int st) {
    __nv_bfloat16* K = stage0 + st * stage_elems;
    const int nk = min(T::kBk, jmax + 1 - j0);
    load_tile_async(K, ldq, kbase + int64_t(j0) * p.k_rstride, p.k_rstride, T::kBk, nk, p.Dqk, vec.k);
    if (!v_in_k)
      load_tile_async(K + T::kBk * ldq, ldv, vbase + int64_t(j0) * p.v_rstride, p.v_rstride, T::kBk, nk, bvn, vec.v);
  };
  pipeline_start(stages, jmin <= jmax, [&](int, int st) { issue(jmin, st); });
  int it = 0;
  for (int j0 = jmin; j0 <= jmax; j0 += T::kBk, ++it) {
    const int st = pipeline_step(stages, it, j0 + T::kBk <= jmax, [&](int ahead, int sb) { issue(j0 + ahead * T::kBk, sb); });
    const __nv_bfloat16* Ks = stage0 + st * stage_elems;
    // The warp's value columns: its chunk of the V tile, or of the K tile's first Dv columns.
    const __nv_bfloat16* Vw = v_in_k ? Ks + bv0 + vc * kDvChunk : Ks + T::kBk * ldq + vc * kDvChunk;

    // The mask as a policy: an 8-key column tile of the scores outside the row group's key range
    // is masked for all 16 of its rows, so no warp issues a product for it (nor, below, for a
    // 16-key step of P V whose two column tiles are both out), and a tile with no live column
    // costs the warp nothing: its softmax step would rescale by exactly 1 and add exact zeros.
    const uint32_t live = live_columns<kNt>(j0, wlo, whi);
    float s[kNt][4];
    if constexpr (kChunks == 1) {
      if (!live) continue;
      zero_acc(s);
      mma_abt_live(s, Qs, ldq, rw * 16, Ks, ldq, int(p.Dqk), lane, live);
    } else {
      if (live & mine) {
        zero_acc(s);
        mma_abt_live(s, Qs, ldq, rw * 16, Ks, ldq, int(p.Dqk), lane, live & mine);
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt) {
          if (!(((live & mine) >> nt) & 1u)) continue;
          float* top = Ss + rA * lds + nt * 8 + 2 * c;
          top[0] = s[nt][0], top[1] = s[nt][1], top[8 * lds] = s[nt][2], top[8 * lds + 1] = s[nt][3];
        }
      }
      __syncthreads();  // the row group's scores are in Ss
      if (!live) continue;
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          s[nt][e] = ((live >> nt) & 1u) ? Ss[(e < 2 ? rA : rB) * lds + nt * 8 + 2 * c + (e & 1)] : 0.f;
    }
    if (mr.whole(rw, j0, T::kBk)) {  // every row of the group sees the whole tile: no tests
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] *= c2;
    } else {  // (a branch, not `whole ||` in the test below: that spills the wide 128-column kernel at sm_80)
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt)  // mask; log2 units
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int64_t j = j0 + nt * 8 + 2 * c + (e & 1);
          const bool ok = e < 2 ? allowed(dsA, tA, j) : allowed(dsB, tB, j);
          s[nt][e] = ok ? s[nt][e] * c2 : -INFINITY;
        }
    }
    online_softmax_step(s, mA, mB, lA, lB, o);
    mma_acc_kn(o, s, Vw, ldv, dvn, lane, live);  // O += P V: P stays in registers as the A operand
  }

  // Finish: out = O / (l + exp(sink - m)), lse = ln(l + ...) + m; empty rows 0 and +inf.
  lA = quad_sum(lA), lB = quad_sum(lB);
  const float sink2 = p.sink ? p.sink[h] * kLog2e : 0.f;
  float invA, invB, lseA, lseB;
  softmax_finish(mA, lA, p.sink != nullptr, sink2, invA, lseA);
  softmax_finish(mB, lB, p.sink != nullptr, sink2, invB, lseB);
  __nv_bfloat16* out = bf(p.out);
#pragma unroll
  for (int dt = 0; dt < kDt; ++dt) {
    const int col = dv0 + dt * 8 + 2 * c;
    if (dt * 8 >= dvn) break;
    if (rA < nrows)
      *reinterpret_cast<uint32_t*>(out + ((int64_t(b) * p.sq + lr0 + rA) * p.H + h) * p.Dv + col) =
          pack_bf16(o[dt][0] * invA, o[dt][1] * invA);
    if (rB < nrows)
      *reinterpret_cast<uint32_t*>(out + ((int64_t(b) * p.sq + lr0 + rB) * p.H + h) * p.Dv + col) =
          pack_bf16(o[dt][2] * invB, o[dt][3] * invB);
  }
  if (chunk == 0 && vc == 0 && c == 0) {
    if (rA < nrows) p.lse[(int64_t(b) * p.H + h) * p.sq + lr0 + rA] = lseA;
    if (rB < nrows) p.lse[(int64_t(b) * p.H + h) * p.sq + lr0 + rB] = lseB;
  }
}

template <bool kWide, int kDvChunk, int kChunks>
void launch_fwd(const AttnDenseParams& p, VecFlags vec) {
  using T = AttnCudaTraits<kWide>;
  const int nchunks = int((p.Dv + kChunks * kDvChunk - 1) / (kChunks * kDvChunk));
  // Values read from the K tile when they are its first columns (the latent form); two pipeline
  // stages where they fit the smallest target's shared memory.
  const bool v_in_k = attn_v_in_k(p);
  const int stages = attn_fwd_smem<kWide>(p.Dqk, kDvChunk, kChunks, 2, v_in_k) <= kAttnMaxSmemBytes ? 2 : 1;
  const size_t smem = size_t(attn_fwd_smem<kWide>(p.Dqk, kDvChunk, kChunks, stages, v_in_k));
  check(cudaFuncSetAttribute(attn_dense_fwd_kernel<kWide, kDvChunk, kChunks>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
        "attn_dense_fwd: shared memory");
  dim3 grid(unsigned((p.sq + T::kRows - 1) / T::kRows), unsigned(p.H * nchunks), unsigned(p.b));
  HMLA_LAUNCH((attn_dense_fwd_kernel<kWide, kDvChunk, kChunks>), grid, 32 * T::kWarps * kChunks, smem,
              current_stream().get(), p, nchunks, vec, stages, v_in_k);
  check_launch("attn_dense_fwd");
}

}  // namespace

void attn_dense_fwd(const AttnDenseParams& p) {
  if (p.b == 0 || p.sq == 0) return;
#ifdef HMLA_HAVE_CUDNN
  if (plan(Op::attn_dense_fwd, p).variant == Variant::cudnn && cudnn_attn_fwd(p)) return;  // else cuDNN refused the graph
#endif
  // Value heads up to 256 wide keep their whole output in one warp's registers; wider ones (the
  // 512 of the latent form) split it over the warps of one block, 256 columns each, sharing the
  // scores (attn_fwd_dv_chunk, attn_fwd_chunks).
  constexpr int kOne = AttnCudaTraits<false>::kDvChunk, kMax = AttnCudaTraits<false>::kDvChunkMax;
  const VecFlags vec = vec_flags(p);
  const bool one = attn_fwd_dv_chunk(p) == kOne;
  if (attn_fwd_chunks(p) > 1) launch_fwd<true, kMax, 2>(p, vec);  // Dv > 256: a wide head
  else if (attn_is_wide(p)) one ? launch_fwd<true, kOne, 1>(p, vec) : launch_fwd<true, kMax, 1>(p, vec);
  else one ? launch_fwd<false, kOne, 1>(p, vec) : launch_fwd<false, kMax, 1>(p, vec);
}

// The plan of both passes (cuda_kernels.h): the hand-written tensor-core kernels take bf16 with
// Dqk and Dv multiples of kMmaK and tiles within the smallest target's shared memory
// (attn_dense.cuh); on those, cuDNN runs where p.backend allows it and cuDNN takes p, and a
// backend of cudnn that cuDNN declines is refused with cuDNN's reason.
Plan plan(Op, const AttnDenseParams& p) {
  const bool ours = p.dtype == DType::bf16 && p.Dqk % kMmaK == 0 && p.Dv % kMmaK == 0 &&
                    attn_dense_smem_bytes(p) <= kAttnMaxSmemBytes;
  if (!ours) return {};
  if (p.backend == AttnBackend::hmla) return {Variant::mma, {}};
  const char* why = attn_cudnn_declines(p);
  if (!why) return {Variant::cudnn, {}};
  if (p.backend == AttnBackend::cudnn) return {Variant::none, std::string("attention backend cudnn: ") + why};
  return {Variant::mma, {}};
}

}  // namespace hmla::cuda
