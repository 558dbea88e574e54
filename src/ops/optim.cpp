// Entry points of the optimizer steps (hmla/ops/optim.h): the gradient's sum of squares, the step's
// stats ops, AdamW and Muon's element-wise steps. Each validates its tensors once (f32, contiguous,
// one shape; the stats buffer f64 [kStatCount]), fills its params struct and calls the backend of
// the tensors' device; the updates take their gate (clip scale, finite flag) from the stats buffer.
#include "hmla/ops/optim.h"

#include <utility>

#include "hmla/core/error.h"
#include "hmla/ops/backend.h"
#include "nn_common.h"

namespace hmla {

using detail::check_contiguous;
using detail::check_scalar;
using detail::check_stats;
using detail::run;
using detail::scalar_holding;

void sum_squares_into(const Tensor& x, const Tensor& acc) {
  check_contiguous(x, DType::f32, x.shape(), "sum_squares", "x");
  check_scalar(acc, "sum_squares");
  SumSquaresParams p;
  p.n = x.numel(), p.x = x.data<float>(), p.acc = acc.data<double>();
  run("sum_squares", Op::sum_squares, p, {&x, &acc});
}

double sum_squares(const Tensor& x, double init) {
  HMLA_CHECK(x.defined(), ShapeError, "sum_squares: x is undefined");
  const Tensor acc = scalar_holding(init, x.device());
  sum_squares_into(x, acc);
  return acc.to_vector<double>()[0];
}

void stats_add(const Tensor& s, StatSlot dst, StatSlot src, double div) {
  check_stats(s, "stats_add");
  StatsParams p;
  p.s = s.data<double>(), p.dst = dst, p.src = src, p.div = div;
  run("stats_add", Op::stats_add, p, {&s});
}

void stats_losses(const Tensor& s, const Tensor& bad) {
  check_stats(s, "stats_losses");
  check_contiguous(bad, DType::f32, {1}, "stats_losses", "bad");
  StatsParams p;
  p.s = s.data<double>(), p.bad = bad.data<float>();
  run("stats_losses", Op::stats_losses, p, {&s, &bad});
}

void stats_clip(const Tensor& s, const Tensor& bad, double clip_backbone, double clip_indexer) {
  check_stats(s, "stats_clip");
  check_contiguous(bad, DType::f32, {1}, "stats_clip", "bad");
  StatsParams p;
  p.s = s.data<double>(), p.bad = bad.data<float>(), p.clip_backbone = clip_backbone, p.clip_indexer = clip_indexer;
  run("stats_clip", Op::stats_clip, p, {&s, &bad});
}

namespace {
// The update's gate from the step's stats buffer (none: gscale as given, always applied).
template <class P>
void gate(P& p, const Tensor& stats, StatSlot scale, const char* op) {
  if (!stats.defined()) return;
  check_stats(stats, op);
  HMLA_CHECK(scale == kStatScaleBackbone || scale == kStatScaleIndexer, ShapeError, op,
             ": the clip scale's slot must be kStatScaleBackbone or kStatScaleIndexer");
  p.gscale_at = stats.data<double>() + scale, p.finite_at = stats.data<double>() + kStatFinite;
}
}  // namespace

void adamw_update(const Tensor& w, const Tensor& g, const Tensor& m, const Tensor& v, const AdamWParams& hyper,
                  const Tensor& stats, StatSlot scale) {
  for (auto [t, name] : {std::pair{&w, "w"}, std::pair{&g, "g"}, std::pair{&m, "m"}, std::pair{&v, "v"}})
    check_contiguous(*t, DType::f32, w.shape(), "adamw", name);
  AdamWParams p = hyper;
  p.n = w.numel(), p.w = w.data<float>(), p.g = g.data<float>(), p.m = m.data<float>(), p.v = v.data<float>();
  p.gscale_at = p.finite_at = nullptr;
  gate(p, stats, scale, "adamw");
  run("adamw", Op::adamw_update, p, {&w, &g, &m, &v, &stats});
}

void muon_momentum(const Tensor& g, const Tensor& m, const Tensor& u, float gscale, float beta, const Tensor& stats,
                   StatSlot scale) {
  for (auto [t, name] : {std::pair{&g, "g"}, std::pair{&m, "m"}, std::pair{&u, "u"}})
    check_contiguous(*t, DType::f32, g.shape(), "muon momentum", name);
  MuonParams p;
  p.n = g.numel(), p.g = g.data<float>(), p.m = m.data<float>(), p.u = u.data<float>();
  p.gscale = gscale, p.beta = beta;
  gate(p, stats, scale, "muon momentum");
  run("muon momentum", Op::muon_momentum, p, {&g, &m, &u, &stats});
}

void muon_normalize(const Tensor& x, const Tensor& ss, const Tensor& u) {
  check_contiguous(x, DType::f32, x.shape(), "muon normalize", "x");
  check_contiguous(u, DType::f32, x.shape(), "muon normalize", "u");
  check_scalar(ss, "muon normalize");
  MuonParams p;
  p.n = x.numel(), p.g = x.data<float>(), p.u = u.data<float>(), p.ss = ss.data<double>();
  run("muon normalize", Op::muon_normalize, p, {&x, &u, &ss});
}

void muon_update(const Tensor& w, const Tensor& upd, float lr, float scale_, float wd, const Tensor& stats) {
  check_contiguous(w, DType::f32, w.shape(), "muon update", "w");
  check_contiguous(upd, DType::f32, w.shape(), "muon update", "upd");
  MuonParams p;
  p.n = w.numel(), p.w = w.data<float>(), p.u = upd.data<float>();
  p.lr = lr, p.scale = scale_, p.wd = wd;
  gate(p, stats, kStatScaleBackbone, "muon update");
  run("muon update", Op::muon_update, p, {&w, &upd, &stats});
}

}  // namespace hmla
