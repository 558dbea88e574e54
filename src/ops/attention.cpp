// Entry points of the dense attention op: validate shapes, dtypes and layouts once, build the
// params struct, and dispatch to the backend of the inputs' device.
#include "hmla/ops/attention.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "hmla/core/error.h"
#include "hmla/ops/backend.h"

namespace hmla {

namespace {

// The cuDNN path's bounds from the host layout: documents over all rows, the longest one.
void doc_bounds(const DocLayout& l, int64_t& ndocs, int64_t& max_doc) {
  const int32_t* ds = l.doc_start.data<int32_t>();
  const int32_t* de = l.doc_end.data<int32_t>();
  ndocs = 0, max_doc = 0;
  for (int64_t i = 0; i < l.b * l.s; ++i)
    if (ds[i] == i % l.s) ++ndocs, max_doc = std::max<int64_t>(max_doc, de[i] - ds[i]);
}

void check_rows(const Tensor& t, const char* name, int64_t b, int64_t s, int64_t heads,
                int64_t width) {
  HMLA_CHECK(t.defined(), ShapeError, "attention: ", name, " is missing");
  HMLA_CHECK(t.dim() == 4, ShapeError, "attention: ", name, " must be [b, s, heads, dim], got ",
             shape_str(t.shape()));
  Shape want{b, s, heads, width};
  HMLA_CHECK(t.shape() == want, ShapeError, "attention: ", name, " has shape ",
             shape_str(t.shape()), ", expected ", shape_str(want));
  HMLA_CHECK(kernel_strides_ok(t), ShapeError, "attention: ", name, " has strides ", shape_str(t.strides()),
             " that no kernel takes (the last dimension contiguous, rows and heads at strides in [",
             t.size(3), ", 2^31)); pass a contiguous copy");
}

void check_out(const Tensor& t, const char* name, const Shape& want, DType dtype, Device dev) {
  HMLA_CHECK(t.defined() && t.shape() == want && t.dtype() == dtype && t.device() == dev &&
                 t.is_contiguous(),
             ShapeError, "attention: ", name, " must be a contiguous ", dtype_name(dtype),
             shape_str(want), " tensor on ", device_name(dev), ", got ",
             t.defined() ? dtype_name(t.dtype()) : "undefined",
             t.defined() ? shape_str(t.shape()) : "");
}

AttnDenseParams make_params(const AttnDenseInputs& in) {
  HMLA_CHECK(in.q.defined() && in.k.defined() && in.v.defined(), ShapeError,
             "attention: q, k and v are required");
  HMLA_CHECK(in.q.dim() == 4 && in.k.dim() == 4 && in.v.dim() == 4, ShapeError,
             "attention: q, k, v must be 4-D [b, s, heads, dim]; got q ", shape_str(in.q.shape()),
             ", k ", shape_str(in.k.shape()), ", v ", shape_str(in.v.shape()));
  AttnDenseParams p;
  p.b = in.q.size(0);
  p.sq = in.q.size(1);
  p.s = in.k.size(1);
  p.q_row0 = in.q_row0;
  p.H = in.q.size(2);
  p.Dqk = in.q.size(3);
  p.Hkv = in.k.size(2);
  p.Dv = in.v.size(3);
  HMLA_CHECK(p.H >= 1 && p.Hkv >= 1 && p.H % p.Hkv == 0, ShapeError, "attention: Hkv = ", p.Hkv,
             " must divide H = ", p.H);
  HMLA_CHECK(p.Dqk >= 1 && p.Dv >= 1, ShapeError, "attention: head widths must be positive");
  HMLA_CHECK(p.q_row0 >= 0 && p.q_row0 + p.sq <= p.s, ShapeError, "attention: query rows [", p.q_row0, ", ",
             p.q_row0 + p.sq, ") are not inside the ", p.s, " key rows");
  check_rows(in.q, "q", p.b, p.sq, p.H, p.Dqk);
  check_rows(in.k, "k", p.b, p.s, p.Hkv, p.Dqk);
  check_rows(in.v, "v", p.b, p.s, p.Hkv, p.Dv);
  DType dt = in.q.dtype();
  Device dev = in.q.device();
  HMLA_CHECK(in.k.dtype() == dt && in.v.dtype() == dt, ShapeError,
             "attention: q, k and v must share one dtype");
  HMLA_CHECK(in.k.device() == dev && in.v.device() == dev, ShapeError,
             "attention: q, k and v must be on one device");
  HMLA_CHECK(in.layout != nullptr, LayoutError, "attention: a document layout is required");
  HMLA_CHECK(in.layout->b == p.b && in.layout->s == p.s, LayoutError, "attention: the layout covers b = ",
             in.layout->b, ", s = ", in.layout->s, " but k has b = ", p.b, ", s = ", p.s);
  HMLA_CHECK(std::isfinite(in.scale) && in.scale > 0.f, ShapeError,
             "attention: scale must be a positive finite number, got ", in.scale);
  if (in.sink.defined())
    check_out(in.sink, "sink", {p.H}, DType::f32, dev);
  p.dtype = dt;
  p.scale = in.scale;
  const Shape qs = kernel_strides(in.q), ks = kernel_strides(in.k), vs = kernel_strides(in.v);
  p.q = in.q.raw_data();
  p.q_bstride = qs[0], p.q_rstride = qs[1], p.q_hstride = qs[2];
  p.k = in.k.raw_data();
  p.k_bstride = ks[0], p.k_rstride = ks[1], p.k_hstride = ks[2];
  p.v = in.v.raw_data();
  p.v_bstride = vs[0], p.v_rstride = vs[1], p.v_hstride = vs[2];
  p.doc_start = in.layout->doc_start.data<int32_t>();
  p.doc_end = in.layout->doc_end.data<int32_t>();
  p.sink = in.sink.defined() ? in.sink.data<float>() : nullptr;
  p.backend = in.backend;
  HMLA_CHECK(!(p.backend == AttnBackend::cudnn && dev != Device::cuda), ShapeError,
             "attention: backend cudnn needs CUDA tensors (the CPU has one implementation: auto or hmla)");
  return p;
}

void run(const AttnDenseInputs& in, AttnDenseParams p, Op entry) {
  const Device dev = in.q.device();
  // A GPU kernel reads the layout's device form (uploaded once per micro-batch) or a copy held here.
  const Tensor ds = in.layout->doc_start_on(dev), de = in.layout->doc_end_on(dev);
  p.doc_start = ds.data<int32_t>();
  p.doc_end = de.data<int32_t>();
  if (dev == Device::cuda && p.backend != AttnBackend::hmla && attn_cudnn_built())
    doc_bounds(*in.layout, p.ndocs, p.max_doc);  // a host pass over the layout: only when cuDNN may run
  dispatch(dev, entry, p, "attention",
           std::string(dtype_name(p.dtype)) + " with Dqk = " + std::to_string(p.Dqk) + ", Dv = " + std::to_string(p.Dv) +
               " (the CPU runs f32; CUDA builds run bf16 with Dqk and Dv multiples of 16, tiles within 163 KB of shared memory: 576 / 512 fit)");
}

}  // namespace

const char* attn_backend_name(AttnBackend b) {
  return b == AttnBackend::cudnn ? "cudnn" : b == AttnBackend::hmla ? "hmla" : "auto";
}

AttnBackend parse_attn_backend(const std::string& name, const std::string& what) {
  for (AttnBackend b : {AttnBackend::auto_, AttnBackend::cudnn, AttnBackend::hmla})
    if (name == attn_backend_name(b)) return b;
  throw ConfigError(what + ": attention backend '" + name + "' (known: auto, cudnn, hmla)");
}

bool attn_cudnn_built() {
#ifdef HMLA_HAVE_CUDNN
  return true;
#else
  return false;
#endif
}

bool attn_dense_supports(const AttnDenseInputs& in) {
  const Device dev = in.q.device();
  if (dev == Device::cuda && !cuda_backend()) return false;
  AttnDenseParams p = make_params(in);
  const Backend& be = backend(dev);
  return be.supports(Op::attn_dense_fwd, p) && be.supports(Op::attn_dense_bwd, p);
}

void attn_dense_fwd(const AttnDenseInputs& in, AttnDenseSaved& saved) {
  AttnDenseParams p = make_params(in);
  check_out(saved.out, "out", {p.b, p.sq, p.H, p.Dv}, p.dtype, in.q.device());
  check_out(saved.lse, "lse", {p.b, p.H, p.sq}, DType::f32, in.q.device());
  p.out = saved.out.raw_data();
  p.lse = saved.lse.data<float>();
  run(in, p, Op::attn_dense_fwd);
}

AttnDenseSaved attn_dense_fwd(const AttnDenseInputs& in) {
  AttnDenseParams p = make_params(in);
  Device dev = in.q.device();
  AttnDenseSaved saved{Tensor::empty({p.b, p.sq, p.H, p.Dv}, p.dtype, dev),
                       Tensor::empty({p.b, p.H, p.sq}, DType::f32, dev)};
  attn_dense_fwd(in, saved);
  return saved;
}

void attn_dense_bwd(const AttnDenseInputs& in, const AttnDenseSaved& saved, const Tensor& dout,
                    AttnDenseGrads& g) {
  AttnDenseParams p = make_params(in);
  Device dev = in.q.device();
  check_out(saved.out, "out", {p.b, p.sq, p.H, p.Dv}, p.dtype, dev);
  check_out(saved.lse, "lse", {p.b, p.H, p.sq}, DType::f32, dev);
  check_out(dout, "dout", {p.b, p.sq, p.H, p.Dv}, p.dtype, dev);
  check_out(g.dq, "dq", {p.b, p.sq, p.H, p.Dqk}, p.dtype, dev);
  check_out(g.dk, "dk", {p.b, p.s, p.Hkv, p.Dqk}, p.dtype, dev);
  check_out(g.dv, "dv", {p.b, p.s, p.Hkv, p.Dv}, p.dtype, dev);
  HMLA_CHECK(!g.dk.shares_storage(g.dv) && !g.dq.shares_storage(g.dk), ShapeError,
             "attention: dq, dk and dv must not overlap");
  if (in.sink.defined()) check_out(g.dsink, "dsink", {p.H}, DType::f32, dev);
  p.out = saved.out.raw_data();
  p.lse = saved.lse.data<float>();
  p.dout = dout.raw_data();
  p.dq = g.dq.raw_data();
  p.dk = g.dk.raw_data();
  p.dv = g.dv.raw_data();
  p.dsink = in.sink.defined() ? g.dsink.data<float>() : nullptr;
  run(in, p, Op::attn_dense_bwd);
}

AttnDenseGrads attn_dense_bwd(const AttnDenseInputs& in, const AttnDenseSaved& saved,
                              const Tensor& dout, const Tensor& dsink) {
  Device dev = in.q.device();
  const Tensor ds = !in.sink.defined() ? Tensor() : dsink.defined() ? dsink : Tensor::zeros({in.q.size(2)}, DType::f32, dev);
  AttnDenseGrads g{Tensor::empty(in.q.shape(), in.q.dtype(), dev),
                   Tensor::empty(in.k.shape(), in.k.dtype(), dev),
                   Tensor::empty(in.v.shape(), in.v.dtype(), dev), ds};
  attn_dense_bwd(in, saved, dout, g);
  return g;
}

}  // namespace hmla
