// DeepSeek-V4's attention core on the GPU (hmla/ops/compressed_attention.h), f32 or bf16 inputs and
// outputs, f32 math, f32 lse: the family's plan and dispatch, and its simple SIMT kernels, correct
// rather than fast, no atomics (every sum runs in a fixed order: deterministic). bf16 with d up to
// 512 runs the tensor-core kernels instead (attn_compressed_mma.cu, attn_compressed_mma_bwd.cu:
// CompressedMmaTraits::mma); the SIMT kernels take f32 and what those do not fit.
//   forward   one block per (query row, head): the row's key list (window, then the dense mode's
//             visible entry range or the selected mode's k slots) in chunks of kThreads, one key
//             per thread; an online softmax over the chunks; a thread per channel adds P V.
//   backward  (1) one block per (query row, head): D = dout . out, the sink's term, dq (P
//             recomputed from lse); (2) one block per window key u: the (query, head) pairs that
//             see u (t in [u, u + W) of u's document) give dkv[u] = sum dS scale q + P dout;
//             (3) one block per entry e: the pairs of the queries that see e (t from ent_last[e]
//             to its document's end; selected mode: those whose slots hold e) give dent[e] alike;
//             (4) dsink: one thread per head sums its terms in row order.
// Query rows at an offset (context parallelism): the query-side grids and arrays cover the sq local
// rows, positions (layout, window, visibility) are global (q_row0 + local row), and the key kernels
// walk only the rows of [q_row0, q_row0 + sq) that see their key.
// Workspace O(b sq H) (D and the sink's terms); nothing [s, s] or [s, n_e]. Costs: the selected mode
// tests a slot against the row's earlier slots (a repeated index counts once: O(k^2) per row) and
// the entries' backward scans k slots per candidate query (O(n_e L k), L the document length): fine
// for the tests and small runs, the first thing a fast kernel replaces (an inverse index, as the
// sparse backward builds).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "cuda_kernels.h"
#include "entry_range.cuh"
#include "hmla/ops/compressed_attention.h"
#include "mma.cuh"  // HMLA_DYNAMIC_SHARED
#include "reduce.cuh"
#include "runtime.h"
#include "traits.h"

namespace hmla::cuda {

namespace {

// The kernels' constants. kThreads: one key per thread per chunk and a power of two for the block
// reductions; 128 keeps a block's chunk near the window size of V4 (128). kMaxD: the dynamic shared
// memory (3 d floats) stays within the 48 KB every device gives without opting in.
struct CompressedTraits {
  static constexpr int kThreads = 128;
  static constexpr int64_t kMaxD = 2048;
};
static_assert((CompressedTraits::kThreads & (CompressedTraits::kThreads - 1)) == 0, "block reductions need 2^n");
static_assert(3 * CompressedTraits::kMaxD * 4 <= 48 * 1024, "dynamic shared memory within 48 KB");
constexpr int kThreads = CompressedTraits::kThreads;

cudaStream_t stream() { return current_stream().get(); }

__device__ __forceinline__ float widen(float x) { return x; }
__device__ __forceinline__ float widen(__nv_bfloat16 x) {  // exact: its 16 bits above 16 zeros
  const uint32_t u = uint32_t(reinterpret_cast<const uint16_t&>(x)) << 16;
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}
__device__ __forceinline__ void store(float& d, float v) { d = v; }
__device__ __forceinline__ void store(__nv_bfloat16& d, float v) { d = __float2bfloat16_rn(v); }

__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

template <class T>
__device__ __forceinline__ float at(const void* p, int64_t i) {
  return widen(static_cast<const T*>(p)[i]);
}

__device__ bool visible(const AttnCompressedParams& p, int64_t bb, int64_t st, int64_t t, int64_t e) {
  return e >= 0 && e < p.n_e && p.ent_doc[bb * p.n_e + e] == st && p.ent_last[bb * p.n_e + e] <= t;
}

// Query row `row`'s key list (local row tl of batch row bb, global position t = q_row0 + tl):
// positions [0, n_w) are window keys u0 + j, then (dense) entries lo + j or (selected) the row's
// slots. key() gives a position's row: kv's (>= 0), ent's (encoded -2 - e) or -1 when the position
// holds no key.
struct RowKeys {
  int64_t row, bb, tl, t, st, u0, n_w, lo, n;
  __device__ RowKeys(const AttnCompressedParams& p, int64_t r)
      : row(r), bb(r / p.sq), tl(r % p.sq), t(p.q_row0 + r % p.sq) {
    st = p.doc_start[bb * p.s + t];
    u0 = imax(st, t - p.window + 1);
    n_w = t - u0 + 1;
    lo = 0;
    int64_t ne = 0;
    if (p.n_e > 0 && p.k == 0) {
      int64_t hi = 0;
      visible_entries(p.ent_doc + bb * p.n_e, p.ent_last + bb * p.n_e, p.n_e, st, t, lo, hi);
      ne = hi - lo;
    } else if (p.n_e > 0) {
      ne = p.k;
    }
    n = n_w + ne;
  }
  __device__ int64_t key(const AttnCompressedParams& p, int64_t j) const {
    if (j < n_w) return u0 + j;
    if (p.k == 0) return -2 - (lo + j - n_w);
    const int32_t* slots = p.idx + row * p.k;
    const int64_t i = j - n_w, e = slots[i];
    if (!visible(p, bb, st, t, e)) return -1;
    for (int64_t i2 = 0; i2 < i; ++i2)
      if (slots[i2] == e) return -1;  // a repeated index counts once: its first slot
    return -2 - e;
  }
};

// Element c of key `key` (a RowKeys::key() >= 0 or <= -2) of batch row bb.
template <class T>
__device__ __forceinline__ float key_at(const AttnCompressedParams& p, int64_t bb, int64_t key, int64_t c) {
  return key >= 0 ? at<T>(p.kv, (bb * p.s + key) * p.d + c) : at<T>(p.ent, (bb * p.n_e + (-2 - key)) * p.d + c);
}

template <class T>
__device__ float dot_q(const AttnCompressedParams& p, const float* qs, int64_t bb, int64_t key) {
  float acc = 0.f;
  for (int64_t c = 0; c < p.d; ++c) acc += qs[c] * key_at<T>(p, bb, key, c);
  return acc;
}

template <class T>
__global__ void __launch_bounds__(kThreads) fwd_kernel(AttnCompressedParams p) {
  HMLA_DYNAMIC_SHARED(float, smem);
  __shared__ float red[kThreads], pr[kThreads];
  __shared__ int64_t keys[kThreads];
  const int64_t row = blockIdx.x / p.H, h = blockIdx.x % p.H, d = p.d;
  float *qs = smem, *acc = smem + d;
  const RowKeys rk(p, row);
  T* out = static_cast<T*>(p.out) + (row * p.H + h) * d;
  float* lse = p.lse + (rk.bb * p.H + h) * p.sq + rk.tl;
  if (rk.st > rk.t) {  // padding: out 0, lse +inf
    for (int64_t c = threadIdx.x; c < d; c += kThreads) store(out[c], 0.f);
    if (threadIdx.x == 0) *lse = INFINITY;
    return;
  }
  const int64_t q0 = rk.bb * p.q_bstride + rk.tl * p.q_rstride + h * p.q_hstride;
  for (int64_t c = threadIdx.x; c < d; c += kThreads) qs[c] = at<T>(p.q, q0 + c), acc[c] = 0.f;
  __syncthreads();
  float m = -INFINITY, l = 0.f;
  for (int64_t j0 = 0; j0 < rk.n; j0 += kThreads) {
    const int64_t j = j0 + threadIdx.x;
    const int64_t key = j < rk.n ? rk.key(p, j) : -1;
    const float z = key != -1 ? p.scale * dot_q<T>(p, qs, rk.bb, key) : -INFINITY;
    const float mn = fmaxf(m, block_max<kThreads>(z, red));
    if (mn == -INFINITY) continue;  // block-uniform: nothing in this chunk or before
    const float pj = z == -INFINITY ? 0.f : expf(z - mn), alpha = expf(m - mn);
    keys[threadIdx.x] = key, pr[threadIdx.x] = pj;
    l = l * alpha + block_sum<kThreads>(pj, red);  // block_sum syncs: keys and pr are visible
    const int64_t cnt = imin(kThreads, rk.n - j0);
    for (int64_t c = threadIdx.x; c < d; c += kThreads) {
      float a = acc[c] * alpha;
      for (int64_t i = 0; i < cnt; ++i)
        if (pr[i] != 0.f) a += pr[i] * key_at<T>(p, rk.bb, keys[i], c);
      acc[c] = a;
    }
    m = mn;
    __syncthreads();
  }
  const float denom = l + (p.sink ? expf(p.sink[h] - m) : 0.f);
  for (int64_t c = threadIdx.x; c < d; c += kThreads) store(out[c], acc[c] / denom);
  if (threadIdx.x == 0) *lse = m + logf(denom);
}

// (1) dq, D = dout . out per (row, head) and the sink's term -exp(sink - lse) D.
template <class T>
__global__ void __launch_bounds__(kThreads) dq_kernel(AttnCompressedParams p, float* Dw, float* sink_terms) {
  HMLA_DYNAMIC_SHARED(float, smem);
  __shared__ float red[kThreads], ds[kThreads];
  __shared__ int64_t keys[kThreads];
  const int64_t row = blockIdx.x / p.H, h = blockIdx.x % p.H, d = p.d;
  float *qs = smem, *dos = smem + d, *acc = smem + 2 * d;
  const RowKeys rk(p, row);
  T* dq = static_cast<T*>(p.dq) + (row * p.H + h) * d;
  if (rk.st > rk.t) {  // padding: no gradient
    for (int64_t c = threadIdx.x; c < d; c += kThreads) store(dq[c], 0.f);
    if (threadIdx.x == 0) Dw[row * p.H + h] = 0.f, sink_terms[row * p.H + h] = 0.f;
    return;
  }
  const int64_t q0 = rk.bb * p.q_bstride + rk.tl * p.q_rstride + h * p.q_hstride, o0 = (row * p.H + h) * d;
  float part = 0.f;
  for (int64_t c = threadIdx.x; c < d; c += kThreads) {
    qs[c] = at<T>(p.q, q0 + c), dos[c] = at<T>(p.dout, o0 + c), acc[c] = 0.f;
    part += dos[c] * at<T>(p.out, o0 + c);
  }
  const float D = block_sum<kThreads>(part, red);
  const float lse = p.lse[(rk.bb * p.H + h) * p.sq + rk.tl];
  if (threadIdx.x == 0) {
    Dw[row * p.H + h] = D;
    sink_terms[row * p.H + h] = p.sink && fabsf(lse) < INFINITY ? -expf(p.sink[h] - lse) * D : 0.f;
  }
  for (int64_t j0 = 0; j0 < rk.n; j0 += kThreads) {
    const int64_t j = j0 + threadIdx.x;
    const int64_t key = j < rk.n ? rk.key(p, j) : -1;
    float g = 0.f;
    if (key != -1) {
      float z = 0.f, dp = 0.f;
      for (int64_t c = 0; c < d; ++c) {
        const float kc = key_at<T>(p, rk.bb, key, c);
        z += qs[c] * kc, dp += dos[c] * kc;
      }
      const float pj = expf(p.scale * z - lse);
      g = pj * (dp - D) * p.scale;
    }
    keys[threadIdx.x] = key, ds[threadIdx.x] = g;
    __syncthreads();
    const int64_t cnt = imin(kThreads, rk.n - j0);
    for (int64_t c = threadIdx.x; c < d; c += kThreads) {
      float a = acc[c];
      for (int64_t i = 0; i < cnt; ++i)
        if (ds[i] != 0.f) a += ds[i] * key_at<T>(p, rk.bb, keys[i], c);
      acc[c] = a;
    }
    __syncthreads();
  }
  for (int64_t c = threadIdx.x; c < d; c += kThreads) store(dq[c], acc[c]);
}

// Whether (local) query row `row` attends entry e (visible; selected mode: one of its slots holds it).
__device__ bool attends(const AttnCompressedParams& p, int64_t row, int64_t e) {
  if (p.k == 0) return true;  // the caller walks only queries that see e
  const int32_t* slots = p.idx + row * p.k;
  for (int64_t i = 0; i < p.k; ++i)
    if (slots[i] == e) return true;
  return false;
}

// (2) and (3): the gradient of one key (window key u of batch row bb: entry < 0; else entry e):
// sum over the (query, head) pairs that attend it of dS scale q + P dout, pairs in (t, h) order,
// t over the query rows [q_row0, q_row0 + sq) only (global positions; their data at t - q_row0).
template <class T>
__global__ void __launch_bounds__(kThreads) dkey_kernel(AttnCompressedParams p, bool entries, const float* Dw) {
  HMLA_DYNAMIC_SHARED(float, smem);
  __shared__ float gs[kThreads], ps[kThreads];
  __shared__ int64_t pairs[kThreads];
  const int64_t d = p.d;
  float *ks = smem, *acc = smem + d;
  int64_t bb, key, t0, t1;  // queries [t0, t1), global
  T* dst;
  if (!entries) {
    bb = blockIdx.x / p.s, key = blockIdx.x % p.s;
    dst = static_cast<T*>(p.dkv) + blockIdx.x * d;
    const int64_t st = p.doc_start[blockIdx.x];
    t0 = key, t1 = st > key ? key : imin(key + p.window, p.doc_end[blockIdx.x]);
  } else {
    bb = blockIdx.x / p.n_e;
    const int64_t e = blockIdx.x % p.n_e, st = p.ent_doc[blockIdx.x];
    key = -2 - e;
    dst = static_cast<T*>(p.dent) + blockIdx.x * d;
    t0 = p.ent_last[blockIdx.x], t1 = st < 0 ? t0 : p.doc_end[bb * p.s + st];  // an unused slot: none
  }
  t0 = imax(t0, p.q_row0), t1 = imax(t0, imin(t1, p.q_row0 + p.sq));  // this call's query rows
  for (int64_t c = threadIdx.x; c < d; c += kThreads) ks[c] = key_at<T>(p, bb, key, c), acc[c] = 0.f;
  __syncthreads();
  const int64_t npairs = (t1 - t0) * p.H;
  for (int64_t j0 = 0; j0 < npairs; j0 += kThreads) {
    const int64_t j = j0 + threadIdx.x;
    float g = 0.f, pj = 0.f;
    if (j < npairs) {
      const int64_t tl = t0 + j / p.H - p.q_row0, h = j % p.H, row = bb * p.sq + tl;
      if (!entries || attends(p, row, -2 - key)) {
        const int64_t q0 = bb * p.q_bstride + tl * p.q_rstride + h * p.q_hstride, o0 = (row * p.H + h) * d;
        float z = 0.f, dp = 0.f;
        for (int64_t c = 0; c < d; ++c) z += at<T>(p.q, q0 + c) * ks[c], dp += at<T>(p.dout, o0 + c) * ks[c];
        pj = expf(p.scale * z - p.lse[(bb * p.H + h) * p.sq + tl]);
        g = pj * (dp - Dw[row * p.H + h]) * p.scale;
      }
    }
    pairs[threadIdx.x] = j, gs[threadIdx.x] = g, ps[threadIdx.x] = pj;
    __syncthreads();
    const int64_t cnt = imin(kThreads, npairs - j0);
    for (int64_t c = threadIdx.x; c < d; c += kThreads) {
      float a = acc[c];
      for (int64_t i = 0; i < cnt; ++i) {
        if (gs[i] == 0.f && ps[i] == 0.f) continue;
        const int64_t tl = t0 + pairs[i] / p.H - p.q_row0, h = pairs[i] % p.H;
        const int64_t q0 = bb * p.q_bstride + tl * p.q_rstride + h * p.q_hstride, o0 = ((bb * p.sq + tl) * p.H + h) * d;
        a += gs[i] * at<T>(p.q, q0 + c) + ps[i] * at<T>(p.dout, o0 + c);  // key role, value role
      }
      acc[c] = a;
    }
    __syncthreads();
  }
  for (int64_t c = threadIdx.x; c < d; c += kThreads) store(dst[c], acc[c]);
}

// (4) dsink[h] += sum over rows of the terms, in row order (a parameter's gradient: added).
__global__ void dsink_kernel(AttnCompressedParams p, const float* terms) {
  for (int64_t h = threadIdx.x; h < p.H; h += blockDim.x) {
    float s = 0.f;
    for (int64_t row = 0; row < p.b * p.sq; ++row) s += terms[row * p.H + h];
    p.dsink[h] += s;
  }
}

template <class T>
void fwd(const AttnCompressedParams& p) {
  HMLA_LAUNCH(fwd_kernel<T>, unsigned(p.b * p.sq * p.H), kThreads, 2 * p.d * sizeof(float), stream(), p);
  check_launch("attn_compressed_fwd");
}

template <class T>
void bwd(const AttnCompressedParams& p) {
  Scratch<float> Dw(p.b * p.sq * p.H), terms(p.b * p.sq * p.H);
  if (p.sq > 0) {  // no query rows: dkv and dent still 0 (the key kernels below)
    HMLA_LAUNCH(dq_kernel<T>, unsigned(p.b * p.sq * p.H), kThreads, 3 * p.d * sizeof(float), stream(), p, Dw.get(),
                terms.get());
    check_launch("attn_compressed_bwd dq");
  }
  HMLA_LAUNCH(dkey_kernel<T>, unsigned(p.b * p.s), kThreads, 2 * p.d * sizeof(float), stream(), p, false,
              static_cast<const float*>(Dw.get()));
  check_launch("attn_compressed_bwd dkv");
  if (p.n_e > 0) {
    HMLA_LAUNCH(dkey_kernel<T>, unsigned(p.b * p.n_e), kThreads, 2 * p.d * sizeof(float), stream(), p, true,
                static_cast<const float*>(Dw.get()));
    check_launch("attn_compressed_bwd dent");
  }
  if (p.sink) {
    HMLA_LAUNCH(dsink_kernel, 1, kThreads, 0, stream(), p, static_cast<const float*>(terms.get()));
    check_launch("attn_compressed_bwd dsink");
  }
}

}  // namespace

void attn_compressed_fwd(const AttnCompressedParams& p) {
  if (p.b * p.sq == 0) return;
  if (plan(Op::attn_compressed_fwd, p).variant == Variant::mma) return attn_compressed_fwd_mma(p);
  p.dtype == DType::bf16 ? fwd<__nv_bfloat16>(p) : fwd<float>(p);
}

void attn_compressed_bwd(const AttnCompressedParams& p) {
  if (p.b * p.s == 0) return;
  if (plan(Op::attn_compressed_bwd, p).variant == Variant::mma) return attn_compressed_bwd_mma(p);
  p.dtype == DType::bf16 ? bwd<__nv_bfloat16>(p) : bwd<float>(p);
}

// The plan (cuda_kernels.h): f32 or bf16, d up to kMaxD, the grid's blocks within 2^31; the tensor
// cores for bf16 with d up to 512 and k up to 4096 (CompressedMmaTraits::mma: both passes' shared
// memory; any H: a partial 16-head tile is masked, and any d: zero-padded to a multiple of 16).
Plan plan(Op, const AttnCompressedParams& p) {
  if (!f32_or_bf16(p.dtype)) return {};
  if (p.b * p.sq >= (int64_t(1) << 31) || p.b * p.s >= (int64_t(1) << 31) || p.b * p.n_e >= (int64_t(1) << 31))
    return {Variant::none, "compressed attention: more than 2^31 query rows, keys or entries"};
  if (CompressedMmaTraits::mma(p.dtype == DType::bf16, p.d, p.k)) return {Variant::mma, {}};
  if (p.d > CompressedTraits::kMaxD)
    return {Variant::none, "compressed attention: head width " + std::to_string(p.d) + " above " +
                               std::to_string(CompressedTraits::kMaxD) + " (the SIMT kernels' shared memory)"};
  if (p.b * p.sq * p.H >= (int64_t(1) << 31) || p.b * p.s >= (int64_t(1) << 31))
    return {Variant::none, "compressed attention: more than 2^31 (row, head) or key blocks"};
  return {Variant::simt, {}};
}

}  // namespace hmla::cuda
