// mHC on the GPU (hmla/ops/mhc.h, docs/mhc.md), simple SIMT kernels in f32, deterministic
// without atomics:
//   - pre / head forward: one block per token: the sum of squares and the m products z_o = r xf .
//     fn_o as block reductions (fixed trees), then one thread runs the token's mixing math
//     (hmla/ops/mhc_token.h, the CPU's code) and the block writes y;
//   - their backward: one block per token: dpre by block reductions, one thread runs the mixing
//     backward, the block writes dx (r dz fn included) and the token's da and r dz to scratch; then
//     one thread per element of fn sums (r dz)^T xf over the tokens in order, and one thread per
//     base entry (and per scale) sums over the tokens in order;
//   - post forward: one thread per output element; post backward: one block per token.
// The products with fn run here rather than through the CUDA GEMM, which rounds its inputs to
// bf16 (mHC is f32 on every device); z is m <= 80 wide. Simple rather than fast: the forward reads
// a token's streams m + 2 times (from cache after the first); a later issue can tile the products.
#include <cmath>
#include <cstdint>

#include "hmla/ops/mhc_token.h"
#include "cuda_kernels.h"
#include "reduce.cuh"
#include "runtime.h"
#include "strided.cuh"

namespace hmla::cuda {

namespace {

constexpr int kThreads = 256;  // a block per token: 256 threads cover D = 7168 in 28 strides
constexpr int kMaxM = (2 + mhc::kMaxN) * mhc::kMaxN;
static_assert(mhc::kMaxN == kMhcMaxStreams, "the token math's bound is the family's");
static_assert(kMaxM + 3 <= kThreads, "dbase_kernel: a thread per base entry and per scale");

cudaStream_t stream() { return current_stream().get(); }

__device__ int group(int64_t o, int64_t n, bool head) { return head || o < n ? 0 : o < 2 * n ? 1 : 2; }

__global__ void mix_fwd_kernel(MhcParams p, bool head) {
  __shared__ float red[kThreads];
  __shared__ float z[kMaxM], pre[mhc::kMaxN];
  const int64_t t = blockIdx.x, n = p.n, D = p.D, K = n * D, m = head ? n : (2 + n) * n;
  const float* x = p.x + t * K;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < K; j += kThreads) ss += x[j] * x[j];
  const float r = 1.f / sqrtf(block_sum<kThreads>(ss, red) / float(K) + p.norm_eps);
  for (int64_t o = 0; o < m; ++o) {
    float s = 0.f;
    for (int64_t j = threadIdx.x; j < K; j += kThreads) s += x[j] * p.fn[o * K + j];
    s = block_sum<kThreads>(s, red);
    if (threadIdx.x == 0) z[o] = s * r;
  }
  if (threadIdx.x == 0) {
    float post[mhc::kMaxN], comb[mhc::kMaxN * mhc::kMaxN];
    mhc::mix_fwd(z, p.base, p.scale, int(n), int(p.iters), p.hc_eps, head, pre, post, comb);
    p.rstd[t] = r;
    for (int64_t o = 0; o < m; ++o) p.z[t * m + o] = z[o];
    if (!head)
      for (int64_t i = 0; i < n; ++i) {
        p.post[t * n + i] = post[i];
        for (int64_t k = 0; k < n; ++k) p.comb[(t * n + i) * n + k] = comb[i * n + k];
      }
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < D; d += kThreads) {
    float s = 0.f;
    for (int64_t i = 0; i < n; ++i) s += pre[i] * x[i * D + d];
    p.y[t * D + d] = s;
  }
}

// Token t's dx, and its da [m] and r dz [m] into scratch.
__global__ void mix_bwd_kernel(MhcParams p, bool head, float* da, float* dzr) {
  __shared__ float red[kThreads];
  __shared__ float dpre[mhc::kMaxN], pre[mhc::kMaxN], g[kMaxM], c;
  const int64_t t = blockIdx.x, n = p.n, D = p.D, K = n * D, m = head ? n : (2 + n) * n;
  const float* x = p.x + t * K;
  const float* dy = p.dy + t * D;
  for (int64_t i = 0; i < n; ++i) {
    float s = 0.f;
    for (int64_t d = threadIdx.x; d < D; d += kThreads) s += dy[d] * x[i * D + d];
    s = block_sum<kThreads>(s, red);
    if (threadIdx.x == 0) dpre[i] = s;
  }
  if (threadIdx.x == 0) {
    const float* z = p.z + t * m;
    const float r = p.rstd[t];
    float a[kMaxM];
    mhc::mix_fwd(z, p.base, p.scale, int(n), 1, p.hc_eps, true, pre, nullptr, nullptr);
    mhc::mix_bwd(z, p.base, p.scale, int(n), int(p.iters), p.hc_eps, head, dpre, head ? nullptr : p.dpost + t * n,
                 head ? nullptr : p.dcomb + t * n * n, a);
    float dzz = 0.f;
    for (int64_t o = 0; o < m; ++o) {
      const float dz = a[o] * p.scale[group(o, n, head)];
      dzz += dz * z[o];
      g[o] = dz * r;
      da[t * m + o] = a[o];
      dzr[t * m + o] = dz * r;
    }
    c = r * r * dzz / float(K);
  }
  __syncthreads();
  for (int64_t j = threadIdx.x; j < K; j += kThreads) {
    float s = pre[j / D] * dy[j % D] - c * x[j];
    for (int64_t o = 0; o < m; ++o) s += g[o] * p.fn[o * K + j];
    p.dx[t * K + j] = s;
  }
}

// dfn[o, j] += sum over t (in order) of dzr[t, o] xf[t, j]: one thread per element.
__global__ void dfn_kernel(MhcParams p, int64_t m, const float* dzr) {
  const int64_t K = p.n * p.D;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < m * K; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = e / K, j = e % K;
    float s = 0.f;
    for (int64_t t = 0; t < p.N; ++t) s += dzr[t * m + o] * p.x[t * K + j];
    p.dfn[e] += s;
  }
}

// dbase[o] += sum_t da[t, o] (thread o < m); dscale[g] += sum_t sum_{o in g} da[t, o] z[t, o]
// (thread m + g), tokens in order.
__global__ void dbase_kernel(MhcParams p, int64_t m, bool head, const float* da) {
  const int64_t u = threadIdx.x;
  if (u < m) {
    float s = 0.f;
    for (int64_t t = 0; t < p.N; ++t) s += da[t * m + u];
    p.dbase[u] += s;
  } else if (u < m + (head ? 1 : 3)) {
    float s = 0.f;
    for (int64_t t = 0; t < p.N; ++t)
      for (int64_t o = 0; o < m; ++o)
        if (group(o, p.n, head) == u - m) s += da[t * m + o] * p.z[t * m + o];
    p.dscale[u - m] += s;
  }
}

__global__ void post_fwd_kernel(MhcParams p) {
  const int64_t n = p.n, D = p.D;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < p.N * n * D;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = e / (n * D), k = e / D % n, d = e % D;
    float s = p.post[t * n + k] * p.y[t * D + d];
    for (int64_t i = 0; i < n; ++i) s += p.comb[(t * n + i) * n + k] * p.x[(t * n + i) * D + d];
    p.out[e] = s;
  }
}

__global__ void post_bwd_kernel(MhcParams p) {
  __shared__ float red[kThreads];
  const int64_t t = blockIdx.x, n = p.n, D = p.D;
  const float* g = p.dout + t * n * D;
  const float* x = p.x + t * n * D;
  for (int64_t d = threadIdx.x; d < D; d += kThreads) {
    float s = 0.f;
    for (int64_t k = 0; k < n; ++k) s += p.post[t * n + k] * g[k * D + d];
    p.dy_out[t * D + d] = s;
  }
  for (int64_t j = threadIdx.x; j < n * D; j += kThreads) {
    const int64_t i = j / D, d = j % D;
    float s = 0.f;
    for (int64_t k = 0; k < n; ++k) s += p.comb[(t * n + i) * n + k] * g[k * D + d];
    p.dx[t * n * D + j] = s;
  }
  for (int64_t k = 0; k < n; ++k) {
    float s = 0.f;
    for (int64_t d = threadIdx.x; d < D; d += kThreads) s += g[k * D + d] * p.y[t * D + d];
    s = block_sum<kThreads>(s, red);
    if (threadIdx.x == 0) p.dpost_out[t * n + k] = s;
    for (int64_t i = 0; i < n; ++i) {
      float c = 0.f;
      for (int64_t d = threadIdx.x; d < D; d += kThreads) c += g[k * D + d] * x[i * D + d];
      c = block_sum<kThreads>(c, red);
      if (threadIdx.x == 0) p.dcomb_out[(t * n + i) * n + k] = c;
    }
  }
}

void mix_fwd(const MhcParams& p, bool head) {
  if (p.N == 0) return;
  HMLA_LAUNCH(mix_fwd_kernel, unsigned(p.N), kThreads, 0, stream(), p, head);
  check_launch(head ? "mhc_head_fwd" : "mhc_pre_fwd");
}

void mix_bwd(const MhcParams& p, bool head) {
  if (p.N == 0) return;
  const int64_t m = head ? p.n : (2 + p.n) * p.n;
  Scratch<float> da(p.N * m), dzr(p.N * m);
  HMLA_LAUNCH(mix_bwd_kernel, unsigned(p.N), kThreads, 0, stream(), p, head, da.get(), dzr.get());
  check_launch(head ? "mhc_head_bwd" : "mhc_pre_bwd");
  HMLA_LAUNCH(dfn_kernel, grid_for(m * p.n * p.D), kThreads, 0, stream(), p, m, dzr.get());
  check_launch("mhc dfn");
  HMLA_LAUNCH(dbase_kernel, 1, kThreads, 0, stream(), p, m, head, da.get());
  check_launch("mhc dbase");
}

}  // namespace

void mhc_pre_fwd(const MhcParams& p) { mix_fwd(p, false); }
void mhc_pre_bwd(const MhcParams& p) { mix_bwd(p, false); }
void mhc_head_fwd(const MhcParams& p) { mix_fwd(p, true); }
void mhc_head_bwd(const MhcParams& p) { mix_bwd(p, true); }

void mhc_post_fwd(const MhcParams& p) {
  if (p.N == 0) return;
  HMLA_LAUNCH(post_fwd_kernel, grid_for(p.N * p.n * p.D), kThreads, 0, stream(), p);
  check_launch("mhc_post_fwd");
}

void mhc_post_bwd(const MhcParams& p) {
  if (p.N == 0) return;
  HMLA_LAUNCH(post_bwd_kernel, unsigned(p.N), kThreads, 0, stream(), p);
  check_launch("mhc_post_bwd");
}

// The plan (cuda_kernels.h): f32, every size the entry points accept (N < 2^31 blocks).
Plan plan(Op, const MhcParams& p) {
  return p.N < (int64_t(1) << 31) ? Plan{Variant::simt, {}} : Plan{Variant::none, "mhc: 2^31 or more tokens"};
}

}  // namespace hmla::cuda
