// Entry points of the CSA indexer over compressed entries (hmla/ops/compressed_index.h): validate
// shapes, dtypes, K and, on host tensors, the entry metadata's contract once; fill the params;
// dispatch. The KLs add the attention's tensors, the row weights and the table to the same checks.
#include "hmla/ops/compressed_index.h"

#include <cmath>
#include <limits>
#include <string>

#include "entry_point.h"
#include "hmla/core/error.h"
#include "hmla/ops/backend.h"

namespace hmla {

namespace {

constexpr const char* kOp = "compressed index";

// What a backend was asked, for its refusal.
std::string widths(const CompressedIndexParams& p) {
  return std::string(dtype_name(p.dtype)) + " qI and kI, nI = " + std::to_string(p.nI) + ", dI = " + std::to_string(p.dI) +
         ", K = " + std::to_string(p.K);
}

void check_dense(const Tensor& t, const char* name, const Shape& want, DType dt, Device dev, const char* op = kOp) {
  HMLA_CHECK(t.defined() && t.shape() == want && t.dtype() == dt && t.device() == dev && t.is_contiguous(), ShapeError,
             op, ": ", name, " must be a contiguous ", dtype_name(dt), shape_str(want), " tensor on ",
             device_name(dev), ", got ", detail::desc(t));
}

CompressedIndexParams make_params(const CompressedIndexInputs& in, const char* op = kOp) {
  HMLA_CHECK(in.qI.defined() && in.qI.dim() == 4 && in.qI.size(2) >= 1 && in.qI.size(3) >= 1, ShapeError, op,
             ": qI must be [b, s, nI >= 1, dI >= 1], got ", detail::desc(in.qI));
  const Device dev = in.qI.device();
  const int64_t b = in.qI.size(0), sq = in.qI.size(1), nI = in.qI.size(2), dI = in.qI.size(3);
  // qI and kI in one dtype, f32 or bf16 (the backend's plan says whether it reads bf16).
  const DType dt = in.qI.dtype() == DType::bf16 ? DType::bf16 : DType::f32;
  check_dense(in.qI, "qI", {b, sq, nI, dI}, dt, dev, op);
  HMLA_CHECK(in.kI.defined() && in.kI.dim() == 3, ShapeError, op, ": kI must be [b, n_e, dI], got ", detail::desc(in.kI));
  const int64_t n_e = in.kI.size(1);
  check_dense(in.kI, "kI", {b, n_e, dI}, dt, dev, op);
  check_dense(in.w, "w", {b, sq, nI}, DType::f32, dev, op);
  check_dense(in.ent_last, "ent_last", {b, n_e}, DType::i32, dev, op);
  check_dense(in.ent_doc, "ent_doc", {b, n_e}, DType::i32, dev, op);
  HMLA_CHECK(n_e < (int64_t(1) << 31), ShapeError, op, ": n_e = ", n_e, " entries: table entries are i32");
  HMLA_CHECK(in.layout != nullptr, LayoutError, op, ": a document layout is required");
  const int64_t s = in.layout->s;
  HMLA_CHECK(in.layout->b == b && in.q_row0 >= 0 && in.q_row0 + sq <= s, LayoutError, op, ": the layout covers b = ",
             in.layout->b, ", s = ", s, " but qI has b = ", b, " and rows [", in.q_row0, ", ", in.q_row0 + sq, ")");
  CompressedIndexParams p;
  p.dtype = dt;
  p.b = b, p.s = s, p.sq = sq, p.q_row0 = in.q_row0, p.nI = nI, p.dI = dI, p.n_e = n_e;
  p.qI = in.qI.raw_data();
  p.kI = in.kI.raw_data();
  p.w = in.w.data<float>();
  p.ent_last = in.ent_last.data<int32_t>();
  p.ent_doc = in.ent_doc.data<int32_t>();
  if (dev == Device::cpu) detail::check_entry_metadata(op, p.ent_doc, p.ent_last, *in.layout, b, n_e);
  return p;
}

// The layout's doc_start on the inputs' device (held alive by the caller's tensors), then dispatch.
void run(const CompressedIndexInputs& in, CompressedIndexParams p, Op entry) {
  const Device dev = in.qI.device();
  const Tensor ds = in.layout->doc_start_on(dev);
  p.doc_start = ds.data<int32_t>();
  dispatch(dev, entry, p, kOp, widths(p));
}

}  // namespace

Tensor compressed_index_topk(const CompressedIndexInputs& in, int64_t K) {
  HMLA_CHECK(K >= 1, ShapeError, kOp, ": K = ", K, ": it must be at least 1");
  CompressedIndexParams p = make_params(in);  // validated before anything is allocated
  p.K = K;
  Tensor idx = Tensor::empty({p.b, p.sq, K}, DType::i32, in.qI.device());
  p.idx = idx.data<int32_t>();
  run(in, p, Op::compressed_index_topk);
  return idx;
}

Tensor compressed_index_scores(const CompressedIndexInputs& in) {
  CompressedIndexParams p = make_params(in);
  Tensor scores = Tensor::empty({p.b, p.sq, p.n_e}, DType::f32, in.qI.device());
  p.scores = scores.data<float>();
  run(in, p, Op::compressed_index_scores);
  return scores;
}

namespace {

// The scores' checks (make_params) plus the attention's q, ent, lse, the row weights and the scalars.
CompressedIndexKlParams make_kl_params(const CompressedIndexKlInputs& in, const char* op) {
  CompressedIndexKlParams p;
  static_cast<CompressedIndexParams&>(p) = make_params(in.sc, op);
  const Device dev = in.sc.qI.device();
  const int64_t b = p.b, s = p.sq, n_e = p.n_e;  // s: the query rows
  HMLA_CHECK(in.q.defined() && in.q.dim() == 4 && in.q.size(0) == b && in.q.size(1) == s && in.q.size(2) >= 1 &&
                 in.q.size(3) >= 1 && (in.q.dtype() == DType::f32 || in.q.dtype() == DType::bf16) &&
                 in.q.device() == dev,
             ShapeError, op, ": q must be an f32 or bf16 [b = ", b, ", s = ", s, ", H >= 1, d >= 1] tensor on ",
             device_name(dev), ", got ", detail::desc(in.q));
  const DType qk = in.q.dtype();  // q and ent in one dtype
  HMLA_CHECK(kernel_strides_ok(in.q), ShapeError, op, ": q has strides ", shape_str(in.q.strides()),
             " that no kernel takes (the last dimension contiguous, rows and heads at strides in [", in.q.size(3),
             ", 2^31)); pass a contiguous copy");
  const int64_t H = in.q.size(2), d = in.q.size(3);
  if (n_e > 0 || in.ent.defined()) check_dense(in.ent, "ent", {b, n_e, d}, qk, dev, op);
  check_dense(in.lse, "lse", {b, H, s}, DType::f32, dev, op);
  check_dense(in.row_weight, "row_weight", {b, s}, DType::f32, dev, op);
  HMLA_CHECK(std::isfinite(in.scale) && in.scale > 0 && std::isfinite(in.coeff) && in.coeff >= 0, ShapeError, op,
             ": scale must be a finite number > 0 and coeff a finite number >= 0, got scale = ", in.scale,
             ", coeff = ", in.coeff);
  if (in.kl_acc.defined())
    HMLA_CHECK(in.kl_acc.dtype() == DType::f64 && in.kl_acc.numel() == 1 && in.kl_acc.device() == dev, ShapeError,
               op, ": kl_acc must be one f64 value on ", device_name(dev), ", got ", detail::desc(in.kl_acc));
  p.H = H, p.d = d, p.qk_dtype = qk;
  const Shape qs = kernel_strides(in.q);
  p.q = in.q.raw_data();
  p.q_bstride = qs[0], p.q_rstride = qs[1], p.q_hstride = qs[2];
  p.ent = n_e > 0 ? in.ent.raw_data() : nullptr;
  p.lse = in.lse.data<float>();
  p.row_weight = in.row_weight.data<float>();
  p.scale = in.scale, p.coeff = in.coeff;
  return p;
}

// Allocates the gradients and runs `entry`; its sum is added into in.kl_acc on the device, or into a
// one-value accumulator read back into kl_sum and loss when none is given.
CompressedIndexKlResult run_kl(const CompressedIndexKlInputs& in, CompressedIndexKlParams p, Op entry, const char* op) {
  const Device dev = in.sc.qI.device();
  CompressedIndexKlResult r{0, 0, Tensor::empty(in.sc.qI.shape(), DType::f32, dev),
                            Tensor::empty(in.sc.kI.shape(), DType::f32, dev), Tensor::empty(in.sc.w.shape(), DType::f32, dev)};
  p.dqI = r.dqI.data<float>(), p.dkI = r.dkI.data<float>(), p.dw = r.dw.data<float>();
  const Tensor acc = in.kl_acc.defined() ? in.kl_acc : Tensor::zeros({1}, DType::f64, dev);
  p.kl_acc = acc.data<double>();
  const Tensor ds = in.sc.layout->doc_start_on(dev), de = in.sc.layout->doc_end_on(dev);
  p.doc_start = ds.data<int32_t>();
  p.doc_end = de.data<int32_t>();
  dispatch(dev, entry, p, op, widths(p) + ", " + dtype_name(p.qk_dtype) + " q and ent");
  if (in.kl_acc.defined()) {
    r.kl_sum = r.loss = std::numeric_limits<double>::quiet_NaN();  // on the device only
  } else {
    r.kl_sum = acc.to_vector<double>()[0];
    r.loss = double(in.coeff) * r.kl_sum;
  }
  return r;
}

}  // namespace

CompressedIndexKlResult compressed_index_kl_dense(const CompressedIndexKlInputs& in) {
  const char* op = "compressed_index_kl_dense";
  return run_kl(in, make_kl_params(in, op), Op::compressed_index_kl_dense, op);
}

CompressedIndexKlResult compressed_index_kl_sparse(const CompressedIndexKlInputs& in) {
  const char* op = "compressed_index_kl_sparse";
  CompressedIndexKlParams p = make_kl_params(in, op);
  const Device dev = in.sc.qI.device();
  HMLA_CHECK(in.topk.defined() && in.topk.dim() == 3 && in.topk.size(0) == p.b && in.topk.size(1) == p.sq &&
                 in.topk.size(2) >= 1 && in.topk.dtype() == DType::i32 && in.topk.is_contiguous() && in.topk.device() == dev,
             ShapeError, op, ": topk must be a contiguous i32 [b = ", p.b, ", s = ", p.sq, ", K >= 1] table on ",
             device_name(dev), " (compressed_index_topk's), got ", detail::desc(in.topk));
  p.K = in.topk.size(2);
  p.topk = in.topk.data<int32_t>();
  return run_kl(in, p, Op::compressed_index_kl_sparse, op);
}

}  // namespace hmla
