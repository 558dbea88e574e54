// Entry points of the CSA indexer over compressed entries (hmla/ops/compressed_index.h): validate
// shapes, dtypes, K and, on host tensors, the entry metadata's contract once; fill the params;
// dispatch.
#include "hmla/ops/compressed_index.h"

#include "entry_point.h"
#include "hmla/core/error.h"
#include "hmla/ops/backend.h"

namespace hmla {

namespace {

constexpr const char* kOp = "compressed index";

void check_dense(const Tensor& t, const char* name, const Shape& want, DType dt, Device dev) {
  HMLA_CHECK(t.defined() && t.shape() == want && t.dtype() == dt && t.device() == dev && t.is_contiguous(), ShapeError,
             kOp, ": ", name, " must be a contiguous ", dtype_name(dt), shape_str(want), " tensor on ",
             device_name(dev), ", got ", detail::desc(t));
}

CompressedIndexParams make_params(const CompressedIndexInputs& in) {
  HMLA_CHECK(in.qI.defined() && in.qI.dim() == 4 && in.qI.size(2) >= 1 && in.qI.size(3) >= 1, ShapeError, kOp,
             ": qI must be [b, s, nI >= 1, dI >= 1], got ", detail::desc(in.qI));
  const Device dev = in.qI.device();
  const int64_t b = in.qI.size(0), s = in.qI.size(1), nI = in.qI.size(2), dI = in.qI.size(3);
  check_dense(in.qI, "qI", {b, s, nI, dI}, DType::f32, dev);
  HMLA_CHECK(in.kI.defined() && in.kI.dim() == 3, ShapeError, kOp, ": kI must be [b, n_e, dI], got ", detail::desc(in.kI));
  const int64_t n_e = in.kI.size(1);
  check_dense(in.kI, "kI", {b, n_e, dI}, DType::f32, dev);
  check_dense(in.w, "w", {b, s, nI}, DType::f32, dev);
  check_dense(in.ent_last, "ent_last", {b, n_e}, DType::i32, dev);
  check_dense(in.ent_doc, "ent_doc", {b, n_e}, DType::i32, dev);
  HMLA_CHECK(n_e < (int64_t(1) << 31), ShapeError, kOp, ": n_e = ", n_e, " entries: table entries are i32");
  HMLA_CHECK(in.layout != nullptr, LayoutError, kOp, ": a document layout is required");
  HMLA_CHECK(in.layout->b == b && in.layout->s == s, LayoutError, kOp, ": the layout covers b = ", in.layout->b,
             ", s = ", in.layout->s, " but qI has b = ", b, ", s = ", s);
  CompressedIndexParams p;
  p.b = b, p.s = s, p.nI = nI, p.dI = dI, p.n_e = n_e;
  p.qI = in.qI.data<float>();
  p.kI = in.kI.data<float>();
  p.w = in.w.data<float>();
  p.ent_last = in.ent_last.data<int32_t>();
  p.ent_doc = in.ent_doc.data<int32_t>();
  if (dev == Device::cpu) detail::check_entry_metadata(kOp, p.ent_doc, p.ent_last, *in.layout, b, n_e);
  return p;
}

// The layout's doc_start on the inputs' device (held alive by the caller's tensors), then dispatch.
void run(const CompressedIndexInputs& in, CompressedIndexParams p, Op entry) {
  const Device dev = in.qI.device();
  const Tensor ds = in.layout->doc_start_on(dev);
  p.doc_start = ds.data<int32_t>();
  dispatch(dev, entry, p, kOp, "f32 inputs");
}

}  // namespace

Tensor compressed_index_topk(const CompressedIndexInputs& in, int64_t K) {
  HMLA_CHECK(K >= 1, ShapeError, kOp, ": K = ", K, ": it must be at least 1");
  CompressedIndexParams p = make_params(in);  // validated before anything is allocated
  p.K = K;
  Tensor idx = Tensor::empty({p.b, p.s, K}, DType::i32, in.qI.device());
  p.idx = idx.data<int32_t>();
  run(in, p, Op::compressed_index_topk);
  return idx;
}

Tensor compressed_index_scores(const CompressedIndexInputs& in) {
  CompressedIndexParams p = make_params(in);
  Tensor scores = Tensor::empty({p.b, p.s, p.n_e}, DType::f32, in.qI.device());
  p.scores = scores.data<float>();
  run(in, p, Op::compressed_index_scores);
  return scores;
}

}  // namespace hmla
