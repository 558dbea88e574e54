// Dense per-document causal attention backward on the GPU (bf16 in and out, f32 accumulation),
// deterministic by construction: no atomics, each output element written by one thread.
//   D[t] = rowsum(dO * O);  P = exp(scale q.k - lse);  dS = P (dO.v - D)
//   dq = scale dS K  (kernel dq: blocks own query rows, walk their key range)
//   dk = scale dS^T Q, dv = P^T dO  (kernel dkdv: blocks own keys of one kv head, walk every
//        query of its head group that sees them, heads in order)
// Both recompute P from q, k and the saved lse (flash style; nothing of size s*s). Gradient
// columns come in chunks of kChunk (128; 256 for wide heads) per block so accumulators stay in registers at any head width;
// each chunk recomputes its scores, a price a Hopper (wgmma) kernel would not pay (none yet). dsink[h] =
// -sum_t exp(sink_h - lse[t]) D[t] by a fixed-order block reduction.
#include <cuda_bf16.h>

#include "attn_cudnn.h"
#include "attn_dense.cuh"
#include "hmla/core/tensor.h"
#include "mma.cuh"
#include "runtime.h"

namespace hmla::cuda {

namespace {

// D[b, h, t] = sum_c dO[t, h, c] O[t, h, c]; one warp per (row, head).
__global__ void rowdot_kernel(const __nv_bfloat16* out, const __nv_bfloat16* dout, int64_t rows, int64_t sq, int64_t H,
                              int64_t Dv, float* D) {
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= rows * H) return;
  const int64_t row = w / H, h = w % H;  // row = b * sq + t
  const __nv_bfloat16* o = out + (row * H + h) * Dv;
  const __nv_bfloat16* d = dout + (row * H + h) * Dv;
  float acc = 0.f;
  for (int64_t c = lane; c < Dv; c += 32) acc += __bfloat162float(o[c]) * __bfloat162float(d[c]);
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) D[((row / sq) * H + h) * sq + row % sq] = acc;
}

// dsink[h] += -sum over (b, t) with finite lse of exp(sink_h - lse) D; one block per head.
__global__ void dsink_kernel(const float* lse, const float* D, const float* sink, int64_t b, int64_t sq, int64_t H,
                             float* dsink) {
  __shared__ float part[256];
  const int h = blockIdx.x;
  float acc = 0.f;
  for (int64_t i = threadIdx.x; i < b * sq; i += blockDim.x) {
    const int64_t k = ((i / sq) * H + h) * sq + i % sq;
    const float l = lse[k];
    if (l != INFINITY) acc -= expf(sink[h] - l) * D[k];
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int n = blockDim.x / 2; n > 0; n /= 2) {
    if (threadIdx.x < n) part[threadIdx.x] += part[threadIdx.x + n];
    __syncthreads();
  }
  if (threadIdx.x == 0) dsink[h] += part[0];  // a parameter's gradient: added (hmla/ops/nn.h)
}

// dq for kRows query rows of one (b, h) and one chunk of kChunk columns.
template <bool kWide>
__global__ void __launch_bounds__(32 * AttnCudaTraits<kWide>::kWarps)
    attn_bwd_dq_kernel(const AttnDenseParams p, const float* D, int nchunks, VecFlags vec) {
  using T = AttnCudaTraits<kWide>;
  constexpr int kNt = T::kBk / 8, kCt = T::kChunk / 8;
  HMLA_DYNAMIC_SHARED(unsigned char, smem);
  const int ldq = p.Dqk + T::kPad, ldv = p.Dv + T::kPad, ldt = T::kBk + T::kPad;
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem);  // [kRows, Dqk]
  __nv_bfloat16* dOs = Qs + T::kRows * ldq;                      // [kRows, Dv]
  __nv_bfloat16* Ks = dOs + T::kRows * ldv;                      // [kBk, Dqk]
  __nv_bfloat16* Vs = Ks + T::kBk * ldq;                         // [kBk, Dv]
  __nv_bfloat16* Kt = Vs + T::kBk * ldv;                         // [kChunk, kBk]: K's chunk, transposed
  __shared__ int range[2], wrange[T::kWarps][2];

  const int tiles = (p.sq + T::kRows - 1) / T::kRows;
  const int tile = tiles - 1 - blockIdx.x;
  const int h = blockIdx.y / nchunks, chunk = blockIdx.y % nchunks, b = blockIdx.z;
  const int hk = h / (p.H / p.Hkv);
  const int c0 = chunk * T::kChunk, cn = min(T::kChunk, int(p.Dqk) - c0);
  const int lr0 = tile * T::kRows, nrows = min(T::kRows, int(p.sq) - lr0);
  const int32_t* ds = p.doc_start + int64_t(b) * p.s;

  // The block's key range and each warp's (the forward's mask policy, attn_dense_fwd.cu).
  if (threadIdx.x <= T::kWarps) {
    int* r = threadIdx.x == T::kWarps ? range : wrange[threadIdx.x];
    r[0] = INT32_MAX, r[1] = -1;
  }
  __syncthreads();
  if (threadIdx.x < nrows) {
    const int64_t t = p.q_row0 + lr0 + threadIdx.x;
    if (ds[t] <= t) {
      atomicMin(&range[0], ds[t]);
      atomicMax(&range[1], int(t));
      atomicMin(&wrange[threadIdx.x / 16][0], ds[t]);
      atomicMax(&wrange[threadIdx.x / 16][1], int(t));
    }
  }
  load_tile(Qs, ldq, bf(p.q) + b * p.q_bstride + int64_t(lr0) * p.q_rstride + h * p.q_hstride, p.q_rstride,
            T::kRows, nrows, p.Dqk, vec.q);
  load_tile(dOs, ldv, bf(p.dout) + ((int64_t(b) * p.sq + lr0) * p.H + h) * p.Dv, p.H * p.Dv, T::kRows, nrows, p.Dv,
            vec.o);
  __syncthreads();
  const int jmin = range[0], jmax = range[1];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int rA = warp * 16 + g, rB = rA + 8;
  const int wlo = wrange[warp][0], whi = wrange[warp][1];
  const int64_t tA = p.q_row0 + lr0 + rA, tB = tA + 8;
  const int dsA = rA < nrows ? ds[tA] : INT32_MAX, dsB = rB < nrows ? ds[tB] : INT32_MAX;
  const int64_t lrow = (int64_t(b) * p.H + h) * p.sq + lr0;
  const float lseA = rA < nrows ? p.lse[lrow + rA] * kLog2e : INFINITY;
  const float lseB = rB < nrows ? p.lse[lrow + rB] * kLog2e : INFINITY;
  const float DA = rA < nrows ? D[lrow + rA] : 0.f, DB = rB < nrows ? D[lrow + rB] : 0.f;
  const float c2 = p.scale * kLog2e;
  float dq[kCt][4];
  zero_acc(dq);

  const __nv_bfloat16* kbase = bf(p.k) + b * p.k_bstride + hk * p.k_hstride;
  const __nv_bfloat16* vbase = bf(p.v) + b * p.v_bstride + hk * p.v_hstride;
  for (int j0 = jmin; j0 <= jmax; j0 += T::kBk) {
    const int nk = min(T::kBk, jmax + 1 - j0);
    __syncthreads();
    load_tile(Ks, ldq, kbase + int64_t(j0) * p.k_rstride, p.k_rstride, T::kBk, nk, p.Dqk, vec.k);
    load_tile(Vs, ldv, vbase + int64_t(j0) * p.v_rstride, p.v_rstride, T::kBk, nk, p.Dv, vec.v);
    load_tile_t(Kt, ldt, kbase + int64_t(j0) * p.k_rstride + c0, p.k_rstride, T::kBk, nk, cn);
    __syncthreads();

    // Column tiles outside the warp's key range are masked for all its rows: no products (their
    // dS is +-0, which adds nothing to dq).
    const uint32_t live = live_columns<kNt>(j0, wlo, whi);
    if (!live) continue;
    float s[kNt][4], dp[kNt][4];
    zero_acc(s);
    zero_acc(dp);
    mma_abt_live(s, Qs, ldq, warp * 16, Ks, ldq, int(p.Dqk), lane, live);
    mma_abt_live(dp, dOs, ldv, warp * 16, Vs, ldv, int(p.Dv), lane, live);
    // dS = P (dP - D) * scale, in place of s.
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t j = j0 + nt * 8 + 2 * c + (e & 1);
        const bool lo = e < 2;
        const bool ok = lo ? allowed(dsA, tA, j) : allowed(dsB, tB, j);
        const float pr = ok ? exp2f(s[nt][e] * c2 - (lo ? lseA : lseB)) : 0.f;
        s[nt][e] = pr * (dp[nt][e] - (lo ? DA : DB)) * p.scale;
      }
    mma_acc_x(dq, s, Kt, ldt, cn, lane, live);
  }
  __nv_bfloat16* dQ = bf(p.dq);
#pragma unroll
  for (int ct = 0; ct < kCt; ++ct) {
    if (ct * 8 >= cn) break;
    const int col = c0 + ct * 8 + 2 * c;
    if (rA < nrows)
      *reinterpret_cast<uint32_t*>(dQ + ((int64_t(b) * p.sq + lr0 + rA) * p.H + h) * p.Dqk + col) =
          pack_bf16(dq[ct][0], dq[ct][1]);
    if (rB < nrows)
      *reinterpret_cast<uint32_t*>(dQ + ((int64_t(b) * p.sq + lr0 + rB) * p.H + h) * p.Dqk + col) =
          pack_bf16(dq[ct][2], dq[ct][3]);
  }
}

// dk (chunks [0, nk_chunks)) or dv (the rest) for kRows keys of one (b, kv head): the keys'
// queries are [max(j0, q_row0), max doc_end - 1] within the local rows; heads of the group in order.
template <bool kWide>
__global__ void __launch_bounds__(32 * AttnCudaTraits<kWide>::kWarps)
    attn_bwd_dkdv_kernel(const AttnDenseParams p, const float* D, int nk_chunks, int nchunks, VecFlags vec) {
  using T = AttnCudaTraits<kWide>;
  constexpr int kNt = T::kBk / 8, kCt = T::kChunk / 8;
  HMLA_DYNAMIC_SHARED(unsigned char, smem);
  const int ldq = p.Dqk + T::kPad, ldv = p.Dv + T::kPad, ldt = T::kBk + T::kPad;
  __nv_bfloat16* Ks = reinterpret_cast<__nv_bfloat16*>(smem);  // [kRows, Dqk] this block's keys
  __nv_bfloat16* Vs = Ks + T::kRows * ldq;                       // [kRows, Dv]
  __nv_bfloat16* Qs = Vs + T::kRows * ldv;                       // [kBk, Dqk] a query tile
  __nv_bfloat16* dOs = Qs + T::kBk * ldq;                        // [kBk, Dv]
  __nv_bfloat16* Xt = dOs + T::kBk * ldv;                        // [kChunk, kBk]: Q's or dO's chunk, transposed
  __shared__ int range[2], wrange[T::kWarps][2];

  const int ktiles = (p.s + T::kRows - 1) / T::kRows;
  const int ktile = ktiles - 1 - blockIdx.x;  // early keys have the most queries
  const int hk = blockIdx.y / nchunks, chunk = blockIdx.y % nchunks, b = blockIdx.z;
  const bool is_dk = chunk < nk_chunks;
  const int c0 = (is_dk ? chunk : chunk - nk_chunks) * T::kChunk;
  const int cn = min(T::kChunk, int(is_dk ? p.Dqk : p.Dv) - c0);
  const int j0 = ktile * T::kRows, nkeys = min(T::kRows, int(p.s) - j0);
  const int32_t* ds = p.doc_start + int64_t(b) * p.s;
  const int32_t* de = p.doc_end + int64_t(b) * p.s;

  // Queries that see these keys: t in [j, doc_end[j] - 1], intersected with the local rows.
  // Each warp's (its 16 keys') query range too: the mask policy of the other kernels, transposed.
  if (threadIdx.x <= T::kWarps) {
    int* r = threadIdx.x == T::kWarps ? range : wrange[threadIdx.x];
    r[0] = INT32_MAX, r[1] = -1;
  }
  __syncthreads();
  if (threadIdx.x < nkeys) {
    const int j = j0 + threadIdx.x;
    if (ds[j] <= j) {
      atomicMin(&range[0], j);
      atomicMax(&range[1], de[j] - 1);
      atomicMin(&wrange[threadIdx.x / 16][0], j);
      atomicMax(&wrange[threadIdx.x / 16][1], de[j] - 1);
    }
  }
  const __nv_bfloat16* kbase = bf(p.k) + b * p.k_bstride + hk * p.k_hstride;
  const __nv_bfloat16* vbase = bf(p.v) + b * p.v_bstride + hk * p.v_hstride;
  load_tile(Ks, ldq, kbase + int64_t(j0) * p.k_rstride, p.k_rstride, T::kRows, nkeys, p.Dqk, vec.k);
  if (is_dk) load_tile(Vs, ldv, vbase + int64_t(j0) * p.v_rstride, p.v_rstride, T::kRows, nkeys, p.Dv, vec.v);
  __syncthreads();
  const int64_t tmin = range[0] > p.q_row0 ? int64_t(range[0]) : p.q_row0;
  const int64_t tmax = range[1] < p.q_row0 + p.sq - 1 ? int64_t(range[1]) : p.q_row0 + p.sq - 1;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int64_t jA = j0 + warp * 16 + g, jB = jA + 8;  // this thread's two keys
  const int wlo = wrange[warp][0], whi = wrange[warp][1];
  const float c2 = p.scale * kLog2e;
  float acc[kCt][4];
  zero_acc(acc);

  const int group = int(p.H / p.Hkv);
  for (int h = hk * group; h < (hk + 1) * group; ++h) {
    const __nv_bfloat16* qbase = bf(p.q) + b * p.q_bstride + h * p.q_hstride;
    const __nv_bfloat16* obase = bf(p.dout) + (int64_t(b) * p.sq * p.H + h) * p.Dv;
    const int64_t lrow = (int64_t(b) * p.H + h) * p.sq;
    for (int64_t t0 = tmin; t0 <= tmax; t0 += T::kBk) {
      const int nq = int(tmax + 1 - t0 < T::kBk ? tmax + 1 - t0 : T::kBk);
      const int64_t lt0 = t0 - p.q_row0;  // local row of the tile's first query
      __syncthreads();
      load_tile(Qs, ldq, qbase + lt0 * p.q_rstride, p.q_rstride, T::kBk, nq, p.Dqk, vec.q);
      load_tile(dOs, ldv, obase + lt0 * p.H * p.Dv, p.H * p.Dv, T::kBk, nq, p.Dv, vec.o);
      if (is_dk) load_tile_t(Xt, ldt, qbase + lt0 * p.q_rstride + c0, p.q_rstride, T::kBk, nq, cn);
      else load_tile_t(Xt, ldt, obase + lt0 * p.H * p.Dv + c0, p.H * p.Dv, T::kBk, nq, cn);
      __syncthreads();

      // S^T = K Q^T (rows: keys, columns: queries), then P^T; query tiles outside the warp's
      // range are masked for all its keys: no products.
      const uint32_t live = live_columns<kNt>(t0, wlo, whi);
      if (!live) continue;
      float s[kNt][4];
      zero_acc(s);
      mma_abt_live<kNt, true>(s, Ks, ldq, warp * 16, Qs, ldq, int(p.Dqk), lane, live);  // unrolled, it spills
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qi = nt * 8 + 2 * c + (e & 1);
          const int64_t t = t0 + qi, j = e < 2 ? jA : jB;
          const bool ok = qi < nq && j < p.s && allowed(ds[t], t, j);
          s[nt][e] = ok ? exp2f(s[nt][e] * c2 - p.lse[lrow + t - p.q_row0] * kLog2e) : 0.f;
        }
      if (is_dk) {  // dS^T = P^T (dP^T - D) scale with dP^T = V dO^T
        float dp[kNt][4];
        zero_acc(dp);
        mma_abt_live<kNt, true>(dp, Vs, ldv, warp * 16, dOs, ldv, int(p.Dv), lane, live);
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int qi = nt * 8 + 2 * c + (e & 1);
            const float Dq = qi < nq ? D[lrow + t0 + qi - p.q_row0] : 0.f;
            s[nt][e] = s[nt][e] * (dp[nt][e] - Dq) * p.scale;
          }
      }
      mma_acc_x(acc, s, Xt, ldt, cn, lane, live);  // acc += (dS^T or P^T) X, X = Q or dO (Xt holds X^T)
    }
  }
  // Keys no local query sees (and padding keys) get zeros, written like the rest.
  __nv_bfloat16* out = bf(is_dk ? p.dk : p.dv);
  const int64_t width = is_dk ? p.Dqk : p.Dv;
#pragma unroll
  for (int ct = 0; ct < kCt; ++ct) {
    if (ct * 8 >= cn) break;
    const int col = c0 + ct * 8 + 2 * c;
    if (jA < j0 + nkeys)
      *reinterpret_cast<uint32_t*>(out + ((int64_t(b) * p.s + jA) * p.Hkv + hk) * width + col) =
          pack_bf16(acc[ct][0], acc[ct][1]);
    if (jB < j0 + nkeys)
      *reinterpret_cast<uint32_t*>(out + ((int64_t(b) * p.s + jB) * p.Hkv + hk) * width + col) =
          pack_bf16(acc[ct][2], acc[ct][3]);
  }
}

template <bool kWide>
void launch_bwd(const AttnDenseParams& p, const float* D, VecFlags vec) {
  using T = AttnCudaTraits<kWide>;
  cudaStream_t st = current_stream().get();
  const size_t smem = size_t(attn_bwd_smem<kWide>(p.Dqk, p.Dv));
  if (p.sq > 0) {  // without query rows dq is empty, and dk/dv below come out zero
    const int nchunks = int((p.Dqk + T::kChunk - 1) / T::kChunk);
    check(cudaFuncSetAttribute(attn_bwd_dq_kernel<kWide>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
          "attn_dense_bwd dq: shared memory");
    dim3 grid(unsigned((p.sq + T::kRows - 1) / T::kRows), unsigned(p.H * nchunks), unsigned(p.b));
    HMLA_LAUNCH(attn_bwd_dq_kernel<kWide>, grid, 32 * T::kWarps, smem, st, p, D, nchunks, vec);
    check_launch("attn_dense_bwd dq");
  }
  {
    const int nk = int((p.Dqk + T::kChunk - 1) / T::kChunk), nv = int((p.Dv + T::kChunk - 1) / T::kChunk);
    check(cudaFuncSetAttribute(attn_bwd_dkdv_kernel<kWide>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
          "attn_dense_bwd dkdv: shared memory");
    dim3 grid(unsigned((p.s + T::kRows - 1) / T::kRows), unsigned(p.Hkv * (nk + nv)), unsigned(p.b));
    HMLA_LAUNCH(attn_bwd_dkdv_kernel<kWide>, grid, 32 * T::kWarps, smem, st, p, D, nk, nk + nv, vec);
    check_launch("attn_dense_bwd dkdv");
  }
}

}  // namespace

void launch_rowdot(const __nv_bfloat16* out, const __nv_bfloat16* dout, int64_t b, int64_t sq, int64_t H, int64_t Dv,
                   float* D) {
  if (b * sq * H == 0) return;
  HMLA_LAUNCH(rowdot_kernel, unsigned((b * sq * H * 32 + 255) / 256), 256, 0, current_stream().get(), out, dout, b * sq,
              sq, H, Dv, D);
  check_launch("attention backward: rowsum(dO * O)");
}

void launch_dsink(const float* lse, const float* D, const float* sink, int64_t b, int64_t sq, int64_t H, float* dsink) {
  HMLA_LAUNCH(dsink_kernel, unsigned(H), 256, 0, current_stream().get(), lse, D, sink, b, sq, H, dsink);
  check_launch("attention backward: dsink");
}

void attn_dense_bwd(const AttnDenseParams& p) {
  if (p.b == 0 || p.s == 0) return;
  if (attn_use_cudnn(p)) {  // false (or an error for backend cudnn) in a build without cuDNN
#ifdef HMLA_HAVE_CUDNN
    if (cudnn_attn_bwd(p)) return;
#endif
  }
  Tensor D = Tensor::empty({p.b, p.H, p.sq}, DType::f32, Device::cuda);
  launch_rowdot(bf(p.out), bf(p.dout), p.b, p.sq, p.H, p.Dv, D.data<float>());
  if (attn_is_wide(p)) launch_bwd<true>(p, D.data<float>(), vec_flags(p));
  else launch_bwd<false>(p, D.data<float>(), vec_flags(p));
  if (p.dsink) launch_dsink(p.lse, D.data<float>(), p.sink, p.b, p.sq, p.H, p.dsink);
  // D is freed (returned to the cache) when this returns; the stream orders its reuse.
}

}  // namespace hmla::cuda
