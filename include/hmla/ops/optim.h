// The optimizers' per-tensor steps as ops (docs/optim.md): the gradient's sum of squares (the
// global norm), the AdamW update and Muon's momentum and update. Newton-Schulz runs on matmul and
// axpy (hmla/ops/nn.h). f32, contiguous tensors of one shape on one device.
#pragma once
#include <cstdint>

#include "hmla/core/tensor.h"

namespace hmla {

// init + sum_i x[i]^2 in f64, in index order (a running sum over several tensors stays one
// sequence of additions).
struct SumSquaresParams {
  int64_t n = 0;
  const float* x = nullptr;  // [n]
  double init = 0;
};
double sum_squares(const Tensor& x, double init = 0);

// AdamW on n values, the gradient scaled by gscale (clipping):
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  w -= lr (m / bc1 / (sqrt(v / bc2) + eps) + wd w).
struct AdamWParams {  // every pointer [n] contiguous
  int64_t n = 0;
  float* w = nullptr;
  const float* g = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  float gscale = 1.f, lr = 0.f, b1 = 0.f, b2 = 0.f, eps = 0.f, wd = 0.f;
  double bc1 = 1, bc2 = 1;  // bias corrections 1 - beta^t
};
void adamw_update(const Tensor& w, const Tensor& g, const Tensor& m, const Tensor& v, const AdamWParams& hyper);

// Muon's momentum with Nesterov: m = beta m + gscale g; u = gscale g + beta m. Then, after
// u's orthogonalisation upd, the update w -= lr (scale upd + wd w).
struct MuonParams {  // every pointer [n] contiguous
  int64_t n = 0;
  float* w = nullptr;
  const float* g = nullptr;
  float* m = nullptr;
  float* u = nullptr;          // momentum: written; update: the orthogonalised direction, read
  float gscale = 1.f, beta = 0.f;
  float lr = 0.f, scale = 0.f, wd = 0.f;
};
void muon_momentum(const Tensor& g, const Tensor& m, const Tensor& u, float gscale, float beta);
void muon_update(const Tensor& w, const Tensor& upd, float lr, float scale, float wd);

}  // namespace hmla

// The family's backend entries (op_list.h).
#define HMLA_OPTIM_OPS(X)                      \
  X(double, sum_squares, SumSquaresParams)     \
  X(void, adamw_update, AdamWParams)           \
  X(void, muon_momentum, MuonParams)           \
  X(void, muon_update, MuonParams)
