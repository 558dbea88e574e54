// The MoE ops on the GPU (hmla/ops/moe.h, docs/moe.md), with the CPU kernels' formulas and orders.
// Deterministic by construction: no atomics; each output value is written by one thread.
//   - Router (forward and backward): a thread per token, the CPU's comparisons and sums in its
//     order; the per-expert values are recomputed where the CPU keeps a row of them (a thread has
//     no [E] array), the kept groups are a 64-bit mask (n_group <= 64: the plan).
//   - Dispatch: one block, a thread per expert (strided): its count over all slots in slot order,
//     one thread's exclusive scan, then each expert's slots in slot order: the CPU's stable sort.
//   - Gather, combine: a thread per value (combine: its k slots in slot order, then the add);
//     rowdot: a thread per slot, d ascending.
//   - Grouped products: SIMT tiles of 32 x 32 in f32 from bf16-rounded operands (gemm.cu's
//     contract: each input rounded to bf16, f32 sums, alpha acc + beta c rounded once). y and dx:
//     a block per (column tile, row tile of one expert), the expert found from the device offsets;
//     dW: a block per (column tile, row tile, expert) summing its expert's rows in order.
// What is left for speed (docs/cuda.md): the products on mma.sync, the dispatch's O(E x slots)
// scans, a warp per slot for rowdot.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cuda_kernels.h"
#include "runtime.h"
#include "strided.cuh"
#include "traits.h"

namespace hmla::cuda {

namespace {

using T = MoeTraits;

cudaStream_t stream() { return current_stream().get(); }

#define HMLA_MOE_GRID_STRIDE(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

unsigned grid_for(int64_t n) { return unsigned(std::min<int64_t>((n + T::kThreads - 1) / T::kThreads, 65535)); }

// An f32 or bf16 element as f32 (bf16 widened exactly).
__device__ __forceinline__ float value(const void* p, DType dt, int64_t i) {
  return dt == DType::bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i])
                           : static_cast<const float*>(p)[i];
}
// An element as a product's input: rounded to bf16 (RNE), as the products' contract says.
__device__ __forceinline__ float operand(const void* p, DType dt, int64_t i) {
  return dt == DType::bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i])
                           : __bfloat162float(__float2bfloat16_rn(static_cast<const float*>(p)[i]));
}
__device__ __forceinline__ void store(void* p, DType dt, int64_t i, float v) {
  if (dt == DType::bf16)
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  else
    static_cast<float*>(p)[i] = v;
}

// ---- router -------------------------------------------------------------------------------------

// a ranks before b: larger value, or equal value and smaller index (docs/moe.md's tie rule).
__device__ __forceinline__ bool before(float va, int64_t a, float vb, int64_t b) {
  return va > vb || (va == vb && a < b);
}
__device__ __forceinline__ float sigmoid(float u) { return 1.f / (1.f + expf(-u)); }
// The score s(u): sigmoid, or DeepSeek-V4's sqrt(softplus(u)) (torch's softplus: u itself above 20),
// and ds/du at u with score s (0 where s underflowed to 0), as src/cpu/moe.cpp forms them.
__device__ __forceinline__ float score_of(MoeScore f, float u) {
  return f == MoeScore::sigmoid ? sigmoid(u) : sqrtf(u > 20.f ? u : log1pf(expf(u)));
}
__device__ __forceinline__ float dscore(MoeScore f, float u, float s) {
  if (f == MoeScore::sigmoid) return s * (1.f - s);
  return s > 0.f ? (u > 20.f ? 1.f : sigmoid(u)) / (2.f * s) : 0.f;
}
// Expert e's choice value c = s + bias.
__device__ __forceinline__ float choice(const MoeRouteParams& p, const float* u, int64_t e) {
  const float s = score_of(p.score_fn, u[e]);
  return p.bias ? s + p.bias[e] : s;
}
// Group g's score: its largest choice value plus its second largest (the CPU's scan).
__device__ float group_score(const MoeRouteParams& p, const float* u, int64_t g, int64_t per) {
  int64_t b1 = -1, b2 = -1;
  float c1 = 0.f, c2 = 0.f;
  for (int64_t e = g * per; e < (g + 1) * per; ++e) {
    const float c = choice(p, u, e);
    if (b1 < 0 || before(c, e, c1, b1)) {
      b2 = b1, c2 = c1, b1 = e, c1 = c;
    } else if (b2 < 0 || before(c, e, c2, b2)) {
      b2 = e, c2 = c;
    }
  }
  return c1 + c2;
}

__global__ void route_fwd_kernel(MoeRouteParams p) {
  const int64_t E = p.E, k = p.k, G = p.n_group, per = E / G;
  HMLA_MOE_GRID_STRIDE(t, p.N) {
    const float* u = p.logits + t * E;
    int32_t* idx = p.idx + t * k;
    uint64_t keep = 0;
    for (int64_t r = 0; r < p.topk_group && !p.fixed; ++r) {  // the best topk_group groups
      int64_t best = G;
      float best_score = 0.f;
      for (int64_t g = 0; g < G; ++g) {
        if ((keep >> g) & 1) continue;
        const float sc = group_score(p, u, g, per);
        if (best == G || before(sc, g, best_score, best)) best = g, best_score = sc;
      }
      if (best < G) keep |= uint64_t(1) << best;
    }
    for (int64_t j = 0; j < k; ++j) {  // the k experts of the kept groups by descending c
      if (p.fixed) {                     // hash routing: the experts are given
        idx[j] = p.fixed[t * k + j];
        continue;
      }
      int64_t best = -1;
      float best_c = 0.f;
      for (int64_t e = 0; e < E; ++e) {
        if (!((keep >> (e / per)) & 1)) continue;
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) taken |= idx[i] == e;
        if (taken) continue;
        const float c = choice(p, u, e);
        if (best < 0 || before(c, e, best_c, best)) best = e, best_c = c;
      }
      idx[j] = int32_t(best);
    }
    float* sc = p.score + t * k;
    float* w = p.weight + t * k;
    float sum = 0.f;
    for (int64_t j = 0; j < k; ++j) {
      sc[j] = score_of(p.score_fn, u[idx[j]]);
      sum += sc[j];
    }
    const float den = p.norm_topk_prob ? sum + 1e-20f : 1.f;
    for (int64_t j = 0; j < k; ++j) w[j] = (p.norm_topk_prob ? sc[j] / den : sc[j]) * p.scaling;
  }
}

// dL/ds_j = (scaling dw_j - sum_i dw_i w_i) / D, du_j = dL/ds_j ds/du (src/cpu/moe.cpp).
__global__ void route_bwd_kernel(MoeRouteParams p) {
  const int64_t E = p.E, k = p.k;
  HMLA_MOE_GRID_STRIDE(t, p.N) {
    float* du = p.dlogits + t * E;
    for (int64_t e = 0; e < E; ++e) du[e] = 0.f;
    const float* s = p.score_in + t * k;
    const float* dw = p.dweight + t * k;
    const int32_t* idx = p.idx_in + t * k;
    float den = 1.f, q = 0.f;
    if (p.norm_topk_prob) {
      float sum = 0.f;
      for (int64_t j = 0; j < k; ++j) sum += s[j];
      den = sum + 1e-20f;
      for (int64_t i = 0; i < k; ++i) q += dw[i] * (s[i] / den * p.scaling);
    }
    for (int64_t j = 0; j < k; ++j) {
      const float ds = (p.scaling * dw[j] - q) / den;
      const float u = p.logits ? p.logits[t * E + idx[j]] : 0.f;
      du[idx[j]] = ds * dscore(p.score_fn, u, s[j]);
    }
  }
}

// ---- dispatch -----------------------------------------------------------------------------------

// One block: counts, their scan, then each expert's slots in slot order (a stable counting sort
// with no atomics: every count and every position has one writer).
__global__ void dispatch_kernel(MoeDispatchParams p) {
  const int64_t slots = p.N * p.k;
  for (int64_t e = threadIdx.x; e < p.E; e += blockDim.x) {
    int32_t n = 0;
    for (int64_t i = 0; i < slots; ++i) n += p.idx[i] == e;
    p.offsets[e + 1] = n;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    p.offsets[0] = 0;
    for (int64_t e = 0; e < p.E; ++e) p.offsets[e + 1] += p.offsets[e];
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < p.E; e += blockDim.x) {
    int32_t r = p.offsets[e];
    for (int64_t i = 0; i < slots; ++i)
      if (p.idx[i] == e) {
        p.order[r] = int32_t(i);
        p.pos[i] = r++;
      }
  }
}

// ---- rows ---------------------------------------------------------------------------------------

__global__ void gather_kernel(MoeRowsParams p) {
  HMLA_MOE_GRID_STRIDE(v, p.N * p.k * p.D) {
    const int64_t i = v / p.D, d = v % p.D, slot = p.order[i], r = p.from_tokens ? slot / p.k : i;
    const float x = value(p.src, p.src_dtype, r * p.ld_src + d);
    p.out[i * p.ld_out + d] = p.w ? x * p.w[slot] : x;
  }
}

__global__ void combine_kernel(MoeRowsParams p) {
  const float* src = static_cast<const float*>(p.src);
  HMLA_MOE_GRID_STRIDE(v, p.N * p.D) {
    const int64_t t = v / p.D, d = v % p.D;
    float acc = 0.f;
    for (int64_t j = 0; j < p.k; ++j) {
      const int64_t slot = t * p.k + j;
      acc += (p.w ? p.w[slot] : 1.f) * src[int64_t(p.pos[slot]) * p.ld_src + d];
    }
    float* out = p.out + t * p.ld_out + d;
    *out = p.accumulate ? *out + acc : acc;
  }
}

__global__ void rowdot_kernel(MoeRowsParams p) {
  HMLA_MOE_GRID_STRIDE(i, p.N * p.k) {
    float sum = 0.f;
    for (int64_t d = 0; d < p.D; ++d) sum += value(p.a, p.a_dtype, i * p.D + d) * value(p.b, p.b_dtype, i * p.D + d);
    p.out[p.order[i]] = sum;
  }
}

// ---- grouped products ---------------------------------------------------------------------------

// The three products: y = x W_e^T (fwd), dx = dy W_e + beta dx (dx), dW_e += dy_e^T x_e (dw).
enum class Product { fwd, dx, dw };

// Expert e's matrix as the kernels address it: base + e * stride elements (one arena).
struct Experts {
  const void* w = nullptr;  // expert 0's weight
  int64_t w_stride_bytes = 0;
  float* dw = nullptr;      // expert 0's gradient (dw)
  int64_t dw_stride = 0;
};

// Which expert and row tile of it block row `tile` is (tiles numbered expert after expert); false
// past the last expert's tiles.
__device__ bool find_tile(const int32_t* offsets, int64_t E, int64_t tile, int64_t& e, int64_t& r0, int64_t& r1) {
  for (e = 0; e < E; ++e) {
    const int64_t n = offsets[e + 1] - offsets[e], tiles = (n + T::kTile - 1) / T::kTile;
    if (tile < tiles) {
      r0 = offsets[e] + tile * T::kTile;
      r1 = offsets[e + 1];
      return true;
    }
    tile -= tiles;
  }
  return false;
}

// A block computes a kTile x kTile output tile; thread (tx, ty) owns column tx and rows ty + 8 q.
// A(m, kk) and B(kk, n) come into shared memory rounded to bf16, kTile values of kk at a time, and
// each output sums its products kk ascending.
template <Product kP>
__global__ void grouped_kernel(MoeGroupedParams p, Experts ex) {
  __shared__ float As[T::kTile][T::kTile + 1], Bs[T::kTile][T::kTile + 1];
  __shared__ int64_t tile_e, tile_r0, tile_r1;
  const int tx = threadIdx.x % T::kTile, ty = threadIdx.x / T::kTile;
  int64_t e, m0, m_end, K;  // output rows [m0, m_end) of this tile's matrix, reduction length K
  if (kP == Product::dw) {
    e = blockIdx.z;
    m0 = int64_t(blockIdx.y) * T::kTile, m_end = p.out, K = p.offsets[e + 1] - p.offsets[e];
    if (K == 0 || m0 >= m_end) return;  // dW_e += 0
  } else {
    if (threadIdx.x == 0) {
      int64_t fe = -1, r0 = 0, r1 = 0;
      if (!find_tile(p.offsets, p.E, blockIdx.y, fe, r0, r1)) fe = -1;
      tile_e = fe, tile_r0 = r0, tile_r1 = r1;
    }
    __syncthreads();
    if (tile_e < 0) return;  // past the last expert's rows (the whole block exits)
    e = tile_e, m0 = tile_r0, m_end = tile_r1, K = kP == Product::fwd ? p.in : p.out;
  }
  const int64_t n_cols = kP == Product::fwd ? p.out : p.in, n0 = int64_t(blockIdx.x) * T::kTile;
  const char* W = static_cast<const char*>(ex.w) + e * ex.w_stride_bytes;
  const int64_t k_base = kP == Product::dw ? p.offsets[e] : 0;  // dw: the expert's rows are the sum
  float acc[T::kRowsPerThread] = {};
  for (int64_t k0 = 0; k0 < K; k0 += T::kTile) {
    for (int l = threadIdx.x; l < T::kTile * T::kTile; l += T::kThreads) {
      const int a = l / T::kTile, b = l % T::kTile;  // As[a][b]: row a, kk b; Bs[a][b]: kk a, column b
      const int64_t m = m0 + a, kk = k0 + b, ka = k0 + a, n = n0 + b;
      float av = 0.f, bv = 0.f;
      if (m < m_end && kk < K) {
        if (kP == Product::fwd) av = operand(p.x, p.x_dtype, m * p.ld_x + kk);
        if (kP == Product::dx) av = operand(p.y, p.y_dtype, m * p.ld_y + kk);
        if (kP == Product::dw) av = operand(p.y, p.y_dtype, (k_base + kk) * p.ld_y + m);
      }
      if (ka < K && n < n_cols) {
        if (kP == Product::fwd) bv = operand(W, p.w_dtype, n * p.in + ka);
        if (kP == Product::dx) bv = operand(W, p.w_dtype, ka * p.in + n);
        if (kP == Product::dw) bv = operand(p.x, p.x_dtype, (k_base + ka) * p.ld_x + n);
      }
      As[a][b] = av;
      Bs[a][b] = bv;
    }
    __syncthreads();
    const int64_t kn = K - k0 < T::kTile ? K - k0 : T::kTile;
    for (int64_t kk = 0; kk < kn; ++kk)
      for (int q = 0; q < T::kRowsPerThread; ++q) acc[q] += As[ty + q * T::kRowGroups][kk] * Bs[kk][tx];
    __syncthreads();
  }
  const int64_t n = n0 + tx;
  if (n >= n_cols) return;
  for (int q = 0; q < T::kRowsPerThread; ++q) {
    const int64_t m = m0 + ty + q * T::kRowGroups;
    if (m >= m_end) continue;
    if (kP == Product::fwd) store(p.y, p.y_dtype, m * p.ld_y + n, acc[q]);
    if (kP == Product::dx) {
      const int64_t at = m * p.ld_dx + n;
      store(p.dx, p.dx_dtype, at, p.dx_beta != 0.f ? acc[q] + value(p.dx, p.dx_dtype, at) : acc[q]);
    }
    if (kP == Product::dw) {
      float* dW = ex.dw + e * ex.dw_stride + m * p.in + n;
      *dW = acc[q] + *dW;
    }
  }
}

template <Product kP>
void grouped(const MoeGroupedParams& p, const char* what) {
  const int64_t cols = kP == Product::fwd ? p.out : p.in;
  if (p.rows == 0 || cols == 0 || p.in == 0 || p.out == 0) return;
  Experts ex;  // the plan saw both tables at one stride
  int64_t stride = 0;
  ex.w = p.W[0];
  moe_expert_stride(p.W, p.E, int64_t(dtype_size(p.w_dtype)), stride);
  ex.w_stride_bytes = stride * int64_t(dtype_size(p.w_dtype));
  if (kP == Product::dw) {
    ex.dw = p.dW[0];
    moe_expert_stride(reinterpret_cast<const void* const*>(p.dW), p.E, sizeof(float), ex.dw_stride);
  }
  auto tiles = [](int64_t n) { return unsigned((n + T::kTile - 1) / T::kTile); };
  const dim3 grid = kP == Product::dw ? dim3(tiles(p.in), tiles(p.out), unsigned(p.E))
                                      : dim3(tiles(cols), unsigned(T::row_tiles(p.rows, p.E)));
  HMLA_LAUNCH(grouped_kernel<kP>, grid, T::kThreads, 0, stream(), p, ex);
  check_launch(what);
}

template <class K, class P>
void launch(K kernel, int64_t n, const P& p, const char* what) {
  if (n <= 0) return;
  HMLA_LAUNCH(kernel, grid_for(n), T::kThreads, 0, stream(), p);
  check_launch(what);
}

}  // namespace

bool moe_expert_stride(const void* const* table, int64_t E, int64_t elem_bytes, int64_t& stride) {
  stride = 0;
  if (E <= 1) return true;
  const auto b0 = reinterpret_cast<intptr_t>(table[0]);
  const intptr_t d = reinterpret_cast<intptr_t>(table[1]) - b0;
  if (d % elem_bytes != 0) return false;
  for (int64_t e = 2; e < E; ++e)
    if (reinterpret_cast<intptr_t>(table[e]) != b0 + intptr_t(e) * d) return false;
  stride = int64_t(d / elem_bytes);
  return true;
}

void moe_route_fwd(const MoeRouteParams& p) { launch(route_fwd_kernel, p.N, p, "moe_route"); }
void moe_route_bwd(const MoeRouteParams& p) { launch(route_bwd_kernel, p.N, p, "moe_route backward"); }
void moe_dispatch(const MoeDispatchParams& p) {
  HMLA_LAUNCH(dispatch_kernel, 1, T::kThreads, 0, stream(), p);
  check_launch("moe_dispatch");
}
void moe_gather(const MoeRowsParams& p) { launch(gather_kernel, p.N * p.k * p.D, p, "moe_gather"); }
void moe_combine(const MoeRowsParams& p) { launch(combine_kernel, p.N * p.D, p, "moe_combine"); }
void moe_rowdot(const MoeRowsParams& p) { launch(rowdot_kernel, p.N * p.k, p, "moe_rowdot"); }
void moe_grouped_fwd(const MoeGroupedParams& p) { grouped<Product::fwd>(p, "moe_grouped"); }
void moe_grouped_bwd(const MoeGroupedParams& p) {
  grouped<Product::dw>(p, "moe_grouped backward dW");
  if (p.dx) grouped<Product::dx>(p, "moe_grouped backward dx");
}

// The plans (cuda_kernels.h): the kept groups in a 64-bit mask; the gather's source and the row
// dot's operands may be bf16 activations; the grouped products take linear's dtypes, their
// experts' matrices at one stride (one arena) and a grid that fits.
// The router: sigmoid or sqrtsoftplus scores, chosen or given (hash routing); a null bias is no
// correction.
Plan plan(Op, const MoeRouteParams& p) { return plan_if(p.n_group <= MoeTraits::kMaxGroups, Variant::simt); }
Plan plan(Op, const MoeDispatchParams&) { return {Variant::simt, {}}; }
Plan plan(Op, const MoeRowsParams& p) {
  return plan_if(f32_or_bf16(p.src_dtype) && f32_or_bf16(p.a_dtype) && f32_or_bf16(p.b_dtype), Variant::simt);
}
Plan plan(Op, const MoeGroupedParams& p) {
  using T = MoeTraits;
  int64_t stride = 0;
  return plan_if(f32_or_bf16(p.x_dtype) && f32_or_bf16(p.w_dtype) && f32_or_bf16(p.y_dtype) && f32_or_bf16(p.dx_dtype) &&
                     moe_expert_stride(p.W, p.E, int64_t(dtype_size(p.w_dtype)), stride) &&
                     (!p.dW || moe_expert_stride(reinterpret_cast<const void* const*>(p.dW), p.E, sizeof(float), stride)) &&
                     T::row_tiles(p.rows, p.E) <= T::kMaxGridY && p.E <= T::kMaxGridY,
                 Variant::simt);
}

}  // namespace hmla::cuda
