// Entry points of the indexer ops: validation (shapes, layouts, the selection table's contract)
// and dispatch to the backend of the inputs' device.
#include "hmla/ops/indexer.h"

#include <cmath>
#include <limits>
#include <string>

#include "hmla/core/error.h"
#include "hmla/ops/backend.h"
#include "hmla/ops/index_table.h"

namespace hmla {

namespace {

void check_dev(const Tensor& t, const char* name, const Shape& want, DType dtype, Device dev) {
  HMLA_CHECK(t.defined() && t.dtype() == dtype && t.device() == dev && t.is_contiguous() && t.shape() == want,
             ShapeError, "indexer: ", name, " must be a contiguous ", dtype_name(dtype), " ", device_name(dev),
             " tensor ", shape_str(want), ", got ", t.defined() ? dtype_name(t.dtype()) : "undefined",
             t.defined() ? shape_str(t.shape()) : "");
}

// What a backend was asked, for its refusal.
std::string widths(const IndexerScoreParams& p) {
  return std::string(dtype_name(p.dtype)) + " HI = " + std::to_string(p.HI) + ", DI = " + std::to_string(p.DI) +
         ", K = " + std::to_string(p.K);
}

// Validates the score inputs (qI, kI in `dt`, w f32) and fills the params' score fields; the caller
// keeps `ds` (the layout's doc_start on the inputs' device) alive while the params are used.
void check_scores(const IndexerScores& sc, DType dt, IndexerScoreParams& p, Tensor& ds) {
  HMLA_CHECK(sc.qI.defined() && sc.qI.dim() == 4 && sc.kI.defined() && sc.kI.dim() == 3, ShapeError,
             "indexer: qI must be [b, sq, HI, DI] and kI [b, s, DI]");
  const int64_t b = sc.qI.size(0), sq = sc.qI.size(1), HI = sc.qI.size(2), DI = sc.qI.size(3), s = sc.kI.size(1);
  const Device dev = sc.qI.device();
  check_dev(sc.qI, "qI", {b, sq, HI, DI}, dt, dev);
  check_dev(sc.kI, "kI", {b, s, DI}, dt, dev);
  check_dev(sc.w, "w", {b, sq, HI}, DType::f32, dev);
  HMLA_CHECK(sc.q_row0 >= 0 && sc.q_row0 + sq <= s, ShapeError, "indexer: query rows [", sc.q_row0, ", ",
             sc.q_row0 + sq, ") are not inside the ", s, " key rows");
  HMLA_CHECK(sc.layout && sc.layout->b == b && sc.layout->s == s, LayoutError,
             "indexer: the layout must cover b = ", b, ", s = ", s);
  ds = sc.layout->doc_start_on(dev);  // the layout's device form, or a copy for a host-only layout
  p.dtype = dt;
  p.b = b, p.sq = sq, p.s = s, p.HI = HI, p.DI = DI, p.q_row0 = sc.q_row0;
  p.qI = sc.qI.raw_data();
  p.kI = sc.kI.raw_data();
  p.w = sc.w.data<float>();
  p.doc_start = ds.data<int32_t>();
}

IndexerKlParams check_kl(const IndexerKlInputs& in, Tensor& ds) {
  IndexerKlParams p;
  // qI, kI in one dtype, f32 or bf16 (the backend's supports() says whether it reads bf16).
  const DType dt = in.sc.qI.defined() && in.sc.qI.dtype() == DType::bf16 ? DType::bf16 : DType::f32;
  check_scores(in.sc, dt, p, ds);
  const int64_t b = in.sc.qI.size(0), sq = in.sc.qI.size(1), s = in.sc.kI.size(1);
  HMLA_CHECK(in.q.defined() && in.k.defined() && in.q.dim() == 4 && in.k.dim() == 4, ShapeError,
             "indexer KL: attention q [b, sq, H, Dqk] and k [b, s, Hkv, Dqk] are required");
  const int64_t H = in.q.size(2), Hkv = in.k.size(2);
  HMLA_CHECK(in.q.size(0) == b && in.q.size(1) == sq && in.k.size(0) == b && in.k.size(1) == s &&
                 in.k.size(3) == in.q.size(3) && Hkv >= 1 && H % Hkv == 0 &&
                 (in.q.dtype() == DType::f32 || in.q.dtype() == DType::bf16) && in.k.dtype() == in.q.dtype() &&
                 in.q.device() == in.sc.qI.device() && in.k.device() == in.sc.qI.device(),
             ShapeError, "indexer KL: q ", dtype_name(in.q.dtype()), shape_str(in.q.shape()), " and k ",
             dtype_name(in.k.dtype()), shape_str(in.k.shape()),
             " do not fit [b, sq, H, Dqk] / [b, s, Hkv, Dqk] with Hkv dividing H (one dtype, f32 or bf16, on qI's "
             "device)");
  HMLA_CHECK(kernel_strides_ok(in.q) && kernel_strides_ok(in.k), ShapeError, "indexer KL: q (strides ",
             shape_str(in.q.strides()), ") or k (strides ", shape_str(in.k.strides()),
             ") has strides no kernel takes (the last dimension contiguous, rows and heads at strides in [Dqk, "
             "2^31)); pass contiguous copies");
  const Device dev = in.sc.qI.device();
  if (in.lse_c.defined()) check_dev(in.lse_c, "lse_c", {b, H, sq}, DType::f32, dev);
  check_dev(in.row_weight, "row_weight", {b, sq}, DType::f32, dev);
  HMLA_CHECK(std::isfinite(in.scale) && in.scale > 0 && std::isfinite(in.coeff) && in.coeff >= 0, ShapeError,
             "indexer KL: scale must be a finite number > 0 and coeff a finite number >= 0, got scale = ", in.scale,
             ", coeff = ", in.coeff);
  p.H = H, p.Hkv = Hkv, p.Dqk = in.q.size(3);
  const Shape qs = kernel_strides(in.q), ks = kernel_strides(in.k);
  p.qk_dtype = in.q.dtype();
  p.q = in.q.raw_data();
  p.q_bstride = qs[0], p.q_rstride = qs[1], p.q_hstride = qs[2];
  p.k = in.k.raw_data();
  p.k_bstride = ks[0], p.k_rstride = ks[1], p.k_hstride = ks[2];
  p.scale = in.scale, p.coeff = in.coeff;
  p.lse_c = in.lse_c.defined() ? in.lse_c.data<float>() : nullptr;
  p.row_weight = in.row_weight.data<float>();
  return p;
}

// Allocates the gradients and runs the KL `entry`, its sum added into in.kl_acc on the device,
// or into a one-value accumulator read back into kl_sum and loss when none is given.
IndexerKlResult run_kl(Op entry, IndexerKlParams& p,
                       const IndexerKlInputs& in, const char* op) {
  const Device dev = in.sc.qI.device();
  IndexerKlResult r{0, 0, Tensor::empty(in.sc.qI.shape(), DType::f32, dev), Tensor::empty(in.sc.kI.shape(), DType::f32, dev),
                    Tensor::empty(in.sc.w.shape(), DType::f32, dev)};
  p.dqI = r.dqI.data<float>(), p.dkI = r.dkI.data<float>(), p.dw = r.dw.data<float>();
  if (in.kl_acc.defined())
    HMLA_CHECK(in.kl_acc.dtype() == DType::f64 && in.kl_acc.numel() == 1 && in.kl_acc.device() == dev, ShapeError,
               op, ": kl_acc must be one f64 value on qI's device");
  const Tensor acc = in.kl_acc.defined() ? in.kl_acc : Tensor::zeros({1}, DType::f64, dev);
  p.kl_acc = acc.data<double>();
  dispatch(dev, entry, p, op, widths(p) + ", " + dtype_name(p.qk_dtype) + " q and k, H = " + std::to_string(p.H));
  if (in.kl_acc.defined()) {
    r.kl_sum = r.loss = std::numeric_limits<double>::quiet_NaN();  // on the device only
  } else {
    r.kl_sum = acc.to_vector<double>()[0];
    r.loss = double(in.coeff) * r.kl_sum;
  }
  return r;
}

}  // namespace

namespace {

// The selection's params from validated scores, K and W.
IndexerTopkParams topk_params(const IndexerScores& sc, int64_t K, int64_t W, Tensor& ds) {
  IndexerTopkParams p;
  // qI and kI in one dtype, which the backend's supports() accepts or refuses (the CPU scores in
  // f32; the CUDA kernel reads bf16; w is f32 everywhere).
  check_scores(sc, sc.qI.defined() ? sc.qI.dtype() : DType::f32, p, ds);
  HMLA_CHECK(K >= 1, ShapeError, "index_topk = ", K, ": it must be at least 1");
  HMLA_CHECK(W >= 0, ShapeError, "index_window = ", W, ": it must be >= 0");
  p.K = K, p.W = W;
  return p;
}

void topk_into(const IndexerScores& sc, IndexerTopkParams& p, const Tensor& table) {
  const Shape want{p.b, p.sq, p.K + p.W};
  HMLA_CHECK(table.defined() && table.shape() == want && table.dtype() == DType::i32 && table.is_contiguous() &&
                 table.device() == sc.qI.device(),
             ShapeError, "indexer_topk: the table must be a contiguous i32", shape_str(want), " tensor on ",
             device_name(sc.qI.device()));
  p.table = table.data<int32_t>();
  dispatch(sc.qI.device(), Op::indexer_topk, p, "indexer", widths(p));
}

}  // namespace

void indexer_topk(const IndexerScores& sc, int64_t K, int64_t W, const Tensor& table) {
  Tensor ds;
  IndexerTopkParams p = topk_params(sc, K, W, ds);
  topk_into(sc, p, table);
}

Tensor indexer_topk(const IndexerScores& sc, int64_t K, int64_t W) {
  Tensor ds;
  IndexerTopkParams p = topk_params(sc, K, W, ds);  // validated before the table is allocated
  Tensor table = Tensor::empty({p.b, p.sq, K + W}, DType::i32, sc.qI.device());
  topk_into(sc, p, table);
  return table;
}

Tensor indexer_select(const Tensor& scores, const DocLayout& layout, int64_t q_row0, int64_t K, int64_t W) {
  HMLA_CHECK(scores.defined() && scores.dim() == 3 && scores.dtype() == DType::f32 && scores.is_contiguous(),
             ShapeError, "indexer_select: scores must be a contiguous f32 [b, sq, s] tensor");
  const int64_t b = scores.size(0), sq = scores.size(1), s = scores.size(2);
  HMLA_CHECK(layout.b == b && layout.s == s && q_row0 >= 0 && q_row0 + sq <= s, LayoutError,
             "indexer_select: the layout must cover b = ", b, ", s = ", s, " with the rows [", q_row0, ", ",
             q_row0 + sq, ") inside");
  HMLA_CHECK(K >= 1 && W >= 0, ShapeError, "indexer_select: K = ", K, " must be >= 1 and W = ", W, " >= 0");
  const Device dev = scores.device();
  const Tensor ds = layout.doc_start_on(dev);
  IndexerTopkParams p;
  p.b = b, p.sq = sq, p.s = s, p.q_row0 = q_row0, p.K = K, p.W = W;
  p.scores = scores.data<float>();
  p.doc_start = ds.data<int32_t>();
  Tensor table = Tensor::empty({b, sq, K + W}, DType::i32, dev);
  p.table = table.data<int32_t>();
  dispatch(dev, Op::indexer_select, p, "indexer_select", "K = " + std::to_string(K));
  return table;
}

IndexerKlResult indexer_kl_dense(const IndexerKlInputs& in) {
  Tensor ds;
  IndexerKlParams p = check_kl(in, ds);
  return run_kl(Op::indexer_kl_dense, p, in, "indexer KL");
}

IndexerKlResult indexer_kl_sparse(const IndexerKlInputs& in) {
  Tensor ds_dev;
  IndexerKlParams p = check_kl(in, ds_dev);
  const int64_t b = in.sc.qI.size(0), sq = in.sc.qI.size(1);
  HMLA_CHECK(in.topk.defined() && in.topk.dtype() == DType::i32 && in.topk.dim() == 3 && in.topk.size(0) == b &&
                 in.topk.size(1) == sq && in.topk.is_contiguous() && in.K >= 1 && in.topk.size(2) >= in.K &&
                 in.topk.device() == in.sc.qI.device(),
             ShapeError, "indexer sparse KL: topk must be a contiguous i32 [b, sq, K + W] table with K >= 1 on qI's device");
  // The table's contract (DESIGN.md section 4), the window slots included, on a host copy: for
  // external tables only (index_table.h), so the model's own costs no copy.
  if (table_checked(in.topk_origin))
    check_index_table(in.topk, *in.sc.layout, in.sc.q_row0, InvalidIndex::error, "indexer sparse KL");
  const int64_t KW = in.topk.size(2);
  p.K = in.K, p.W = KW - in.K;
  p.topk = in.topk.data<int32_t>();
  return run_kl(Op::indexer_kl_sparse, p, in, "indexer sparse KL");
}

}  // namespace hmla
