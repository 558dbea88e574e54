// The optimizers' element-wise steps (docs/optim.md), in index order on one thread: the bits do
// not depend on the thread count.
#include <algorithm>
#include <cmath>

#include "cpu_kernels.h"

namespace hmla::cpu {

void sum_squares(const SumSquaresParams& p) {
  double ss = *p.acc;
  for (int64_t i = 0; i < p.n; ++i) ss += double(p.x[i]) * p.x[i];
  *p.acc = ss;
}

void stats_add(const StatsParams& p) { p.s[p.dst] += p.s[p.src] / p.div; }

void stats_losses(const StatsParams& p) {
  p.bad[0] = std::isfinite(p.s[kStatLm]) && std::isfinite(p.s[kStatKl]) && std::isfinite(p.s[kStatMtp]) ? 0.f : 1.f;
}

void stats_clip(const StatsParams& p) {
  double* s = p.s;
  s[kStatNormBackbone] = std::sqrt(s[kStatSsBackbone]);
  s[kStatNormIndexer] = std::sqrt(s[kStatSsIndexer]);
  auto scale = [](double clip, double norm) { return (clip > 0 && norm > clip) ? float(clip / norm) : 1.f; };
  s[kStatScaleBackbone] = scale(p.clip_backbone, s[kStatNormBackbone]);
  s[kStatScaleIndexer] = scale(p.clip_indexer, s[kStatNormIndexer]);
  const bool ok = p.bad[0] == 0.f && std::isfinite(s[kStatNormBackbone]) && std::isfinite(s[kStatNormIndexer]);
  s[kStatFinite] = ok ? 1 : 0;
}

// The gate of the step's stats (hmla/ops/optim.h): false when the step moves nothing.
template <class P>
bool gated(const P& p, float& gscale) {
  if (p.finite_at && *p.finite_at == 0) return false;
  if (p.gscale_at) gscale = float(*p.gscale_at);
  return true;
}

void adamw_update(const AdamWParams& p) {
  float gscale = p.gscale;
  if (!gated(p, gscale)) return;
  const float b1 = p.b1, b2 = p.b2, eps = p.eps, wd = p.wd, lr = p.lr;
  for (int64_t i = 0; i < p.n; ++i) {
    const float gi = p.g[i] * gscale;
    p.m[i] = b1 * p.m[i] + (1 - b1) * gi;
    p.v[i] = b2 * p.v[i] + (1 - b2) * gi * gi;
    const float mh = p.m[i] / float(p.bc1), vh = p.v[i] / float(p.bc2);
    p.w[i] -= lr * (mh / (std::sqrt(vh) + eps) + wd * p.w[i]);
  }
}

void muon_momentum(const MuonParams& p) {
  float gscale = p.gscale;
  if (!gated(p, gscale)) {  // m kept; u defined for the orthogonalisation that follows
    std::fill(p.u, p.u + p.n, 0.f);
    return;
  }
  const float beta = p.beta;
  for (int64_t i = 0; i < p.n; ++i) {
    p.m[i] = beta * p.m[i] + p.g[i] * gscale;
    p.u[i] = p.g[i] * gscale + beta * p.m[i];  // Nesterov
  }
}

void muon_normalize(const MuonParams& p) {
  const float inv = float(1.0 / (std::sqrt(*p.ss) + 1e-7));
  for (int64_t i = 0; i < p.n; ++i) p.u[i] = inv * p.g[i];
}

void muon_update(const MuonParams& p) {
  float gscale = 1.f;
  if (!gated(p, gscale)) return;
  const float lr = p.lr, scale = p.scale, wd = p.wd;
  for (int64_t i = 0; i < p.n; ++i) p.w[i] -= lr * (scale * p.u[i] + wd * p.w[i]);
}

// The CPU's plans (cpu_kernels.h): f32 state and gradients, every shape.
Plan plan(Op, const SumSquaresParams&) { return {Variant::cpu, {}}; }
Plan plan(Op, const StatsParams&) { return {Variant::cpu, {}}; }
Plan plan(Op, const AdamWParams&) { return {Variant::cpu, {}}; }
Plan plan(Op, const MuonParams&) { return {Variant::cpu, {}}; }

}  // namespace hmla::cpu
