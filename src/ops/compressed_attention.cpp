// Entry points of DeepSeek-V4's attention core (hmla/ops/compressed_attention.h): validate shapes,
// dtypes and, on host tensors, the entry metadata's contract once; fill the params; dispatch.
#include "hmla/ops/compressed_attention.h"

#include <cmath>
#include <string>

#include "entry_point.h"
#include "hmla/core/error.h"
#include "hmla/ops/backend.h"

namespace hmla {

namespace detail {

// Every used entry of batch row bb belongs to a document of the row (ent_doc a document start),
// ends inside it, and the row's entries are sorted by document, then by last row, unused slots
// (ent_doc -1) last: what makes the visible entries of a query one range. A host pass over b n_e.
void check_entry_metadata(const char* op, const int32_t* doc, const int32_t* last, const DocLayout& l, int64_t b,
                          int64_t n_e) {
  const int32_t* ds = l.doc_start.data<int32_t>();
  const int32_t* de = l.doc_end.data<int32_t>();
  for (int64_t bb = 0; bb < b; ++bb)
    for (int64_t e = 0; e < n_e; ++e) {
      const int64_t i = bb * n_e + e, st = doc[i], en = last[i];
      if (st == -1) {  // an unused slot: only after the row's entries
        HMLA_CHECK(e + 1 == n_e || doc[i + 1] == -1, LayoutError, op, ": entry ", e, " of batch row ", bb,
                   " is unused (ent_doc -1) but a used one follows: unused slots end a row");
        continue;
      }
      HMLA_CHECK(st >= 0 && st < l.s && ds[bb * l.s + st] == st && en >= st && en < de[bb * l.s + st], LayoutError, op,
                 ": entry ", e, " of batch row ", bb, " (ent_doc ", st, ", ent_last ", en,
                 ") is not inside a document: ent_doc must be a document's first row and ent_last a row of it");
      HMLA_CHECK(e == 0 || doc[i - 1] < st || (doc[i - 1] == st && last[i - 1] < en), LayoutError, op, ": entry ", e,
                 " of batch row ", bb, " is out of order: a row's entries go by document, then by ent_last (the "
                 "compressor's order)");
    }
}

}  // namespace detail

namespace {

constexpr const char* kOp = "compressed attention";

void check_dense(const Tensor& t, const char* name, const Shape& want, DType dt, Device dev) {
  HMLA_CHECK(t.defined() && t.shape() == want && t.dtype() == dt && t.device() == dev && t.is_contiguous(), ShapeError,
             kOp, ": ", name, " must be a contiguous ", dtype_name(dt), shape_str(want), " tensor on ",
             device_name(dev), ", got ", detail::desc(t));
}

AttnCompressedParams make_params(const AttnCompressedInputs& in) {
  HMLA_CHECK(in.q.defined() && in.q.dim() == 4 && in.q.size(2) >= 1 && in.q.size(3) >= 1, ShapeError, kOp,
             ": q must be [b, s, H >= 1, d >= 1], got ", detail::desc(in.q));
  HMLA_CHECK(kernel_strides_ok(in.q), ShapeError, kOp, ": q has strides ", shape_str(in.q.strides()),
             " that no kernel takes (the last dimension contiguous, rows and heads at strides in [", in.q.size(3),
             ", 2^31)); pass a contiguous copy");
  const Device dev = in.q.device();
  const DType dt = in.q.dtype();
  const int64_t b = in.q.size(0), sq = in.q.size(1), H = in.q.size(2), d = in.q.size(3);
  HMLA_CHECK(in.layout != nullptr, LayoutError, kOp, ": a document layout is required");
  const int64_t s = in.layout->s;
  HMLA_CHECK(in.layout->b == b && in.q_row0 >= 0 && in.q_row0 + sq <= s, LayoutError, kOp, ": the layout covers b = ",
             in.layout->b, ", s = ", s, " but q has b = ", b, " and rows [", in.q_row0, ", ", in.q_row0 + sq, ")");
  check_dense(in.kv, "kv", {b, s, d}, dt, dev);
  HMLA_CHECK(!in.ent.defined() || in.ent.dim() == 3, ShapeError, kOp, ": ent must be [b, n_e, d], got ",
             detail::desc(in.ent));
  const int64_t n_e = in.ent.defined() ? in.ent.size(1) : 0;
  if (in.ent.defined()) check_dense(in.ent, "ent", {b, n_e, d}, dt, dev);
  if (n_e > 0) {
    check_dense(in.ent_last, "ent_last", {b, n_e}, DType::i32, dev);
    check_dense(in.ent_doc, "ent_doc", {b, n_e}, DType::i32, dev);
  }
  HMLA_CHECK(in.window >= 1, ShapeError, kOp, ": window = ", in.window, ": it must be at least 1");
  HMLA_CHECK(std::isfinite(in.scale) && in.scale > 0.f, ShapeError, kOp,
             ": scale must be a positive finite number, got ", in.scale);
  if (in.sink.defined()) check_dense(in.sink, "sink", {H}, DType::f32, dev);
  AttnCompressedParams p;
  p.dtype = dt;
  p.b = b, p.s = s, p.sq = sq, p.q_row0 = in.q_row0, p.H = H, p.d = d, p.n_e = n_e, p.window = in.window, p.scale = in.scale;
  if (in.idx.defined()) {
    HMLA_CHECK(in.idx.dim() == 3 && in.idx.size(2) >= 1, ShapeError, kOp, ": idx must be [b, s, k >= 1], got ",
               detail::desc(in.idx));
    check_dense(in.idx, "idx", {b, sq, in.idx.size(2)}, DType::i32, dev);
    p.k = in.idx.size(2);
    p.idx = in.idx.data<int32_t>();
  }
  const Shape qs = kernel_strides(in.q);
  p.q = in.q.raw_data();
  p.q_bstride = qs[0], p.q_rstride = qs[1], p.q_hstride = qs[2];
  p.kv = in.kv.raw_data();
  if (n_e > 0) {
    p.ent = in.ent.raw_data();
    p.ent_last = in.ent_last.data<int32_t>();
    p.ent_doc = in.ent_doc.data<int32_t>();
    if (dev == Device::cpu) detail::check_entry_metadata(kOp, p.ent_doc, p.ent_last, *in.layout, b, n_e);
  }
  p.sink = in.sink.defined() ? in.sink.data<float>() : nullptr;
  return p;
}

std::string why(const AttnCompressedParams& p) {
  return std::string(dtype_name(p.dtype)) + " (the CPU runs f32; CUDA f32 and bf16)";
}

// The layout as a kernel on the inputs' device reads it (held alive by the caller's tensors).
void run(const AttnCompressedInputs& in, AttnCompressedParams p, Op entry) {
  const Device dev = in.q.device();
  const Tensor ds = in.layout->doc_start_on(dev), de = in.layout->doc_end_on(dev);
  p.doc_start = ds.data<int32_t>();
  p.doc_end = de.data<int32_t>();
  dispatch(dev, entry, p, kOp, why(p));
}

void fwd_into(const AttnCompressedInputs& in, AttnCompressedParams p, const AttnCompressedSaved& sv) {
  const Device dev = in.q.device();
  check_dense(sv.out, "out", {p.b, p.sq, p.H, p.d}, p.dtype, dev);
  check_dense(sv.lse, "lse", {p.b, p.H, p.sq}, DType::f32, dev);
  p.out = sv.out.raw_data();
  p.lse = sv.lse.data<float>();
  run(in, p, Op::attn_compressed_fwd);
}

}  // namespace

bool attn_compressed_supports(const AttnCompressedInputs& in) {
  const Device dev = in.q.device();
  if (dev == Device::cuda && !cuda_backend()) return false;
  const AttnCompressedParams p = make_params(in);
  const Backend& be = backend(dev);
  return be.supports(Op::attn_compressed_fwd, p) && be.supports(Op::attn_compressed_bwd, p);
}

AttnCompressedSaved attn_compressed_fwd(const AttnCompressedInputs& in) {
  const AttnCompressedParams p = make_params(in);  // validated before anything is allocated
  const Device dev = in.q.device();
  AttnCompressedSaved sv{Tensor::empty({p.b, p.sq, p.H, p.d}, p.dtype, dev), Tensor::empty({p.b, p.H, p.sq}, DType::f32, dev)};
  fwd_into(in, p, sv);
  return sv;
}

void attn_compressed_fwd(const AttnCompressedInputs& in, const AttnCompressedSaved& saved) {
  fwd_into(in, make_params(in), saved);
}

AttnCompressedGrads attn_compressed_bwd(const AttnCompressedInputs& in, const AttnCompressedSaved& sv,
                                        const Tensor& dout, const Tensor& dsink) {
  AttnCompressedParams p = make_params(in);
  const Device dev = in.q.device();
  check_dense(dout, "dout", {p.b, p.sq, p.H, p.d}, p.dtype, dev);
  check_dense(sv.out, "out", {p.b, p.sq, p.H, p.d}, p.dtype, dev);
  check_dense(sv.lse, "lse", {p.b, p.H, p.sq}, DType::f32, dev);
  AttnCompressedGrads g{Tensor::empty({p.b, p.sq, p.H, p.d}, p.dtype, dev), Tensor::empty({p.b, p.s, p.d}, p.dtype, dev),
                        p.n_e > 0 ? Tensor::empty({p.b, p.n_e, p.d}, p.dtype, dev) : Tensor(),
                        !in.sink.defined() ? Tensor() : dsink.defined() ? dsink : Tensor::zeros({p.H}, DType::f32, dev)};
  if (g.dsink.defined()) check_dense(g.dsink, "dsink", {p.H}, DType::f32, dev);
  p.out = sv.out.raw_data();
  p.lse = sv.lse.data<float>();
  p.dout = dout.raw_data();
  p.dq = g.dq.raw_data();
  p.dkv = g.dkv.raw_data();
  p.dent = p.n_e > 0 ? g.dent.raw_data() : nullptr;
  p.dsink = g.dsink.defined() ? g.dsink.data<float>() : nullptr;
  run(in, p, Op::attn_compressed_bwd);
  return g;
}

void attn_compressed_mass(const Tensor& lse, const Tensor& lse_ws, const Tensor& sink, const Tensor& row_weight,
                          const Tensor& acc) {
  HMLA_CHECK(lse.defined() && lse.dim() == 3, ShapeError, "attention mass: lse must be [b, H, s], got ", detail::desc(lse));
  const int64_t b = lse.size(0), H = lse.size(1), sq = lse.size(2);
  const Device dev = lse.device();
  check_dense(lse, "lse", {b, H, sq}, DType::f32, dev);
  check_dense(lse_ws, "lse_ws", {b, H, sq}, DType::f32, dev);
  if (sink.defined()) check_dense(sink, "sink", {H}, DType::f32, dev);
  check_dense(row_weight, "row_weight", {b, sq}, DType::f32, dev);
  check_dense(acc, "the mass's sums", {4}, DType::f64, dev);
  AttnMassParams p;
  p.b = b, p.sq = sq, p.H = H;
  p.lse = lse.data<float>(), p.lse_ws = lse_ws.data<float>(), p.sink = sink.defined() ? sink.data<float>() : nullptr;
  p.row_weight = row_weight.data<float>(), p.acc = acc.data<double>();
  detail::run("attention mass", Op::attn_compressed_mass, p, {&lse, &lse_ws, &sink, &row_weight, &acc});
}

}  // namespace hmla
