// Entry points of the dense ops (hmla/ops/nn.h): validate shapes, strides and devices once, fill
// the family's params struct, and call the backend of the tensors' device (the optimizer steps':
// optim.cpp).
#include "hmla/ops/nn.h"

#include <initializer_list>
#include <string>

#include "hmla/core/error.h"
#include "hmla/ops/backend.h"
#include "nn_common.h"

namespace hmla {

namespace {

using detail::check_contiguous;
using detail::check_dtype;
using detail::check_layout;
using detail::check_scalar;
using detail::desc;
using detail::run;
using detail::scalar_holding;

// An activation operand of the element and row ops: f32, or bf16 (the CUDA kernels read it exactly
// and round a bf16 output once; the CPU backend's supports() refuses it).
constexpr const char* kActDtypes = "f32 or bf16";
void check_act(const Tensor& t, const char* op, const char* name) {
  HMLA_CHECK(t.defined() && (t.dtype() == DType::f32 || t.dtype() == DType::bf16), ShapeError, op, ": ", name,
             " must be ", kActDtypes, ", got ", desc(t));
}

void check_act_contiguous(const Tensor& t, const Shape& want, const char* op, const char* name) {
  check_act(t, op, name);
  check_layout(t, kActDtypes, want, op, name);
}

// A tensor [..., D] read as N rows of width D with row stride ld.
struct Rows {
  void* p;
  int64_t N, D, ld;
};

// The row layout of a tensor whose dtype was checked.
Rows rows_of(const Tensor& t, const char* op, const char* name) {
  HMLA_CHECK(t.dim() >= 1, ShapeError, op, ": ", name, " must have at least one dimension");
  const int64_t n = t.dim(), D = t.size(-1);
  HMLA_CHECK(D <= 1 || t.stride(-1) == 1, ShapeError, op, ": the last dimension of ", name, " must be contiguous");
  const int64_t ld = n >= 2 ? t.stride(-2) : D;
  for (int64_t d = 0; d + 2 < n; ++d)
    HMLA_CHECK(t.size(d) <= 1 || t.stride(d) == t.stride(d + 1) * t.size(d + 1), ShapeError, op, ": the rows of ",
               name, " ", shape_str(t.shape()), " are not at one stride");
  return {t.raw_data(), D == 0 ? 0 : t.numel() / D, D, ld};
}

Rows rows(const Tensor& t, DType dt, const char* op, const char* name) {
  check_dtype(t, dt, op, name);
  return rows_of(t, op, name);
}

// An activation's rows: f32 or bf16 (check_act).
Rows act_rows(const Tensor& t, const char* op, const char* name) {
  check_act(t, op, name);
  return rows_of(t, op, name);
}

float* f(const Rows& r) { return static_cast<float*>(r.p); }

void same_rows(const Rows& a, const Rows& b, const char* op, const char* an, const char* bn) {
  HMLA_CHECK(a.N == b.N && a.D == b.D, ShapeError, op, ": ", an, " [", a.N, ", ", a.D, "] and ", bn, " [", b.N, ", ",
             b.D, "] must have the same rows");
}

// A product's operand: f32 or bf16, each its own (nn.h: GemmParams).
DType gemm_dtype(const Tensor& t, const char* op, const char* name) {
  HMLA_CHECK(t.defined() && (t.dtype() == DType::f32 || t.dtype() == DType::bf16), ShapeError, op, ": ", name,
             " must be f32 or bf16, got ", desc(t));
  return t.dtype();
}

void check_matrix(const Tensor& t, const char* name) {
  HMLA_CHECK(t.defined() && (t.dim() == 2 || t.dim() == 3) && (t.size(-1) <= 1 || t.stride(-1) == 1), ShapeError,
             "matmul: ", name, " must be 2-D or 3-D with its last dimension contiguous, got ", desc(t));
}

}  // namespace

void matmul(const Tensor& a, Trans ta, const Tensor& b, Trans tb, const Tensor& c, float alpha, float beta) {
  check_matrix(a, "a");
  check_matrix(b, "b");
  check_matrix(c, "c");
  HMLA_CHECK(a.dim() == c.dim() && b.dim() == c.dim(), ShapeError, "matmul: a ", desc(a), ", b ", desc(b),
             " and c ", desc(c), " must have one rank");
  const bool batched = c.dim() == 3;
  GemmParams p;
  p.a_dtype = gemm_dtype(a, "matmul", "a");
  p.b_dtype = gemm_dtype(b, "matmul", "b");
  p.c_dtype = gemm_dtype(c, "matmul", "c");
  p.ta = ta;
  p.tb = tb;
  p.batch = batched ? c.size(0) : 1;
  p.M = c.size(-2);
  p.N = c.size(-1);
  p.K = ta == Trans::no ? a.size(-1) : a.size(-2);
  const int64_t am = ta == Trans::no ? a.size(-2) : a.size(-1);
  const int64_t bk = tb == Trans::no ? b.size(-2) : b.size(-1), bn = tb == Trans::no ? b.size(-1) : b.size(-2);
  HMLA_CHECK(am == p.M && bk == p.K && bn == p.N && (!batched || (a.size(0) == p.batch && b.size(0) == p.batch)),
             ShapeError, "matmul: op(a) ", desc(a), " op(b) ", desc(b), " does not give c ", desc(c));
  p.alpha = alpha;
  p.beta = beta;
  p.a = a.raw_data();
  p.lda = a.stride(-2);
  p.a_batch = batched ? a.stride(0) : 0;
  p.b = b.raw_data();
  p.ldb = b.stride(-2);
  p.b_batch = batched ? b.stride(0) : 0;
  p.c = c.raw_data();
  p.ldc = c.stride(-2);
  p.c_batch = batched ? c.stride(0) : 0;
  run("matmul", Op::gemm, p, {&a, &b, &c});
}

void linear_fwd(const Tensor& x, const Tensor& W, const Tensor& y) {
  HMLA_CHECK(W.defined() && W.dim() == 2, ShapeError, "linear: W must be [out, in], got ", desc(W));
  const int64_t out = W.size(0), in = W.size(1);
  GemmParams p;
  p.a_dtype = gemm_dtype(x, "linear", "x");
  p.b_dtype = gemm_dtype(W, "linear", "W");
  p.c_dtype = gemm_dtype(y, "linear", "y");
  const Rows X = rows(x, p.a_dtype, "linear", "x"), Y = rows(y, p.c_dtype, "linear", "y");
  check_contiguous(W, p.b_dtype, {out, in}, "linear", "W");
  HMLA_CHECK(X.D == in && Y.D == out && X.N == Y.N, ShapeError, "linear: x ", desc(x), " and y ", desc(y),
             " do not fit W ", desc(W));
  p.ta = Trans::no;
  p.tb = Trans::yes;
  p.M = X.N, p.N = out, p.K = in;
  p.a = X.p, p.lda = X.ld;
  p.b = W.raw_data(), p.ldb = in;
  p.c = Y.p, p.ldc = Y.ld;
  run("linear", Op::gemm, p, {&x, &W, &y});
}

void linear_bwd(const Tensor& dy, const Tensor& x, const Tensor& W, const Tensor& dW, const Tensor& dx,
                float dx_beta) {
  HMLA_CHECK(W.defined() && W.dim() == 2, ShapeError, "linear backward: W must be [out, in], got ", desc(W));
  const int64_t out = W.size(0), in = W.size(1);
  const char* op = "linear backward";
  const DType dy_t = gemm_dtype(dy, op, "dy"), x_t = gemm_dtype(x, op, "x"), W_t = gemm_dtype(W, op, "W");
  const Rows DY = rows(dy, dy_t, op, "dy"), X = rows(x, x_t, op, "x");
  check_contiguous(W, W_t, {out, in}, op, "W");
  check_contiguous(dW, DType::f32, {out, in}, op, "dW");  // added into: a bf16 sum would round every step
  HMLA_CHECK(DY.D == out && X.D == in && DY.N == X.N, ShapeError, "linear backward: dy ", desc(dy), " and x ", desc(x),
             " do not fit W ", desc(W));
  GemmParams p;  // dW += dy^T x
  p.a_dtype = dy_t, p.b_dtype = x_t, p.c_dtype = DType::f32;
  p.ta = Trans::yes;
  p.tb = Trans::no;
  p.beta = 1.f;
  p.M = out, p.N = in, p.K = X.N;
  p.a = DY.p, p.lda = DY.ld;
  p.b = X.p, p.ldb = X.ld;
  p.c = dW.raw_data(), p.ldc = in;
  run(op, Op::gemm, p, {&dy, &x, &W, &dW, &dx});
  if (!dx.defined()) return;
  const Rows DX = rows(dx, gemm_dtype(dx, op, "dx"), op, "dx");
  same_rows(DX, X, op, "dx", "x");
  GemmParams q;  // dx = dy W (+ dx)
  q.a_dtype = dy_t, q.b_dtype = W_t, q.c_dtype = dx.dtype();
  q.M = X.N, q.N = in, q.K = out;
  q.beta = dx_beta;
  q.a = DY.p, q.lda = DY.ld;
  q.b = W.raw_data(), q.ldb = in;
  q.c = DX.p, q.ldc = DX.ld;
  run(op, Op::gemm, q, {&dy, &x, &W, &dW, &dx});
}

void rmsnorm_fwd(const Tensor& x, const Tensor& w, float eps, const Tensor& y, const Tensor& rstd) {
  const Rows X = act_rows(x, "rmsnorm", "x"), Y = act_rows(y, "rmsnorm", "y");
  same_rows(X, Y, "rmsnorm", "x", "y");
  check_contiguous(w, DType::f32, {X.D}, "rmsnorm", "w");
  check_contiguous(rstd, DType::f32, {X.N}, "rmsnorm", "rstd");
  NormParams p;
  p.N = X.N, p.D = X.D, p.eps = eps;
  p.x_dtype = x.dtype(), p.x = X.p, p.ldx = X.ld, p.w = w.data<float>();
  p.y_dtype = y.dtype(), p.y = Y.p, p.ldy = Y.ld, p.rstd = rstd.data<float>();
  run("rmsnorm", Op::rmsnorm_fwd, p, {&x, &w, &y, &rstd});
}

void add_rmsnorm_fwd(const Tensor& x, const Tensor& x2, const Tensor& w, float eps, const Tensor& xs, const Tensor& y,
                     const Tensor& rstd) {
  const char* op = "add_rmsnorm";
  const Rows X = rows(x, DType::f32, op, "x"), X2 = act_rows(x2, op, "x2"), XS = rows(xs, DType::f32, op, "xs"),
             Y = act_rows(y, op, "y");
  same_rows(X, X2, op, "x", "x2");
  same_rows(X, XS, op, "x", "xs");
  same_rows(X, Y, op, "x", "y");
  check_contiguous(w, DType::f32, {X.D}, op, "w");
  check_contiguous(rstd, DType::f32, {X.N}, op, "rstd");
  NormParams p;
  p.N = X.N, p.D = X.D, p.eps = eps;
  p.x = X.p, p.ldx = X.ld, p.x2_dtype = x2.dtype(), p.x2 = X2.p, p.ldx2 = X2.ld, p.xs = f(XS), p.ldxs = XS.ld;
  p.w = w.data<float>();
  p.y_dtype = y.dtype(), p.y = Y.p, p.ldy = Y.ld, p.rstd = rstd.data<float>();
  run(op, Op::add_rmsnorm_fwd, p, {&x, &x2, &w, &xs, &y, &rstd});
}

void rmsnorm_bwd(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dx,
                 const Tensor& dw) {
  const char* op = "rmsnorm backward";
  const Rows DY = rows(dy, DType::f32, op, "dy"), X = act_rows(x, op, "x"), DX = rows(dx, DType::f32, op, "dx");
  same_rows(DY, X, op, "dy", "x");
  same_rows(DX, X, op, "dx", "x");
  check_contiguous(w, DType::f32, {X.D}, op, "w");
  check_contiguous(dw, DType::f32, {X.D}, op, "dw");
  check_contiguous(rstd, DType::f32, {X.N}, op, "rstd");
  NormParams p;
  p.N = X.N, p.D = X.D;
  p.x_dtype = x.dtype(), p.x = X.p, p.ldx = X.ld, p.w = w.data<float>(), p.rstd = rstd.data<float>();
  p.dy = f(DY), p.lddy = DY.ld, p.dx = f(DX), p.lddx = DX.ld, p.dw = dw.data<float>();
  run(op, Op::rmsnorm_bwd, p, {&dy, &x, &w, &rstd, &dx, &dw});
}

void layernorm_fwd(const Tensor& x, const Tensor& w, const Tensor& b, float eps, const Tensor& y, const Tensor& mean,
                   const Tensor& rstd) {
  const char* op = "layernorm";
  const Rows X = act_rows(x, op, "x");
  check_act_contiguous(x, x.shape(), op, "x");
  check_act_contiguous(y, x.shape(), op, "y");
  for (auto [t, name] : {std::pair{&w, "w"}, std::pair{&b, "b"}}) check_contiguous(*t, DType::f32, {X.D}, op, name);
  for (auto [t, name] : {std::pair{&mean, "mean"}, std::pair{&rstd, "rstd"}})
    check_contiguous(*t, DType::f32, {X.N}, op, name);
  NormParams p;
  p.N = X.N, p.D = X.D, p.eps = eps;
  p.x_dtype = x.dtype(), p.x = X.p, p.ldx = X.D, p.w = w.data<float>(), p.bias = b.data<float>();
  p.y_dtype = y.dtype(), p.y = y.raw_data(), p.ldy = X.D, p.mean = mean.data<float>(), p.rstd = rstd.data<float>();
  run(op, Op::layernorm_fwd, p, {&x, &w, &b, &y, &mean, &rstd});
}

void layernorm_bwd(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                   const Tensor& dx, const Tensor& dw, const Tensor& db) {
  const char* op = "layernorm backward";
  const Rows X = act_rows(x, op, "x");
  check_act_contiguous(x, x.shape(), op, "x");
  for (auto [t, name] : {std::pair{&dy, "dy"}, std::pair{&dx, "dx"}})
    check_contiguous(*t, DType::f32, x.shape(), op, name);
  for (auto [t, name] : {std::pair{&w, "w"}, std::pair{&dw, "dw"}, std::pair{&db, "db"}})
    check_contiguous(*t, DType::f32, {X.D}, op, name);
  for (auto [t, name] : {std::pair{&mean, "mean"}, std::pair{&rstd, "rstd"}})
    check_contiguous(*t, DType::f32, {X.N}, op, name);
  NormParams p;
  p.N = X.N, p.D = X.D;
  p.x_dtype = x.dtype(), p.x = X.p, p.ldx = X.D, p.w = w.data<float>(), p.mean = mean.data<float>();
  p.rstd = rstd.data<float>();
  p.dy = dy.data<float>(), p.lddy = X.D, p.dx = dx.data<float>(), p.lddx = X.D;
  p.dw = dw.data<float>(), p.db = db.data<float>();
  run(op, Op::layernorm_bwd, p, {&dy, &x, &w, &mean, &rstd, &dx, &dw, &db});
}

void rope(const Tensor& x, const Tensor& cos, const Tensor& sin, RopeLayout layout, bool transpose) {
  check_act(x, "rope", "x");
  HMLA_CHECK(x.dim() == 4 && x.stride(3) == 1 && x.size(3) % 2 == 0 &&
                 (x.size(0) <= 1 || x.stride(0) == x.size(1) * x.stride(1)),
             ShapeError, "rope: x must be a [b, s, heads, Dr] view with Dr even and contiguous and rows at one "
             "stride, got ", desc(x));
  RopeParams p;
  p.layout = layout;
  p.x_dtype = x.dtype(), p.x = x.raw_data();
  p.N = x.size(0) * x.size(1), p.s = x.size(1), p.heads = x.size(2), p.Dr = x.size(3);
  p.ld = x.stride(1), p.hstride = x.stride(2);
  check_contiguous(cos, DType::f32, {p.s, p.Dr / 2}, "rope", "cos");
  check_contiguous(sin, DType::f32, {p.s, p.Dr / 2}, "rope", "sin");
  p.cos = cos.data<float>(), p.sin = sin.data<float>();
  p.transpose = transpose;
  run("rope", Op::rope, p, {&x, &cos, &sin});
}

void swiglu_fwd(const Tensor& g, const Tensor& u, const Tensor& y, float limit) {
  HMLA_CHECK(limit >= 0.f, ShapeError, "swiglu: limit = ", limit, ": use 0 (no clamp) or a positive limit");
  check_act_contiguous(g, g.shape(), "swiglu", "g");
  for (auto [t, name] : {std::pair{&u, "u"}, std::pair{&y, "y"}})
    check_contiguous(*t, g.dtype(), g.shape(), "swiglu", name);  // the activations' one dtype
  SwigluParams p;
  p.n = g.numel(), p.dtype = g.dtype(), p.limit = limit, p.g = g.raw_data(), p.u = u.raw_data(), p.y = y.raw_data();
  run("swiglu", Op::swiglu_fwd, p, {&g, &u, &y});
}

void swiglu_bwd(const Tensor& dy, const Tensor& g, const Tensor& u, const Tensor& dg, const Tensor& du, float limit) {
  HMLA_CHECK(limit >= 0.f, ShapeError, "swiglu backward: limit = ", limit, ": use 0 (no clamp) or a positive limit");
  check_act_contiguous(g, g.shape(), "swiglu backward", "g");
  check_contiguous(u, g.dtype(), g.shape(), "swiglu backward", "u");
  for (auto [t, name] : {std::pair{&dy, "dy"}, std::pair{&dg, "dg"}, std::pair{&du, "du"}})
    check_contiguous(*t, DType::f32, g.shape(), "swiglu backward", name);
  SwigluParams p;
  p.n = g.numel(), p.dtype = g.dtype(), p.limit = limit, p.g = g.raw_data(), p.u = u.raw_data();
  p.dy = dy.data<float>(), p.dg = dg.data<float>(), p.du = du.data<float>();
  run("swiglu backward", Op::swiglu_bwd, p, {&dy, &g, &u, &dg, &du});
}

namespace {
EmbeddingParams embedding_params(const Tensor& ids, const Tensor& E, const Tensor& rows_t, const char* op,
                                 const char* rows_name) {
  check_contiguous(ids, DType::i32, ids.shape(), op, "ids");
  HMLA_CHECK(E.defined() && E.dim() == 2, ShapeError, op, ": the table must be [V, D], got ", desc(E));
  EmbeddingParams p;
  p.N = ids.numel(), p.V = E.size(0), p.D = E.size(1);
  check_contiguous(E, DType::f32, {p.V, p.D}, op, "the table");
  HMLA_CHECK(rows_t.defined() && rows_t.is_contiguous() && rows_t.dtype() == DType::f32 &&
                 rows_t.numel() == p.N * p.D && rows_t.size(-1) == p.D,
             ShapeError, op, ": ", rows_name, " must be a contiguous f32 tensor of ", p.N, " rows of ", p.D,
             ", got ", desc(rows_t));
  // Host ids are checked before any kernel reads a row. A device's ids are not copied back to be
  // checked: they were checked where they entered (the model's device batch, the CLI), and the
  // device kernels read no row outside the table whatever the ids (a bad id's row is NaN).
  if (ids.device() == Device::cpu) {
    const int32_t* id = ids.data<int32_t>();
    for (int64_t n = 0; n < p.N; ++n)
      HMLA_CHECK(id[n] >= 0 && id[n] < p.V, ShapeError, "token id ", id[n], " at position ", n,
                 " is outside the vocabulary [0, ", p.V, ")");
  }
  p.ids = ids.data<int32_t>();
  return p;
}
}  // namespace

void embedding_fwd(const Tensor& ids, const Tensor& E, const Tensor& out) {
  EmbeddingParams p = embedding_params(ids, E, out, "embedding", "out");
  p.E = E.data<float>(), p.out = out.data<float>();
  run("embedding", Op::embedding_fwd, p, {&ids, &E, &out});
}

void embedding_bwd(const Tensor& ids, const Tensor& dout, const Tensor& dE) {
  EmbeddingParams p = embedding_params(ids, dE, dout, "embedding backward", "dout");
  p.dout = dout.data<float>(), p.dE = dE.data<float>();
  run("embedding backward", Op::embedding_bwd, p, {&ids, &dout, &dE});
}

void cross_entropy_into(const Tensor& logits, const Tensor& target, const Tensor& w, const Tensor& dlogits,
                        const Tensor& acc) {
  HMLA_CHECK(logits.defined() && logits.dim() == 2, ShapeError, "cross_entropy: logits must be [N, V], got ",
             desc(logits));
  CrossEntropyParams p;
  p.N = logits.size(0), p.V = logits.size(1);
  check_contiguous(logits, DType::f32, {p.N, p.V}, "cross_entropy", "logits");
  check_contiguous(target, DType::i32, {p.N}, "cross_entropy", "target");
  check_contiguous(w, DType::f32, {p.N}, "cross_entropy", "w");
  if (dlogits.defined()) check_contiguous(dlogits, DType::f32, {p.N, p.V}, "cross_entropy", "dlogits");
  check_scalar(acc, "cross_entropy");
  if (target.device() == Device::cpu) {  // a device's targets: as embedding's ids (a bad row's loss is NaN)
    for (int64_t n = 0; n < p.N; ++n) {
      const int32_t t = target.data<int32_t>()[n];
      HMLA_CHECK(w.data<float>()[n] == 0.f || (t >= 0 && t < p.V), ShapeError, "cross_entropy: target ", t,
                 " of row ", n, " is outside the vocabulary [0, ", p.V, ")");
    }
  }
  p.logits = logits.data<float>(), p.target = target.data<int32_t>(), p.w = w.data<float>();
  p.dlogits = dlogits.defined() ? dlogits.data<float>() : nullptr;
  p.acc = acc.data<double>();
  run("cross_entropy", Op::cross_entropy, p, {&logits, &target, &w, &dlogits, &acc});
}

double cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& w, const Tensor& dlogits,
                     double init) {
  HMLA_CHECK(logits.defined(), ShapeError, "cross_entropy: logits must be [N, V], got undefined");
  const Tensor acc = scalar_holding(init, logits.device());
  cross_entropy_into(logits, target, w, dlogits, acc);
  return acc.to_vector<double>()[0];
}

void axpy(const Tensor& a, float alpha, const Tensor& b, const Tensor& out) {
  const Rows A = rows(a, DType::f32, "axpy", "a"), O = rows(out, DType::f32, "axpy", "out");
  same_rows(A, O, "axpy", "a", "out");
  AxpyParams p;
  p.N = A.N, p.D = A.D, p.alpha = alpha;
  p.a = f(A), p.lda = A.ld, p.out = f(O), p.ldout = O.ld;
  if (b.defined()) {
    const Rows B = rows(b, DType::f32, "axpy", "b");
    same_rows(A, B, "axpy", "a", "b");
    p.b = f(B), p.ldb = B.ld;
  }
  run("axpy", Op::axpy, p, {&a, &b, &out});
}

void add(const Tensor& a, const Tensor& b, const Tensor& out) { axpy(a, 1.f, b, out); }

void scale(const Tensor& a, float alpha, const Tensor& out) { axpy(a, alpha, Tensor(), out); }

void convert(const Tensor& src, const Tensor& dst) {
  HMLA_CHECK(src.defined() && dst.defined() && src.shape() == dst.shape(), ShapeError, "convert: ", desc(src),
             " into ", desc(dst), ": the shapes differ");
  ConvertParams p;
  p.src_dtype = src.dtype(), p.dst_dtype = dst.dtype();
  for (int64_t d = 0; d < src.dim(); ++d) {
    if (src.size(d) == 1) continue;
    HMLA_CHECK(p.dims < 4, ShapeError, "convert: ", desc(src), " has more than four dimensions of size > 1");
    p.shape[p.dims] = src.size(d), p.src_stride[p.dims] = src.stride(d), p.dst_stride[p.dims] = dst.stride(d);
    ++p.dims;
  }
  p.src = src.raw_data(), p.dst = dst.raw_data();
  if (src.numel() == 0) return;
  run("convert", Op::convert, p, {&src, &dst});
}

Tensor converted(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype && t.is_contiguous()) return t;
  Tensor out = Tensor::empty(t.shape(), dtype, t.device());
  convert(t, out);
  return out;
}

Tensor compute_operand(const Tensor& t) {
  const DType dt = compute_dtype(t.device());
  return t.dtype() == dt ? t : converted(t, dt);
}

}  // namespace hmla
