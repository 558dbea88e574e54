// The optimizer steps on the GPU, f32 (hmla/ops/optim.h), with the CPU's formulas. Deterministic
// by construction: sum_squares takes f64 partials over fixed chunks of kSumChunk values, added in
// order into the caller's device accumulator by one thread (nn.cuh's ordered_sum; nothing is read
// back); the step's stats ops (norms, clip scales, the finite flag) are one thread each; AdamW and
// Muon's element-wise steps are grid-stride loops behind the step's gate (its device scalars).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda_kernels.h"
#include "nn.cuh"
#include "reduce.cuh"
#include "runtime.h"
#include "traits.h"

namespace hmla::cuda {

namespace {

using detail::launch;
using detail::ordered_sum;
using detail::stream;

constexpr int kThreads = NnTraits::kThreads;          // sum_squares' block
constexpr int64_t kSumChunk = NnTraits::kSumChunk;  // values per partial of sum_squares

__global__ void sum_squares_kernel(const float* x, int64_t n, double* part) {
  __shared__ double red[kThreads];
  const int64_t i0 = int64_t(blockIdx.x) * kSumChunk, i1 = i0 + kSumChunk < n ? i0 + kSumChunk : n;
  double s = 0;
  for (int64_t i = i0 + threadIdx.x; i < i1; i += kThreads) s += double(x[i]) * x[i];
  s = block_sum<kThreads>(s, red);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void stats_add_kernel(StatsParams p) { p.s[p.dst] += p.s[p.src] / p.div; }

// x - x is 0 for every finite x and NaN for inf and NaN (the same test on nvcc and the emulator).
__device__ bool finite(double x) { return x - x == 0; }

__global__ void stats_losses_kernel(StatsParams p) {
  p.bad[0] = finite(p.s[kStatLm]) && finite(p.s[kStatKl]) && finite(p.s[kStatMtp]) ? 0.f : 1.f;
}

// IEEE sqrt and division in f64, as the host's std::sqrt and operator/ (the same bits).
__device__ float clip_scale(double clip, double norm) { return (clip > 0 && norm > clip) ? float(clip / norm) : 1.f; }

__global__ void stats_clip_kernel(StatsParams p) {
  double* s = p.s;
  s[kStatNormBackbone] = sqrt(s[kStatSsBackbone]);
  s[kStatNormIndexer] = sqrt(s[kStatSsIndexer]);
  s[kStatScaleBackbone] = clip_scale(p.clip_backbone, s[kStatNormBackbone]);
  s[kStatScaleIndexer] = clip_scale(p.clip_indexer, s[kStatNormIndexer]);
  const bool ok = p.bad[0] == 0.f && finite(s[kStatNormBackbone]) && finite(s[kStatNormIndexer]);
  s[kStatFinite] = ok ? 1 : 0;
}

// The step's gate (hmla/ops/optim.h): every thread reads the two device scalars.
#define HMLA_GATE(p, gs)                                   \
  const bool open_ = !(p.finite_at && *p.finite_at == 0);  \
  const float gs = p.gscale_at ? float(*p.gscale_at) : p.gscale;

__global__ void adamw_kernel(AdamWParams p) {
  HMLA_GATE(p, gscale)
  if (!open_) return;
  HMLA_GRID_STRIDE(i, p.n) {
    const float gi = p.g[i] * gscale;
    p.m[i] = p.b1 * p.m[i] + (1 - p.b1) * gi;
    p.v[i] = p.b2 * p.v[i] + (1 - p.b2) * gi * gi;
    const float mh = p.m[i] / float(p.bc1), vh = p.v[i] / float(p.bc2);
    p.w[i] -= p.lr * (mh / (sqrtf(vh) + p.eps) + p.wd * p.w[i]);
  }
}

__global__ void muon_momentum_kernel(MuonParams p) {
  HMLA_GATE(p, gscale)
  HMLA_GRID_STRIDE(i, p.n) {
    if (!open_) {  // m kept; u defined for the orthogonalisation that follows
      p.u[i] = 0.f;
      continue;
    }
    p.m[i] = p.beta * p.m[i] + p.g[i] * gscale;
    p.u[i] = p.g[i] * gscale + p.beta * p.m[i];
  }
}

__global__ void muon_normalize_kernel(MuonParams p) {
  const float inv = float(1.0 / (sqrt(*p.ss) + 1e-7));
  HMLA_GRID_STRIDE(i, p.n) p.u[i] = inv * p.g[i];
}

__global__ void muon_update_kernel(MuonParams p) {
  HMLA_GATE(p, unused)
  (void)unused;
  if (!open_) return;
  HMLA_GRID_STRIDE(i, p.n) p.w[i] -= p.lr * (p.scale * p.u[i] + p.wd * p.w[i]);
}

#undef HMLA_GATE
#undef HMLA_GRID_STRIDE

// The step's scalar steps: one thread each.
template <class K>
void one_thread(K kernel, const StatsParams& p, const char* what) {
  HMLA_LAUNCH(kernel, 1, 1, 0, stream(), p);
  check_launch(what);
}

}  // namespace

void sum_squares(const SumSquaresParams& p) {
  if (p.n == 0) return;
  const int64_t chunks = (p.n + kSumChunk - 1) / kSumChunk;
  Scratch<double> part(chunks);
  HMLA_LAUNCH(sum_squares_kernel, unsigned(chunks), kThreads, 0, stream(), p.x, p.n, part.get());
  check_launch("sum_squares");
  ordered_sum(part.get(), chunks, p.acc, "sum_squares sum");
}

void stats_add(const StatsParams& p) { one_thread(stats_add_kernel, p, "stats_add"); }
void stats_losses(const StatsParams& p) { one_thread(stats_losses_kernel, p, "stats_losses"); }
void stats_clip(const StatsParams& p) { one_thread(stats_clip_kernel, p, "stats_clip"); }

void adamw_update(const AdamWParams& p) { launch(adamw_kernel, p.n, p, "adamw"); }
void muon_momentum(const MuonParams& p) { launch(muon_momentum_kernel, p.n, p, "muon momentum"); }
void muon_normalize(const MuonParams& p) { launch(muon_normalize_kernel, p.n, p, "muon normalize"); }
void muon_update(const MuonParams& p) { launch(muon_update_kernel, p.n, p, "muon update"); }

// The plans (cuda_kernels.h): f32 tensors (the params carry no dtype), every shape.
Plan plan(Op, const SumSquaresParams&) { return {Variant::simt, {}}; }
Plan plan(Op, const StatsParams&) { return {Variant::simt, {}}; }
Plan plan(Op, const AdamWParams&) { return {Variant::simt, {}}; }
Plan plan(Op, const MuonParams&) { return {Variant::simt, {}}; }

}  // namespace hmla::cuda
