// The optimizers' per-tensor steps as ops (docs/optim.md): the gradient's sum of squares (the
// global norm), the AdamW update and Muon's momentum and update. Newton-Schulz runs on matmul and
// axpy (hmla/ops/nn.h). f32, contiguous tensors of one shape on one device.
#pragma once
#include <cstdint>

#include "hmla/core/tensor.h"

namespace hmla {

// The training step's device scalars: one f64 buffer of kStatCount slots on the model's device,
// zeroed once per step, filled by the ops below and read back once per step (src/train/step.cpp).
// The mb slots are one micro-batch's sums, added into the step's once the micro-batch is done, so
// every sum keeps the order of additions the host loop had.
enum StatSlot : int64_t {
  kStatLm,              // the step's LM loss (this rank's micro-batches)
  kStatKl,              // the step's indexer KL (sum over micro-batches of the mean over dsa layers)
  kStatKlCsa,           // the same over a V4 stack's CSA layers only (DESIGN.md section 10)
  kStatMbLm,            // this micro-batch's LM loss (chunks of the head)
  kStatMbKl,            // this micro-batch's KL summed over its dsa layers but CSA ones
  kStatMbKlCsa,         // this micro-batch's KL summed over its CSA layers
  kStatMtp,             // the step's MTP loss (sum over micro-batches of (1 / D) sum_k CE_k, without coeff)
  kStatMbMtp,           // this micro-batch's coeff / D sum_k CE_k
  kStatSsBackbone,      // the gradient's sum of squares, backbone tensors in table order
  kStatSsIndexer,       // the same over the indexers' tensors
  kStatNormBackbone,    // sqrt of the above (stats_clip)
  kStatNormIndexer,
  kStatScaleBackbone,   // the clip scale, a float value (stats_clip)
  kStatScaleIndexer,
  kStatFinite,          // 1: losses and norms finite, the update may move weights; 0: it moves none
  kStatCount
};

// Adds sum_i x[i]^2 in f64, in index order, into the scalar acc (a running sum over several
// tensors stays one sequence of additions).
struct SumSquaresParams {
  int64_t n = 0;
  const float* x = nullptr;  // [n]
  double* acc = nullptr;     // [1] on the op's device
};
// acc: an f64 tensor of one value on x's device.
void sum_squares_into(const Tensor& x, const Tensor& acc);
// init + sum_i x[i]^2 on the host (one read-back; tests and callers outside the step).
double sum_squares(const Tensor& x, double init = 0);

// The step's scalar steps on its stats buffer s, each one thread of work on the device:
//   stats_add:    s[dst] += s[src] / div (a micro-batch's sums into the step's)
//   stats_losses: bad[0] = 0 if s[lm], s[kl] and s[mtp] are finite, else 1 (this rank's verdict; the
//                 caller sums bad over the ranks on the device)
//   stats_clip:   the norms sqrt(s[ss]), the clip scales (clip > 0 && norm > clip) ? float(clip /
//                 norm) : 1, and s[finite] = (bad[0] == 0 && both norms finite)
struct StatsParams {
  double* s = nullptr;  // [kStatCount]
  int64_t dst = 0, src = 0;
  double div = 1;
  float* bad = nullptr;  // [1]
  double clip_backbone = 0, clip_indexer = 0;  // <= 0: no clipping
};
// s: the f64 [kStatCount] buffer; bad: f32 [1] on its device.
void stats_add(const Tensor& s, StatSlot dst, StatSlot src, double div);
void stats_losses(const Tensor& s, const Tensor& bad);
void stats_clip(const Tensor& s, const Tensor& bad, double clip_backbone, double clip_indexer);

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
  // On the device, set by the entries' `stats` (the step's buffer): gscale = float(*gscale_at),
  // and nothing is written unless *finite_at != 0 (a non-finite step moves no weight or moment).
  const double* gscale_at = nullptr;  // [1] or null: gscale as given
  const double* finite_at = nullptr;  // [1] or null: always finite
};
// stats (optional): the step's f64 [kStatCount] buffer on w's device; gscale comes from its slot
// `scale` and the update is skipped when its kStatFinite slot is 0 (hyper.gscale is then unused).
void adamw_update(const Tensor& w, const Tensor& g, const Tensor& m, const Tensor& v, const AdamWParams& hyper,
                  const Tensor& stats = {}, StatSlot scale = kStatScaleBackbone);

// Muon's momentum with Nesterov: m = beta m + gscale g; u = gscale g + beta m. Then, after
// u's orthogonalisation upd, the update w -= lr (scale upd + wd w). With the step's stats (as
// adamw_update): gscale from the buffer; not finite: m and w untouched, u = 0. muon_normalize:
// u = x * float(1 / (sqrt(ss) + 1e-7)), Newton-Schulz's start, ss an f64 [1] on the device.
struct MuonParams {  // every pointer [n] contiguous
  int64_t n = 0;
  float* w = nullptr;
  const float* g = nullptr;
  float* m = nullptr;
  float* u = nullptr;          // momentum: written; update: the orthogonalised direction, read
  float gscale = 1.f, beta = 0.f;
  float lr = 0.f, scale = 0.f, wd = 0.f;
  const double* gscale_at = nullptr;  // as AdamWParams
  const double* finite_at = nullptr;
  const double* ss = nullptr;  // muon_normalize: [1]
};
void muon_momentum(const Tensor& g, const Tensor& m, const Tensor& u, float gscale, float beta,
                   const Tensor& stats = {}, StatSlot scale = kStatScaleBackbone);
void muon_update(const Tensor& w, const Tensor& upd, float lr, float scale, float wd, const Tensor& stats = {});
void muon_normalize(const Tensor& x, const Tensor& ss, const Tensor& u);

}  // namespace hmla

// The family's backend entries (op_list.h).
#define HMLA_OPTIM_PARAMS(X) X(SumSquaresParams) X(StatsParams) X(AdamWParams) X(MuonParams)
#define HMLA_OPTIM_OPS(X)                      \
  X(void, sum_squares, SumSquaresParams)       \
  X(void, stats_add, StatsParams)              \
  X(void, stats_losses, StatsParams)           \
  X(void, stats_clip, StatsParams)             \
  X(void, adamw_update, AdamWParams)           \
  X(void, muon_momentum, MuonParams)           \
  X(void, muon_normalize, MuonParams)          \
  X(void, muon_update, MuonParams)
