// The dense ops on the GPU, f32 (hmla/ops/nn.h), with the CPU's formulas (the optimizer steps:
// optim.cu). The norms, RoPE and SwiGLU also take bf16 activations: kernels templated on
// those operands' element types read them exactly (widen), compute in f32 as the f32 instantiation
// does, and round a bf16 output once (put, RNE), so they give the f32 kernel's bits up to that
// final rounding. Deterministic by construction: no atomics; every reduction has a fixed shape.
//   - Row ops (norms, cross-entropy): one block per row, a fixed tree over the block's threads.
//   - Column sums (the norms' dw/db): partial sums over fixed chunks of rows, then each column
//     adds its partials in chunk order (two launches).
//   - The embedding's backward: one thread per column walks the tokens in order (the CPU's order).
//   - Cross-entropy's loss: per-row partials in f64, added in order into the caller's device
//     accumulator by one thread (the host loop's order, so the bits are those the host sum had;
//     nothing is read back).
// Element-wise ops are grid-stride loops. docs/cuda.md says what is left for speed.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cuda_kernels.h"
#include "hmla/core/allocator.h"
#include "nn.cuh"
#include "reduce.cuh"
#include "runtime.h"
#include "strided.cuh"
#include "traits.h"

namespace hmla::cuda {

namespace {

using detail::launch;
using detail::ordered_sum;
using detail::stream;

constexpr int kThreads = NnTraits::kThreads;          // every kernel of this file
constexpr int64_t kColChunk = NnTraits::kColChunk;  // rows per partial of a column sum

// Activations as the kernels read them: f32 as is, bf16 widened exactly. Stores are strided.cuh's
// put (bf16: round to nearest even).
__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }

// f(T{}) with T the element type of an activation's dtype (the plan admitted f32 and bf16 only).
template <class F>
void with_type(DType dt, F&& f) {
  if (dt == DType::bf16)
    f(__nv_bfloat16{});
  else
    f(float{});
}

// ---- norms ------------------------------------------------------------------------------------

// mean is null for RMSNorm (then bias is too). x TX, y TY.
template <class TX, class TY>
__global__ void norm_fwd_kernel(NormParams p) {
  __shared__ float red[kThreads];
  const int64_t n = blockIdx.x;
  const TX* x = static_cast<const TX*>(p.x) + n * p.ldx;
  float mu = 0.f;
  if (p.mean) {
    float s = 0.f;
    for (int64_t d = threadIdx.x; d < p.D; d += kThreads) s += widen(x[d]);
    mu = block_sum<kThreads>(s, red) / float(p.D);
  }
  float ss = 0.f;
  for (int64_t d = threadIdx.x; d < p.D; d += kThreads) ss += (widen(x[d]) - mu) * (widen(x[d]) - mu);
  const float r = 1.f / sqrtf(block_sum<kThreads>(ss, red) / float(p.D) + p.eps);
  if (threadIdx.x == 0) {
    p.rstd[n] = r;
    if (p.mean) p.mean[n] = mu;
  }
  TY* y = static_cast<TY*>(p.y) + n * p.ldy;
  for (int64_t d = threadIdx.x; d < p.D; d += kThreads)
    put(y[d], (widen(x[d]) - mu) * r * p.w[d] + (p.bias ? p.bias[d] : 0.f));
}

// The residual step: xs = x + x2 (each thread its own d), then norm_fwd_kernel's RMSNorm of xs.
// x and xs are the f32 residual stream; x2 TX2, y TY.
template <class TX2, class TY>
__global__ void add_rmsnorm_fwd_kernel(NormParams p) {
  __shared__ float red[kThreads];
  const int64_t n = blockIdx.x;
  const float* x = static_cast<const float*>(p.x) + n * p.ldx;
  const TX2* x2 = static_cast<const TX2*>(p.x2) + n * p.ldx2;
  float* xs = p.xs + n * p.ldxs;
  float ss = 0.f;
  for (int64_t d = threadIdx.x; d < p.D; d += kThreads) {
    const float v = x[d] + 1.f * widen(x2[d]);
    xs[d] = v;
    ss += v * v;
  }
  const float r = 1.f / sqrtf(block_sum<kThreads>(ss, red) / float(p.D) + p.eps);
  if (threadIdx.x == 0) p.rstd[n] = r;
  TY* y = static_cast<TY*>(p.y) + n * p.ldy;
  for (int64_t d = threadIdx.x; d < p.D; d += kThreads) put(y[d], xs[d] * r * p.w[d]);
}

// x TX; dy, dx f32.
template <class TX>
__global__ void norm_bwd_dx_kernel(NormParams p) {
  __shared__ float red[kThreads];
  const int64_t n = blockIdx.x;
  const TX* x = static_cast<const TX*>(p.x) + n * p.ldx;
  const float* dy = p.dy + n * p.lddy;
  const float r = p.rstd[n], mu = p.mean ? p.mean[n] : 0.f;
  float s1 = 0.f, s2 = 0.f;  // sums of g and g * xhat, g = dy * w
  for (int64_t d = threadIdx.x; d < p.D; d += kThreads) {
    const float g = dy[d] * p.w[d];
    s1 += g;
    s2 += g * (widen(x[d]) - mu) * r;
  }
  const float m1 = p.mean ? block_sum<kThreads>(s1, red) / float(p.D) : 0.f;
  const float m2 = block_sum<kThreads>(s2, red) / float(p.D);
  float* dx = p.dx + n * p.lddx;
  for (int64_t d = threadIdx.x; d < p.D; d += kThreads)
    dx[d] = r * (dy[d] * p.w[d] - m1 - (widen(x[d]) - mu) * r * m2);
}

// Partials of dw (and db) over rows [c * kColChunk, ...) into part [chunks, D] (and [chunks, D] after).
template <class TX>
__global__ void norm_bwd_partial_kernel(NormParams p, float* part, int64_t chunks) {
  const int64_t c = blockIdx.y, d = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (d >= p.D) return;
  const TX* x = static_cast<const TX*>(p.x);
  float sw = 0.f, sb = 0.f;
  const int64_t n1 = (c + 1) * kColChunk < p.N ? (c + 1) * kColChunk : p.N;
  for (int64_t n = c * kColChunk; n < n1; ++n) {
    const float g = p.dy[n * p.lddy + d];
    sw += g * (widen(x[n * p.ldx + d]) - (p.mean ? p.mean[n] : 0.f)) * p.rstd[n];
    sb += g;
  }
  part[c * p.D + d] = sw;
  if (p.db) part[(chunks + c) * p.D + d] = sb;
}

__global__ void norm_bwd_finish_kernel(NormParams p, const float* part, int64_t chunks) {
  HMLA_GRID_STRIDE(d, p.D) {
    float sw = 0.f, sb = 0.f;
    for (int64_t c = 0; c < chunks; ++c) {
      sw += part[c * p.D + d];
      if (p.db) sb += part[(chunks + c) * p.D + d];
    }
    p.dw[d] += sw;
    if (p.db) p.db[d] += sb;
  }
}

void norm_fwd(const NormParams& p) {
  if (p.N == 0) return;
  with_type(p.x_dtype, [&](auto tx) {
    with_type(p.y_dtype, [&](auto ty) {
      auto* kernel = norm_fwd_kernel<decltype(tx), decltype(ty)>;
      HMLA_LAUNCH(kernel, unsigned(p.N), kThreads, 0, stream(), p);
    });
  });
  check_launch("norm forward");
}

void norm_bwd(const NormParams& p) {
  if (p.N == 0) return;
  const int64_t chunks = (p.N + kColChunk - 1) / kColChunk;
  Scratch<float> part(chunks * p.D * (p.db ? 2 : 1));
  with_type(p.x_dtype, [&](auto tx) {
    auto* dx_kernel = norm_bwd_dx_kernel<decltype(tx)>;
    HMLA_LAUNCH(dx_kernel, unsigned(p.N), kThreads, 0, stream(), p);
    check_launch("norm backward dx");
    auto* partial_kernel = norm_bwd_partial_kernel<decltype(tx)>;
    HMLA_LAUNCH(partial_kernel, dim3(unsigned((p.D + kThreads - 1) / kThreads), unsigned(chunks)), kThreads, 0,
                stream(), p, part.get(), chunks);
  });
  check_launch("norm backward partials");
  HMLA_LAUNCH(norm_bwd_finish_kernel, grid_for(p.D), kThreads, 0, stream(), p, part.get(), chunks);
  check_launch("norm backward dw");
}

// ---- RoPE, SwiGLU, axpy ---------------------------------------------------------------------------

// x T, in place: each pair read once, rotated in f32, stored once.
template <class T>
__global__ void rope_kernel(RopeParams p) {
  const int64_t half = p.Dr / 2, step = p.layout == RopeLayout::interleaved ? 2 : 1,
                off = p.layout == RopeLayout::interleaved ? 1 : half;
  HMLA_GRID_STRIDE(e, p.N * p.heads * half) {
    const int64_t i = e % half, h = (e / half) % p.heads, n = e / (half * p.heads);
    T* x = static_cast<T*>(p.x) + n * p.ld + h * p.hstride;
    const float c = p.cos[(n % p.s) * half + i], sn = p.sin[(n % p.s) * half + i], si = p.transpose ? -sn : sn;
    const float a = widen(x[i * step]), b = widen(x[i * step + off]);
    put(x[i * step], a * c - b * si);
    put(x[i * step + off], b * c + a * si);
  }
}

// g, u, y T.
template <class T>
__global__ void swiglu_fwd_kernel(SwigluParams p) {
  const T *g = static_cast<const T*>(p.g), *u = static_cast<const T*>(p.u);
  T* y = static_cast<T*>(p.y);
  const float L = p.limit;
  HMLA_GRID_STRIDE(i, p.n) {
    float gv = widen(g[i]), uv = widen(u[i]);
    if (L > 0.f) gv = gv > L ? L : gv, uv = uv > L ? L : uv < -L ? -L : uv;  // DeepSeek-V4's clamp
    put(y[i], gv / (1.f + expf(-gv)) * uv);
  }
}

// g, u T; dy, dg, du f32.
template <class T>
__global__ void swiglu_bwd_kernel(SwigluParams p) {
  const T *gp = static_cast<const T*>(p.g), *u = static_cast<const T*>(p.u);
  const float L = p.limit;
  HMLA_GRID_STRIDE(i, p.n) {
    const float g0 = widen(gp[i]), u0 = widen(u[i]);
    const bool g_in = !(L > 0.f && g0 > L), u_in = !(L > 0.f && (u0 > L || u0 < -L));
    const float g = g_in ? g0 : L, uc = u_in ? u0 : u0 > L ? L : -L, sig = 1.f / (1.f + expf(-g));
    p.du[i] = u_in ? p.dy[i] * g * sig : 0.f;
    p.dg[i] = g_in ? p.dy[i] * uc * sig * (1.f + g * (1.f - sig)) : 0.f;
  }
}

__global__ void axpy_kernel(AxpyParams p) {
  HMLA_GRID_STRIDE(e, p.N * p.D) {
    const int64_t n = e / p.D, i = e % p.D;
    const float a = p.a[n * p.lda + i];
    p.out[n * p.ldout + i] = p.b ? a + p.alpha * p.b[n * p.ldb + i] : p.alpha * a;
  }
}

// ---- embedding ----------------------------------------------------------------------------------

__global__ void embedding_fwd_kernel(EmbeddingParams p) {
  HMLA_GRID_STRIDE(e, p.N * p.D) {
    const int64_t n = e / p.D, d = e % p.D, id = p.ids[n];
    p.out[e] = id >= 0 && id < p.V ? p.E[id * p.D + d] : NAN;  // ids are checked on the host; never read outside E
  }
}

// One thread per column, tokens in order: rows of one id add up in the CPU's order.
__global__ void embedding_bwd_kernel(EmbeddingParams p) {
  HMLA_GRID_STRIDE(d, p.D) {
    for (int64_t n = 0; n < p.N; ++n) {
      const int64_t id = p.ids[n];
      if (id >= 0 && id < p.V) p.dE[id * p.D + d] += p.dout[n * p.D + d];
    }
  }
}

// ---- cross-entropy --------------------------------------------------------------------------------

// One block per row: the row's weighted loss (f64) into loss[n], and its gradient.
__global__ void cross_entropy_kernel(CrossEntropyParams p, double* loss) {
  __shared__ float red[kThreads];
  __shared__ double redd[kThreads];
  const int64_t n = blockIdx.x;
  const float* l = p.logits + n * p.V;
  float* d = p.dlogits ? p.dlogits + n * p.V : nullptr;
  const float w = p.w[n];
  if (w == 0.f) {
    if (d)
      for (int64_t v = threadIdx.x; v < p.V; v += kThreads) d[v] = 0.f;
    if (threadIdx.x == 0) loss[n] = 0;
    return;
  }
  const int32_t t = p.target[n];
  const bool ok = t >= 0 && t < p.V;  // device targets are not checked on the host: a bad one's loss is NaN
  // Read before the block's barriers: d may be l itself, and another thread's d[t] comes after them.
  const float lt = ok && threadIdx.x == 0 ? l[t] : 0.f;
  float mx = -INFINITY;
  for (int64_t v = threadIdx.x; v < p.V; v += kThreads) mx = fmaxf(mx, l[v]);
  mx = block_max<kThreads>(mx, red);
  double z = 0;
  for (int64_t v = threadIdx.x; v < p.V; v += kThreads) z += exp(double(l[v] - mx));
  z = block_sum<kThreads>(z, redd);
  const double lse = double(mx) + log(z);
  if (threadIdx.x == 0) loss[n] = ok ? double(w) * (lse - double(lt)) : double(NAN);
  if (d)
    for (int64_t v = threadIdx.x; v < p.V; v += kThreads) d[v] = w * float(exp(double(l[v]) - lse)) - (v == t ? w : 0.f);
}

// One thread: *acc += part[0] + part[1] + ... left to right.
__global__ void ordered_sum_kernel(const double* part, int64_t n, double* acc) {
  double s = *acc;
  for (int64_t i = 0; i < n; ++i) s += part[i];
  *acc = s;
}

#undef HMLA_GRID_STRIDE

}  // namespace

// *acc += part[0 .. n) in order, on the device (nn.cuh).
void detail::ordered_sum(const double* part, int64_t n, double* acc, const char* what) {
  HMLA_LAUNCH(ordered_sum_kernel, 1, 1, 0, stream(), part, n, acc);
  check_launch(what);
}

void rmsnorm_fwd(const NormParams& p) { norm_fwd(p); }
void layernorm_fwd(const NormParams& p) { norm_fwd(p); }
void rmsnorm_bwd(const NormParams& p) { norm_bwd(p); }
void add_rmsnorm_fwd(const NormParams& p) {
  if (p.N == 0) return;
  with_type(p.x2_dtype, [&](auto tx2) {
    with_type(p.y_dtype, [&](auto ty) {
      auto* kernel = add_rmsnorm_fwd_kernel<decltype(tx2), decltype(ty)>;
      HMLA_LAUNCH(kernel, unsigned(p.N), kThreads, 0, stream(), p);
    });
  });
  check_launch("add_rmsnorm");
}
void layernorm_bwd(const NormParams& p) { norm_bwd(p); }

void rope(const RopeParams& p) {
  with_type(p.x_dtype, [&](auto t) { launch(rope_kernel<decltype(t)>, p.N * p.heads * (p.Dr / 2), p, "rope"); });
}
void swiglu_fwd(const SwigluParams& p) {
  with_type(p.dtype, [&](auto t) { launch(swiglu_fwd_kernel<decltype(t)>, p.n, p, "swiglu"); });
}
void swiglu_bwd(const SwigluParams& p) {
  with_type(p.dtype, [&](auto t) { launch(swiglu_bwd_kernel<decltype(t)>, p.n, p, "swiglu backward"); });
}
void axpy(const AxpyParams& p) { launch(axpy_kernel, p.N * p.D, p, "axpy"); }

void convert(const ConvertParams& p) {
  const Strided4 g = strided4(p.shape, p.dst_stride, p.src_stride, p.dims);
  if (p.src_dtype == p.dst_dtype) {
    allocator(Device::cuda).copy_strided(p.dst, p.dst_stride, p.src, p.src_stride, p.shape, p.dims,
                                         dtype_size(p.src_dtype));
  } else if (p.src_dtype == DType::f32) {
    strided_map(static_cast<__nv_bfloat16*>(p.dst), static_cast<const float*>(p.src), g);
  } else {
    strided_map(static_cast<float*>(p.dst), static_cast<const __nv_bfloat16*>(p.src), g);
  }
}

void embedding_fwd(const EmbeddingParams& p) { launch(embedding_fwd_kernel, p.N * p.D, p, "embedding"); }
void embedding_bwd(const EmbeddingParams& p) {
  if (p.N > 0) launch(embedding_bwd_kernel, p.D, p, "embedding backward");  // a thread per column
}

void cross_entropy(const CrossEntropyParams& p) {
  if (p.N == 0) return;
  Scratch<double> loss(p.N);
  HMLA_LAUNCH(cross_entropy_kernel, unsigned(p.N), kThreads, 0, stream(), p, loss.get());
  check_launch("cross_entropy");
  ordered_sum(loss.get(), p.N, p.acc, "cross_entropy sum");  // rows in order, as the CPU
}

// The plans (cuda_kernels.h): the activations of the row and element ops f32 or bf16 (with_type's
// instantiations); the fused add reads the residual stream x in f32 only. Every shape.
Plan plan(Op, const NormParams& p) {
  return plan_if(f32_or_bf16(p.x_dtype) && f32_or_bf16(p.x2_dtype) && f32_or_bf16(p.y_dtype) &&
                     (!p.x2 || p.x_dtype == DType::f32),
                 Variant::simt);
}
Plan plan(Op, const RopeParams& p) { return plan_if(f32_or_bf16(p.x_dtype), Variant::simt); }
Plan plan(Op, const SwigluParams& p) { return plan_if(f32_or_bf16(p.dtype), Variant::simt); }
Plan plan(Op, const EmbeddingParams&) { return {Variant::simt, {}}; }
Plan plan(Op, const CrossEntropyParams&) { return {Variant::simt, {}}; }
Plan plan(Op, const AxpyParams&) { return {Variant::simt, {}}; }
Plan plan(Op, const ConvertParams& p) {
  return plan_if(p.src_dtype == p.dst_dtype || (f32_or_bf16(p.src_dtype) && f32_or_bf16(p.dst_dtype)), Variant::simt);
}

}  // namespace hmla::cuda