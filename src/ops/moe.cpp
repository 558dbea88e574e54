// Entry points of the MoE ops (hmla/ops/moe.h): validate dtypes, shapes, strides and the device
// once, fill the family's params, and call the backend of the tensors' device.
#include "hmla/ops/moe.h"

#include <cmath>
#include <initializer_list>
#include <string>
#include <vector>

#include "hmla/core/error.h"
#include "hmla/ops/backend.h"
#include "entry_point.h"

namespace hmla {

namespace {

using detail::desc;

void run(const char* op, Op entry, const auto& p, std::initializer_list<const Tensor*> ts) {
  detail::run(op, entry, p, ts, "these MoE tensors (bf16 is CUDA's, for the activations moe.h names)");
}

void need(const Tensor& t, DType dt, const Shape& shape, const char* op, const char* name) {
  HMLA_CHECK(t.defined() && t.dtype() == dt && t.is_contiguous() && t.shape() == shape, ShapeError, op, ": ", name,
             " must be a contiguous ", dtype_name(dt), shape_str(shape), " tensor, got ", desc(t),
             t.defined() && !t.is_contiguous() ? " (strided)" : "");
}

bool f32_or_bf16(const Tensor& t) { return t.defined() && (t.dtype() == DType::f32 || t.dtype() == DType::bf16); }

// A [rows, D] row matrix (last dimension contiguous, rows at one stride), f32 (or bf16 where
// `bf16` allows it): its row stride.
int64_t row_stride(const Tensor& t, int64_t rows, int64_t D, const char* op, const char* name, bool bf16 = false) {
  HMLA_CHECK(t.defined() && (t.dtype() == DType::f32 || (bf16 && t.dtype() == DType::bf16)) && t.dim() == 2 &&
                 t.size(0) == rows && t.size(1) == D && (D <= 1 || t.stride(1) == 1),
             ShapeError, op, ": ", name, " must be ", bf16 ? "f32 or bf16" : "f32", " [", rows, ", ", D,
             "] rows with a contiguous last dimension, got ", desc(t));
  return t.stride(0);
}

// A contiguous [rows, D] f32 or bf16 tensor.
void need_act(const Tensor& t, const Shape& shape, const char* op, const char* name) {
  HMLA_CHECK(f32_or_bf16(t) && t.is_contiguous() && t.shape() == shape, ShapeError, op, ": ", name,
             " must be a contiguous f32 or bf16 ", shape_str(shape), " tensor, got ", desc(t));
}

// Every row of idx [N, k] i32 (on the host) names k distinct experts in [0, E).
void check_expert_rows(const Tensor& idx, int64_t E, const char* op, const char* name) {
  const int64_t N = idx.size(0), k = idx.size(1);
  const int32_t* id = idx.data<int32_t>();
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < k; ++j) {
      HMLA_CHECK(id[t * k + j] >= 0 && id[t * k + j] < E, ShapeError, op, ": ", name, ": token ", t, " has expert ",
                 id[t * k + j], ", outside [0, ", E, ")");
      for (int64_t i = 0; i < j; ++i)
        HMLA_CHECK(id[t * k + i] != id[t * k + j], ShapeError, op, ": ", name, ": token ", t, " has expert ",
                   id[t * k + j], " twice");
    }
}

void check_dispatch(const MoeDispatch& d, int64_t slots, const char* op) {
  need(d.order, DType::i32, {slots}, op, "the dispatch order");
  need(d.pos, DType::i32, {slots}, op, "the dispatch positions");
}

}  // namespace

void moe_route_fwd(const Tensor& logits, const Tensor& bias, const MoeRouter& router, const MoeRouting& r,
                   const Tensor& fixed) {
  const char* op = "moe_route";
  HMLA_CHECK(logits.defined() && logits.dim() == 2, ShapeError, op, ": logits must be [N, E], got ", desc(logits));
  const int64_t N = logits.size(0), E = logits.size(1);
  need(logits, DType::f32, {N, E}, op, "logits");
  if (bias.defined()) need(bias, DType::f32, {E}, op, "the correction bias");
  HMLA_CHECK(r.idx.defined() && r.idx.dim() == 2 && r.idx.size(0) == N, ShapeError, op, ": idx must be [N = ", N,
             ", k], got ", desc(r.idx));
  const int64_t k = r.idx.size(1), G = router.n_group, TG = router.topk_group;
  need(r.idx, DType::i32, {N, k}, op, "idx");
  need(r.weight, DType::f32, {N, k}, op, "weight");
  need(r.score, DType::f32, {N, k}, op, "score");
  HMLA_CHECK(G >= 1 && E % G == 0 && (G == 1 || E / G >= 2) && TG >= 1 && TG <= G && k >= 1 && k <= TG * (E / G),
             ShapeError, op, ": E = ", E, ", n_group = ", G, ", topk_group = ", TG, ", k = ", k,
             ": groups of at least 2 experts, 1 <= topk_group <= n_group and 1 <= k <= topk_group x E / n_group");
  if (fixed.defined()) {
    need(fixed, DType::i32, {N, k}, op, "the hash routing's experts");
    if (fixed.device() == Device::cpu) check_expert_rows(fixed, E, op, "the hash routing's experts");
  }
  MoeRouteParams p;
  p.N = N, p.E = E, p.k = k, p.n_group = G, p.topk_group = TG;
  p.norm_topk_prob = router.norm_topk_prob, p.scaling = router.scaling, p.score_fn = router.score;
  p.logits = logits.data<float>(), p.bias = bias.defined() ? bias.data<float>() : nullptr;
  p.fixed = fixed.defined() ? fixed.data<int32_t>() : nullptr;
  p.idx = r.idx.data<int32_t>(), p.weight = r.weight.data<float>(), p.score = r.score.data<float>();
  run(op, Op::moe_route_fwd, p, {&logits, &bias, &fixed, &r.idx, &r.weight, &r.score});
}

void moe_route_bwd(const Tensor& dweight, const MoeRouting& r, const MoeRouter& router, const Tensor& dlogits,
                   const Tensor& logits) {
  const char* op = "moe_route backward";
  HMLA_CHECK(r.idx.defined() && r.idx.dim() == 2 && dlogits.defined() && dlogits.dim() == 2, ShapeError, op,
             ": idx [N, k] and dlogits [N, E], got ", desc(r.idx), " and ", desc(dlogits));
  const int64_t N = r.idx.size(0), k = r.idx.size(1), E = dlogits.size(1);
  need(r.idx, DType::i32, {N, k}, op, "idx");
  need(r.score, DType::f32, {N, k}, op, "score");
  need(dweight, DType::f32, {N, k}, op, "dweight");
  need(dlogits, DType::f32, {N, E}, op, "dlogits");
  if (router.score != MoeScore::sigmoid) need(logits, DType::f32, {N, E}, op, "the forward's logits");
  MoeRouteParams p;
  p.N = N, p.E = E, p.k = k, p.norm_topk_prob = router.norm_topk_prob, p.scaling = router.scaling;
  p.score_fn = router.score;
  p.logits = logits.defined() ? logits.data<float>() : nullptr;
  p.idx_in = r.idx.data<int32_t>(), p.score_in = r.score.data<float>(), p.dweight = dweight.data<float>();
  p.dlogits = dlogits.data<float>();
  run(op, Op::moe_route_bwd, p, {&dweight, &r.idx, &r.score, &dlogits, &logits});
}

MoeDispatch moe_dispatch(const Tensor& idx, int64_t E) {
  const char* op = "moe_dispatch";
  HMLA_CHECK(idx.defined() && idx.dim() == 2, ShapeError, op, ": idx must be [N, k], got ", desc(idx));
  const int64_t N = idx.size(0), k = idx.size(1);
  need(idx, DType::i32, {N, k}, op, "idx");
  HMLA_CHECK(E >= 1 && N * k < (int64_t(1) << 31), ShapeError, op, ": ", N, " x ", k,
             " slots: the dispatch numbers them in int32");
  // a device's idx is the router's own, valid by construction
  if (idx.device() == Device::cpu) check_expert_rows(idx, E, op, "idx");
  MoeDispatch d;
  d.order = Tensor::empty({N * k}, DType::i32, idx.device());
  d.pos = Tensor::empty({N * k}, DType::i32, idx.device());
  d.offsets = Tensor::empty({E + 1}, DType::i32, idx.device());
  MoeDispatchParams p;
  p.N = N, p.E = E, p.k = k, p.idx = idx.data<int32_t>();
  p.order = d.order.data<int32_t>(), p.pos = d.pos.data<int32_t>(), p.offsets = d.offsets.data<int32_t>();
  run(op, Op::moe_dispatch, p, {&idx});
  return d;
}

void moe_gather(const Tensor& src, const MoeDispatch& d, int64_t k, const Tensor& w, bool from_tokens,
                const Tensor& out) {
  const char* op = "moe_gather";
  HMLA_CHECK(out.defined() && out.dim() == 2 && k >= 1 && out.size(0) % k == 0, ShapeError, op,
             ": out must be [N * k, D] (k = ", k, "), got ", desc(out));
  const int64_t slots = out.size(0), N = slots / k, D = out.size(1);
  check_dispatch(d, slots, op);
  need(out, DType::f32, {slots, D}, op, "out");
  if (w.defined()) need(w, DType::f32, {slots}, op, "the slot weights");
  MoeRowsParams p;
  p.N = N, p.k = k, p.D = D, p.from_tokens = from_tokens;
  p.ld_src = row_stride(src, from_tokens ? N : slots, D, op, "src", true);
  p.src_dtype = src.dtype();
  p.src = src.raw_data(), p.order = d.order.data<int32_t>(), p.w = w.defined() ? w.data<float>() : nullptr;
  p.out = out.data<float>(), p.ld_out = D;
  run(op, Op::moe_gather, p, {&src, &d.order, &w, &out});
}

void moe_combine(const Tensor& src, const MoeDispatch& d, int64_t k, const Tensor& w, bool accumulate,
                 const Tensor& out) {
  const char* op = "moe_combine";
  HMLA_CHECK(out.defined() && out.dim() == 2 && k >= 1, ShapeError, op, ": out must be [N, D], got ", desc(out));
  const int64_t N = out.size(0), D = out.size(1), slots = N * k;
  check_dispatch(d, slots, op);
  need(src, DType::f32, {slots, D}, op, "src");
  if (w.defined()) need(w, DType::f32, {slots}, op, "the slot weights");
  MoeRowsParams p;
  p.N = N, p.k = k, p.D = D, p.accumulate = accumulate;
  p.src = src.data<float>(), p.ld_src = D, p.pos = d.pos.data<int32_t>();
  p.w = w.defined() ? w.data<float>() : nullptr;
  p.ld_out = row_stride(out, N, D, op, "out");
  p.out = out.data<float>();
  run(op, Op::moe_combine, p, {&src, &d.pos, &w, &out});
}

void moe_rowdot(const Tensor& a, const Tensor& b, const MoeDispatch& d, int64_t k, const Tensor& out) {
  const char* op = "moe_rowdot";
  HMLA_CHECK(a.defined() && a.dim() == 2 && k >= 1 && a.size(0) % k == 0, ShapeError, op,
             ": a must be [N * k, D], got ", desc(a));
  const int64_t slots = a.size(0), D = a.size(1);
  check_dispatch(d, slots, op);
  need_act(a, {slots, D}, op, "a");
  need_act(b, {slots, D}, op, "b");
  need(out, DType::f32, {slots}, op, "out");
  MoeRowsParams p;
  p.N = slots / k, p.k = k, p.D = D, p.a_dtype = a.dtype(), p.b_dtype = b.dtype();
  p.a = a.raw_data(), p.b = b.raw_data(), p.order = d.order.data<int32_t>(), p.out = out.data<float>();
  run(op, Op::moe_rowdot, p, {&a, &b, &d.order, &out});
}

void moe_expert_load(const Tensor& idx, const Tensor& mask, int64_t rows, bool accumulate, const Tensor& load) {
  const char* op = "moe_expert_load";
  HMLA_CHECK(idx.defined() && idx.dim() == 2 && load.defined() && load.dim() == 2, ShapeError, op,
             ": idx [N, k] and load [rows, E], got ", desc(idx), " and ", desc(load));
  const int64_t N = idx.size(0), k = idx.size(1), E = load.size(1);
  HMLA_CHECK(rows >= 1 && N % rows == 0, ShapeError, op, ": ", rows, " segments do not divide N = ", N, " tokens");
  need(idx, DType::i32, {N, k}, op, "idx");
  need(load, DType::f64, {rows, E}, op, "load");
  if (mask.defined()) need(mask, DType::f32, {N}, op, "the token mask");
  MoeBalanceParams p;
  p.N = N, p.E = E, p.k = k, p.rows = rows, p.accumulate = accumulate;
  p.idx = idx.data<int32_t>(), p.mask = mask.defined() ? mask.data<float>() : nullptr, p.load = load.data<double>();
  run(op, Op::moe_expert_load, p, {&idx, &mask, &load});
}

void moe_bias_update(const Tensor& bias, const Tensor& load, float rate) {
  const char* op = "moe_bias_update";
  HMLA_CHECK(bias.defined() && bias.dim() == 1, ShapeError, op, ": bias must be [E], got ", desc(bias));
  const int64_t E = bias.size(0);
  need(bias, DType::f32, {E}, op, "the correction bias");
  need(load, DType::f64, {E}, op, "load");
  HMLA_CHECK(std::isfinite(rate) && rate >= 0, ConfigError, op, ": rate = ", rate, ": it must be finite and >= 0");
  MoeBalanceParams p;
  p.E = E, p.rate = rate, p.bias = bias.data<float>(), p.load_in = load.data<double>();
  run(op, Op::moe_bias_update, p, {&bias, &load});
}

void moe_aux_loss(const Tensor& logits, const Tensor& counts, const Tensor& mask, int64_t k, double scale,
                  const Tensor& dlogits, const Tensor& loss) {
  const char* op = "moe_aux_loss";
  HMLA_CHECK(logits.defined() && logits.dim() == 2 && counts.defined() && counts.dim() == 2, ShapeError, op,
             ": logits [N, E] and counts [rows, E], got ", desc(logits), " and ", desc(counts));
  const int64_t N = logits.size(0), E = logits.size(1), rows = counts.size(0);
  HMLA_CHECK(rows >= 1 && N % rows == 0, ShapeError, op, ": ", rows, " segments do not divide N = ", N, " tokens");
  need(logits, DType::f32, {N, E}, op, "logits");
  need(counts, DType::f64, {rows, E}, op, "counts");
  need(mask, DType::f32, {N}, op, "the token mask");
  HMLA_CHECK(k >= 1 && std::isfinite(scale), ShapeError, op, ": k = ", k, ", scale = ", scale,
             ": k must be >= 1 and scale finite");
  need(dlogits, DType::f32, {N, E}, op, "dlogits");
  need(loss, DType::f64, {1}, op, "loss");
  MoeBalanceParams p;
  p.N = N, p.E = E, p.k = k, p.rows = rows, p.scale = scale;
  p.logits = logits.data<float>(), p.counts = counts.data<double>(), p.mask = mask.data<float>();
  p.dlogits = dlogits.data<float>(), p.loss = loss.data<double>();
  run(op, Op::moe_aux_loss, p, {&logits, &counts, &mask, &dlogits, &loss});
}

namespace {

// The experts' weights: E tensors [out, in], contiguous, of one dtype (f32 or bf16); their
// pointers as the params' host table.
std::vector<const void*> expert_table(const std::vector<Tensor>& W, int64_t E, const char* op, int64_t& out,
                                      int64_t& in, DType& dt) {
  HMLA_CHECK(int64_t(W.size()) == E && E >= 1 && W[0].defined() && W[0].dim() == 2, ShapeError, op, ": ", E,
             " expert weights [out, in] wanted (the dispatch's offsets), got ", W.size(), " starting ",
             W.empty() ? "nowhere" : desc(W[0]));
  out = W[0].size(0), in = W[0].size(1), dt = W[0].dtype();
  std::vector<const void*> table(size_t(E), nullptr);
  const Shape shape{out, in};
  for (int64_t e = 0; e < E; ++e) {
    HMLA_CHECK(f32_or_bf16(W[e]) && W[e].dtype() == dt && W[e].is_contiguous() && W[e].shape() == shape,
               ShapeError, op, ": expert ", e, "'s weight must be a contiguous ", dtype_name(dt), shape_str(shape),
               " tensor like expert 0's, got ", desc(W[e]));
    table[size_t(e)] = W[e].raw_data();
  }
  return table;
}

// A [rows, D] row matrix of the products (f32 or bf16): its row stride.
int64_t product_rows(const Tensor& t, int64_t rows, int64_t D, const char* op, const char* name) {
  return row_stride(t, rows, D, op, name, true);
}

void check_offsets(const MoeDispatch& d, int64_t E, const char* op) {
  need(d.offsets, DType::i32, {E + 1}, op, "the dispatch offsets");
}

}  // namespace

void moe_grouped_fwd(const Tensor& x, const std::vector<Tensor>& W, const MoeDispatch& d, const Tensor& y) {
  const char* op = "moe_grouped";
  MoeGroupedParams p;
  p.E = int64_t(W.size());
  DType wt = DType::f32;
  const std::vector<const void*> table = expert_table(W, p.E, op, p.out, p.in, wt);
  check_offsets(d, p.E, op);
  HMLA_CHECK(x.defined() && x.dim() == 2, ShapeError, op, ": x must be [rows, in], got ", desc(x));
  p.rows = x.size(0);
  p.ld_x = product_rows(x, p.rows, p.in, op, "x");
  p.ld_y = product_rows(y, p.rows, p.out, op, "y");
  p.x_dtype = x.dtype(), p.w_dtype = wt, p.y_dtype = y.dtype();
  p.offsets = d.offsets.data<int32_t>(), p.W = table.data(), p.x = x.raw_data(), p.y = y.raw_data();
  run(op, Op::moe_grouped_fwd, p, {&x, &W[0], &d.offsets, &y});
}

void moe_grouped_bwd(const Tensor& dy, const Tensor& x, const std::vector<Tensor>& W, const std::vector<Tensor>& dW,
                     const MoeDispatch& d, const Tensor& dx, float dx_beta) {
  const char* op = "moe_grouped backward";
  MoeGroupedParams p;
  p.E = int64_t(W.size());
  DType wt = DType::f32;
  const std::vector<const void*> table = expert_table(W, p.E, op, p.out, p.in, wt);
  HMLA_CHECK(dW.size() == W.size(), ShapeError, op, ": ", W.size(), " expert weights but ", dW.size(), " gradients");
  std::vector<float*> grads(W.size(), nullptr);
  for (size_t e = 0; e < dW.size(); ++e) {
    need(dW[e], DType::f32, {p.out, p.in}, op, "an expert's weight gradient");  // added into: f32
    grads[e] = dW[e].data<float>();
  }
  check_offsets(d, p.E, op);
  HMLA_CHECK(x.defined() && x.dim() == 2, ShapeError, op, ": x must be [rows, in], got ", desc(x));
  HMLA_CHECK(dx_beta == 0.f || dx_beta == 1.f, ShapeError, op, ": dx_beta = ", dx_beta, ": it must be 0 or 1");
  p.rows = x.size(0);
  p.ld_x = product_rows(x, p.rows, p.in, op, "x");
  p.ld_y = product_rows(dy, p.rows, p.out, op, "dy");
  p.x_dtype = x.dtype(), p.w_dtype = wt, p.y_dtype = dy.dtype();
  if (dx.defined()) {
    p.ld_dx = product_rows(dx, p.rows, p.in, op, "dx");
    p.dx_dtype = dx.dtype(), p.dx = dx.raw_data(), p.dx_beta = dx_beta;
  }
  p.offsets = d.offsets.data<int32_t>(), p.W = table.data(), p.dW = grads.data();
  p.x = x.raw_data(), p.y = dy.raw_data();
  run(op, Op::moe_grouped_bwd, p, {&dy, &x, &W[0], &dW[0], &d.offsets, &dx});
}

}  // namespace hmla
