// The MoE load-balancing ops on the GPU (hmla/ops/moe.h), with the CPU's formulas
// (src/cpu/moe_balance.cpp). Deterministic without atomics:
//   - the load: one thread per (segment, expert) walks the segment's tokens and slots in order
//     (integer counts in f64: exact in any order anyway);
//   - the bias update: one thread per expert, each summing the E loads in expert order;
//   - the balance loss: one thread per token writes its own dlogits row and its loss term; one
//     thread then sums the terms in token order (0 + t0 + t1 + ..., then into the accumulator, as
//     the CPU does).
// Simple rather than fast: O(N k E) for the load, which a later issue can replace by one block
// per segment with a shared-memory histogram in a fixed order. The MoE forward itself is not on
// CUDA yet (moe.cu), so nothing reaches these kernels in a training step.
#include <cmath>
#include <cstdint>

#include "cuda_kernels.h"
#include "runtime.h"
#include "strided.cuh"

namespace hmla::cuda {

namespace {

constexpr int kThreads = 256;

cudaStream_t stream() { return current_stream().get(); }

#define HMLA_GRID_STRIDE(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

__global__ void expert_load_kernel(MoeBalanceParams p) {
  const int64_t per = p.N / p.rows;
  HMLA_GRID_STRIDE(i, p.rows * p.E) {
    const int64_t r = i / p.E, e = i % p.E;
    double n = p.accumulate ? p.load[i] : 0.0;
    for (int64_t t = r * per; t < (r + 1) * per; ++t) {
      if (p.mask && !(p.mask[t] > 0.f)) continue;
      for (int64_t j = 0; j < p.k; ++j) n += p.idx[t * p.k + j] == e ? 1.0 : 0.0;
    }
    p.load[i] = n;
  }
}

__global__ void bias_update_kernel(MoeBalanceParams p) {
  HMLA_GRID_STRIDE(e, p.E) {
    double total = 0;
    for (int64_t i = 0; i < p.E; ++i) total += p.load_in[i];
    const double d = total - double(p.E) * p.load_in[e];
    const float sign = d > 0 ? 1.f : d < 0 ? -1.f : 0.f;
    p.bias[e] = p.bias[e] + p.rate * sign;
  }
}

// Token t's loss term into lt[t] (0 off the loss rows) and its gradient added into dlogits row t.
__global__ void aux_loss_kernel(MoeBalanceParams p, double* lt) {
  const int64_t E = p.E, per = p.N / p.rows;
  HMLA_GRID_STRIDE(t, p.N) {
    lt[t] = 0;
    if (!(p.mask[t] > 0.f)) continue;
    const float* u = p.logits + t * E;
    const double* F = p.counts + (t / per) * E;
    double T = 0;
    for (int64_t e = 0; e < E; ++e) T += F[e];
    T /= double(p.k);
    const float c = float(p.scale / (T * T));
    float S = 0.f;
    for (int64_t e = 0; e < E; ++e) S += 1.f / (1.f + expf(-u[e]));
    float q = 0.f;
    for (int64_t e = 0; e < E; ++e) q += float(F[e]) * ((1.f / (1.f + expf(-u[e]))) / S);
    lt[t] = double(c) * double(q);
    float* d = p.dlogits + t * E;
    for (int64_t e = 0; e < E; ++e) {
      const float s = 1.f / (1.f + expf(-u[e]));
      d[e] += c * (float(F[e]) - q) / S * (s * (1.f - s));
    }
  }
}

__global__ void aux_sum_kernel(const double* lt, int64_t n, double* acc) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += lt[i];
  *acc += s;
}

#undef HMLA_GRID_STRIDE

}  // namespace

void moe_expert_load(const MoeBalanceParams& p) {
  if (p.rows * p.E == 0) return;
  HMLA_LAUNCH(expert_load_kernel, grid_for(p.rows * p.E), kThreads, 0, stream(), p);
  check_launch("moe_expert_load");
}

void moe_bias_update(const MoeBalanceParams& p) {
  if (p.E == 0) return;
  HMLA_LAUNCH(bias_update_kernel, grid_for(p.E), kThreads, 0, stream(), p);
  check_launch("moe_bias_update");
}

void moe_aux_loss(const MoeBalanceParams& p) {
  if (p.N == 0) return;
  Scratch<double> lt(p.N);
  HMLA_LAUNCH(aux_loss_kernel, grid_for(p.N), kThreads, 0, stream(), p, lt.get());
  check_launch("moe_aux_loss");
  HMLA_LAUNCH(aux_sum_kernel, 1, 1, 0, stream(), lt.get(), p.N, p.loss);
  check_launch("moe_aux_loss sum");
}

// The plan (cuda_kernels.h): every size.
Plan plan(Op, const MoeBalanceParams&) { return {Variant::simt, {}}; }

}  // namespace hmla::cuda
