// Entry points of the mHC ops (hmla/ops/mhc.h): validate dtypes, shapes and the device once, fill
// the params, and call the backend of the tensors' device.
#include "hmla/ops/mhc.h"

#include <cmath>
#include <initializer_list>
#include <string>

#include "hmla/core/error.h"
#include "hmla/ops/backend.h"
#include "entry_point.h"

namespace hmla {

namespace {

using detail::desc;

void run(const char* op, Op entry, const MhcParams& p, std::initializer_list<const Tensor*> ts) {
  detail::run(op, entry, p, ts, "these mHC tensors (f32 on every device)");
}

void need(const Tensor& t, const Shape& shape, const char* op, const char* name) {
  HMLA_CHECK(t.defined() && t.dtype() == DType::f32 && t.is_contiguous() && t.shape() == shape, ShapeError, op, ": ",
             name, " must be a contiguous f32", shape_str(shape), " tensor, got ", desc(t),
             t.defined() && !t.is_contiguous() ? " (strided)" : "");
}

// The streams x [N, n, D]: its sizes into p.
void streams(const Tensor& x, const char* op, MhcParams& p) {
  HMLA_CHECK(x.defined() && x.dim() == 3, ShapeError, op, ": the streams must be [N, n, D], got ", desc(x));
  p.N = x.size(0), p.n = x.size(1), p.D = x.size(2);
  need(x, {p.N, p.n, p.D}, op, "the streams");
  HMLA_CHECK(p.n >= 1 && p.n <= kMhcMaxStreams && p.D >= 1, ShapeError, op, ": hc_mult = ", p.n, ", width ", p.D,
             ": hc_mult must be in [1, ", kMhcMaxStreams, "] and the width at least 1");
  p.x = x.data<float>();
}

// The mixer's weights (or gradients) for m rows: fn [m, n D], base [m], scale [groups].
void weights(const MhcWeights& w, const MhcParams& p, bool head, const char* op, const char* what) {
  const int64_t m = head ? p.n : (2 + p.n) * p.n;
  need(w.fn, {m, p.n * p.D}, op, (std::string(what) + " fn").c_str());
  need(w.base, {m}, op, (std::string(what) + " base").c_str());
  need(w.scale, {head ? 1 : 3}, op, (std::string(what) + " scale").c_str());
}

void saved(const MhcSaved& s, const MhcParams& p, bool head, const char* op) {
  need(s.rstd, {p.N}, op, "the saved rstd");
  need(s.z, {p.N, head ? p.n : (2 + p.n) * p.n}, op, "the saved z");
}

void check_hc(float hc_eps, int64_t iters, const char* op) {
  HMLA_CHECK(std::isfinite(hc_eps) && hc_eps >= 0 && iters >= 1, ConfigError, op, ": hc_eps = ", hc_eps,
             ", hc_sinkhorn_iters = ", iters, ": hc_eps must be finite and >= 0, the iterations >= 1");
}
void check_norm_eps(float norm_eps, const char* op) {
  HMLA_CHECK(std::isfinite(norm_eps) && norm_eps > 0, ConfigError, op, ": rms_norm_eps = ", norm_eps,
             ": it must be finite and > 0");
}

}  // namespace

void mhc_pre_fwd(const Tensor& x, const MhcWeights& w, int64_t iters, float norm_eps, float hc_eps, const Tensor& y,
                 const Tensor& post, const Tensor& comb, const MhcSaved& s) {
  const char* op = "mhc_pre";
  MhcParams p;
  streams(x, op, p);
  check_norm_eps(norm_eps, op);
  check_hc(hc_eps, iters, op);
  weights(w, p, false, op, "the mixer's");
  saved(s, p, false, op);
  need(y, {p.N, p.D}, op, "y");
  need(post, {p.N, p.n}, op, "post");
  need(comb, {p.N, p.n, p.n}, op, "comb");
  p.iters = iters, p.norm_eps = norm_eps, p.hc_eps = hc_eps;
  p.fn = w.fn.data<float>(), p.base = w.base.data<float>(), p.scale = w.scale.data<float>();
  p.rstd = s.rstd.data<float>(), p.z = s.z.data<float>();
  p.y = y.data<float>(), p.post = post.data<float>(), p.comb = comb.data<float>();
  run(op, Op::mhc_pre_fwd, p, {&x, &w.fn, &w.base, &w.scale, &s.rstd, &s.z, &y, &post, &comb});
}

void mhc_pre_bwd(const Tensor& dy, const Tensor& dpost, const Tensor& dcomb, const Tensor& x, const MhcWeights& w,
                 const MhcSaved& s, int64_t iters, float hc_eps, const Tensor& dx, const MhcWeights& dw) {
  const char* op = "mhc_pre backward";
  MhcParams p;
  streams(x, op, p);
  check_hc(hc_eps, iters, op);
  weights(w, p, false, op, "the mixer's");
  weights(dw, p, false, op, "the gradient of the mixer's");
  saved(s, p, false, op);
  need(dy, {p.N, p.D}, op, "dy");
  need(dpost, {p.N, p.n}, op, "dpost");
  need(dcomb, {p.N, p.n, p.n}, op, "dcomb");
  need(dx, {p.N, p.n, p.D}, op, "dx");
  p.iters = iters, p.hc_eps = hc_eps;
  p.fn = w.fn.data<float>(), p.base = w.base.data<float>(), p.scale = w.scale.data<float>();
  p.rstd = s.rstd.data<float>(), p.z = s.z.data<float>();
  p.dy = dy.data<float>(), p.dpost = dpost.data<float>(), p.dcomb = dcomb.data<float>(), p.dx = dx.data<float>();
  p.dfn = dw.fn.data<float>(), p.dbase = dw.base.data<float>(), p.dscale = dw.scale.data<float>();
  run(op, Op::mhc_pre_bwd, p,
      {&x, &w.fn, &w.base, &w.scale, &s.rstd, &s.z, &dy, &dpost, &dcomb, &dx, &dw.fn, &dw.base, &dw.scale});
}

void mhc_post_fwd(const Tensor& x, const Tensor& y, const Tensor& post, const Tensor& comb, const Tensor& out) {
  const char* op = "mhc_post";
  MhcParams p;
  streams(x, op, p);
  need(y, {p.N, p.D}, op, "y");
  need(post, {p.N, p.n}, op, "post");
  need(comb, {p.N, p.n, p.n}, op, "comb");
  need(out, {p.N, p.n, p.D}, op, "out");
  HMLA_CHECK(out.raw_data() != x.raw_data() || p.N * p.D == 0, ShapeError, op, ": out may not alias the streams");
  p.y = y.data<float>(), p.post = post.data<float>(), p.comb = comb.data<float>(), p.out = out.data<float>();
  run(op, Op::mhc_post_fwd, p, {&x, &y, &post, &comb, &out});
}

void mhc_post_bwd(const Tensor& dout, const Tensor& x, const Tensor& y, const Tensor& post, const Tensor& comb,
                  const Tensor& dx, const Tensor& dy, const Tensor& dpost, const Tensor& dcomb) {
  const char* op = "mhc_post backward";
  MhcParams p;
  streams(x, op, p);
  need(dout, {p.N, p.n, p.D}, op, "dout");
  need(y, {p.N, p.D}, op, "y");
  need(post, {p.N, p.n}, op, "post");
  need(comb, {p.N, p.n, p.n}, op, "comb");
  need(dx, {p.N, p.n, p.D}, op, "dx");
  need(dy, {p.N, p.D}, op, "dy");
  need(dpost, {p.N, p.n}, op, "dpost");
  need(dcomb, {p.N, p.n, p.n}, op, "dcomb");
  p.dout = dout.data<float>(), p.y = y.data<float>(), p.post = post.data<float>(), p.comb = comb.data<float>();
  p.dx = dx.data<float>(), p.dy_out = dy.data<float>(), p.dpost_out = dpost.data<float>();
  p.dcomb_out = dcomb.data<float>();
  run(op, Op::mhc_post_bwd, p, {&dout, &x, &y, &post, &comb, &dx, &dy, &dpost, &dcomb});
}

void mhc_head_fwd(const Tensor& x, const MhcWeights& w, float norm_eps, float hc_eps, const Tensor& y,
                  const MhcSaved& s) {
  const char* op = "mhc_head";
  MhcParams p;
  streams(x, op, p);
  check_norm_eps(norm_eps, op);
  check_hc(hc_eps, 1, op);
  weights(w, p, true, op, "hc_head's");
  saved(s, p, true, op);
  need(y, {p.N, p.D}, op, "y");
  p.norm_eps = norm_eps, p.hc_eps = hc_eps;
  p.fn = w.fn.data<float>(), p.base = w.base.data<float>(), p.scale = w.scale.data<float>();
  p.rstd = s.rstd.data<float>(), p.z = s.z.data<float>(), p.y = y.data<float>();
  run(op, Op::mhc_head_fwd, p, {&x, &w.fn, &w.base, &w.scale, &s.rstd, &s.z, &y});
}

void mhc_head_bwd(const Tensor& dy, const Tensor& x, const MhcWeights& w, const MhcSaved& s, float hc_eps,
                  const Tensor& dx, const MhcWeights& dw) {
  const char* op = "mhc_head backward";
  MhcParams p;
  streams(x, op, p);
  check_hc(hc_eps, 1, op);
  weights(w, p, true, op, "hc_head's");
  weights(dw, p, true, op, "the gradient of hc_head's");
  saved(s, p, true, op);
  need(dy, {p.N, p.D}, op, "dy");
  need(dx, {p.N, p.n, p.D}, op, "dx");
  p.hc_eps = hc_eps;
  p.fn = w.fn.data<float>(), p.base = w.base.data<float>(), p.scale = w.scale.data<float>();
  p.rstd = s.rstd.data<float>(), p.z = s.z.data<float>(), p.dy = dy.data<float>(), p.dx = dx.data<float>();
  p.dfn = dw.fn.data<float>(), p.dbase = dw.base.data<float>(), p.dscale = dw.scale.data<float>();
  run(op, Op::mhc_head_bwd, p, {&x, &w.fn, &w.base, &w.scale, &s.rstd, &s.z, &dy, &dx, &dw.fn, &dw.base, &dw.scale});
}

}  // namespace hmla
