// The optimizers' element-wise steps (docs/optim.md), in index order on one thread: the bits do
// not depend on the thread count.
#include <cmath>

#include "cpu_kernels.h"

namespace hmla::cpu {

double sum_squares(const SumSquaresParams& p) {
  double ss = p.init;
  for (int64_t i = 0; i < p.n; ++i) ss += double(p.x[i]) * p.x[i];
  return ss;
}

void adamw_update(const AdamWParams& p) {
  const float b1 = p.b1, b2 = p.b2, eps = p.eps, wd = p.wd, lr = p.lr;
  for (int64_t i = 0; i < p.n; ++i) {
    const float gi = p.g[i] * p.gscale;
    p.m[i] = b1 * p.m[i] + (1 - b1) * gi;
    p.v[i] = b2 * p.v[i] + (1 - b2) * gi * gi;
    const float mh = p.m[i] / float(p.bc1), vh = p.v[i] / float(p.bc2);
    p.w[i] -= lr * (mh / (std::sqrt(vh) + eps) + wd * p.w[i]);
  }
}

void muon_momentum(const MuonParams& p) {
  const float beta = p.beta;
  for (int64_t i = 0; i < p.n; ++i) {
    p.m[i] = beta * p.m[i] + p.g[i] * p.gscale;
    p.u[i] = p.g[i] * p.gscale + beta * p.m[i];  // Nesterov
  }
}

void muon_update(const MuonParams& p) {
  const float lr = p.lr, scale = p.scale, wd = p.wd;
  for (int64_t i = 0; i < p.n; ++i) p.w[i] -= lr * (scale * p.u[i] + wd * p.w[i]);
}

}  // namespace hmla::cpu
