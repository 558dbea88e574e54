// Entry points of sparse latent MQA attention: an external index table's contract is checked here
// (entries in [-1, skv), no duplicate in a row; on the GPU by a device-side check whose verdict is
// read back), an own one is not (index_table.h), then the backend's kernel runs: f32 on the CPU;
// bf16 on CUDA (the backward with H a multiple of 16).
#include "hmla/ops/sparse_attention.h"

#include <cmath>
#include <string>

#include "hmla/core/error.h"
#include "hmla/ops/backend.h"

namespace hmla {

namespace {

// What a backend was asked, for its refusal.
std::string widths(const AttnSparseParams& p) {
  return std::string(dtype_name(p.dtype)) + " Dqk = " + std::to_string(p.Dqk) + ", Dv = " + std::to_string(p.Dv) +
         ", H = " + std::to_string(p.H) + (p.dq ? " backward" : "") +
         " (the CPU runs f32; CUDA bf16 with Dqk and Dv multiples of 16, the backward with H a multiple of 16)";
}

// Validates the inputs and fills the params' shape and input fields; runs the table check unless
// the table is the model's own.
AttnSparseParams make_params(const AttnSparseInputs& in) {
  HMLA_CHECK(in.q.defined() && in.q.dim() == 4 && in.q.size(2) >= 1, ShapeError,
             "sparse attention: q must be [b, s, H >= 1, Dqk]");
  HMLA_CHECK(kernel_strides_ok(in.q), ShapeError, "sparse attention: q has strides ", shape_str(in.q.strides()),
             " that no kernel takes (the last dimension contiguous, rows and heads at strides in [", in.q.size(3),
             ", 2^31)); pass a contiguous copy");
  const Device dev = in.q.device();
  const DType dt = in.q.dtype();  // which dtypes a backend runs is its supports()' answer
  const int64_t b = in.q.size(0), s = in.q.size(1), Dqk = in.q.size(3);
  HMLA_CHECK(in.kv.defined() && in.kv.dim() == 3 && in.kv.size(0) == b && in.kv.size(1) >= s &&
                 in.kv.size(2) == Dqk && in.kv.is_contiguous() && in.kv.dtype() == dt && in.kv.device() == dev,
             ShapeError, "sparse attention: kv must be a contiguous ", dtype_name(dt), " [b, skv >= ", s, ", ", Dqk,
             "] tensor on q's device, got ", in.kv.defined() ? shape_str(in.kv.shape()) : "undefined");
  HMLA_CHECK(in.idx.defined() && in.idx.device() == dev, ShapeError, "sparse attention: idx must be on q's device");
  const int64_t skv = in.kv.size(1);
  HMLA_CHECK(in.Dv >= 1 && in.Dv <= Dqk, ShapeError, "sparse attention: Dv = ", in.Dv, " must be in [1, Dqk = ",
             Dqk, "]");
  HMLA_CHECK(in.idx.defined() && in.idx.dtype() == DType::i32 && in.idx.dim() == 3 && in.idx.size(0) == b &&
                 in.idx.size(1) == s && in.idx.is_contiguous() && in.idx.size(2) >= 1,
             ShapeError, "sparse attention: idx must be a contiguous i32 [b, s, K + W] table");
  HMLA_CHECK(in.K >= 0 && in.K <= in.idx.size(2), ShapeError, "sparse attention: K = ", in.K,
             " must be in [0, K + W = ", in.idx.size(2), "]");
  HMLA_CHECK(std::isfinite(in.scale) && in.scale > 0.f, ShapeError, "sparse attention: scale must be positive");
  if (in.sink.defined())
    HMLA_CHECK(in.sink.shape() == Shape({in.q.size(2)}) && in.sink.dtype() == DType::f32 && in.sink.device() == dev &&
                   in.sink.is_contiguous(),
               ShapeError, "sparse attention: sink must be a contiguous f32 [H] tensor on q's device");
  AttnSparseParams p;
  p.dtype = dt;
  p.b = b, p.sq = s, p.skv = skv, p.H = in.q.size(2), p.Dqk = Dqk, p.Dv = in.Dv, p.KW = in.idx.size(2), p.K = in.K;
  p.scale = in.scale;
  const Shape qs = kernel_strides(in.q);
  p.q = in.q.raw_data();
  p.q_bstride = qs[0], p.q_rstride = qs[1], p.q_hstride = qs[2];
  p.kv = in.kv.raw_data();
  p.idx = in.idx.data<int32_t>();
  p.sink = in.sink.defined() ? in.sink.data<float>() : nullptr;
  if (table_checked(in.idx_origin)) dispatch(dev, Op::attn_sparse_check_table, p, "sparse attention", widths(p));
  return p;
}

}  // namespace

namespace {

// The forward into outputs of p's shapes (validated here), on validated params.
void fwd_into(const AttnSparseInputs& in, AttnSparseParams p, const AttnSparseSaved& sv) {
  const int64_t b = p.b, s = p.sq, H = p.H;
  const Device dev = in.q.device();
  auto check_out = [&](const Tensor& t, const char* name, const Shape& want, DType dt) {
    HMLA_CHECK(t.defined() && t.shape() == want && t.dtype() == dt && t.device() == dev && t.is_contiguous(), ShapeError,
               "sparse attention: ", name, " must be a contiguous ", dtype_name(dt), shape_str(want), " tensor on ",
               device_name(dev));
  };
  check_out(sv.out, "out", {b, s, H, in.Dv}, in.q.dtype());
  check_out(sv.lse, "lse", {b, H, s}, DType::f32);
  if (in.K > 0) check_out(sv.lse_c, "lse_c", {b, H, s}, DType::f32);
  p.out = sv.out.raw_data();
  p.lse = sv.lse.data<float>();
  p.lse_c = in.K > 0 ? sv.lse_c.data<float>() : nullptr;
  dispatch(dev, Op::attn_sparse_fwd, p, "sparse attention", widths(p));
}

}  // namespace

AttnSparseSaved attn_sparse_fwd(const AttnSparseInputs& in) {
  const AttnSparseParams p = make_params(in);  // validated before anything is allocated
  const int64_t b = p.b, s = p.sq, H = p.H;
  const Device dev = in.q.device();
  AttnSparseSaved sv{Tensor::empty({b, s, H, in.Dv}, in.q.dtype(), dev), Tensor::empty({b, H, s}, DType::f32, dev),
                     in.K > 0 ? Tensor::empty({b, H, s}, DType::f32, dev) : Tensor()};
  fwd_into(in, p, sv);
  return sv;
}

void attn_sparse_fwd(const AttnSparseInputs& in, const AttnSparseSaved& saved) { fwd_into(in, make_params(in), saved); }

AttnSparseGrads attn_sparse_bwd(const AttnSparseInputs& in, const AttnSparseSaved& sv, const Tensor& dout,
                                const Tensor& dsink) {
  AttnSparseParams p = make_params(in);
  const int64_t b = p.b, s = p.sq, H = p.H;
  const Device dev = in.q.device();
  HMLA_CHECK(dout.defined() && dout.shape() == Shape({b, s, H, in.Dv}) && dout.is_contiguous() &&
                 dout.dtype() == in.q.dtype() && dout.device() == dev,
             ShapeError, "sparse attention: dout must be a contiguous ", dtype_name(in.q.dtype()), " ",
             shape_str({b, s, H, in.Dv}), " on q's device");
  HMLA_CHECK(sv.out.defined() && sv.out.shape() == Shape({b, s, H, in.Dv}) && sv.out.dtype() == in.q.dtype() &&
                 sv.out.device() == dev && sv.out.is_contiguous() && sv.lse.defined() &&
                 sv.lse.shape() == Shape({b, H, s}) && sv.lse.dtype() == DType::f32 && sv.lse.device() == dev &&
                 sv.lse.is_contiguous(),
             ShapeError, "sparse attention: the saved out/lse do not match the inputs (the forward's outputs)");
  AttnSparseGrads g{Tensor::empty({b, s, H, in.q.size(3)}, in.q.dtype(), dev), Tensor::empty(in.kv.shape(), in.q.dtype(), dev),
                    !in.sink.defined() ? Tensor() : dsink.defined() ? dsink : Tensor::zeros({H}, DType::f32, dev)};
  if (g.dsink.defined())
    HMLA_CHECK(g.dsink.shape() == Shape({H}) && g.dsink.dtype() == DType::f32 && g.dsink.device() == dev &&
                   g.dsink.is_contiguous(),
               ShapeError, "sparse attention: dsink must be a contiguous f32 [H] tensor on q's device");
  p.out = sv.out.raw_data();
  p.lse = sv.lse.data<float>();
  p.dout = dout.raw_data();
  p.dq = g.dq.raw_data();
  p.dkv = g.dkv.raw_data();
  p.dsink = g.dsink.defined() ? g.dsink.data<float>() : nullptr;
  dispatch(dev, Op::attn_sparse_bwd, p, "sparse attention backward", widths(p));
  return g;
}

}  // namespace hmla
