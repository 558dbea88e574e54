// The two MLPs (mlp.h). Dense SwiGLU: y = down(silu(gate(x)) * up(x)); it keeps g = gate(x),
// u = up(x) and act = silu(g) * u [N, intermediate_size]. DeepSeekMoE (docs/moe.md): the router
// (u = x W_gate^T in f32, group-limited top-k of sigmoid scores + bias), the N x k (token, choice)
// slots grouped by expert (moe_dispatch), one SwiGLU per expert over its rows, the weighted
// combine in slot order, plus the shared experts' SwiGLU. Dropless: every slot is computed. Under
// expert parallelism (Mlp::ep) the routed experts' rows travel to their owners and back
// (ep_forward / ep_backward; docs/scale_out.md "Expert parallel"); the kept g, u, act fields are
// then unused (the owner recomputes them in the backward).
#include "hmla/model/mlp.h"

#include "hmla/dist/ep.h"
#include "hmla/ops/moe.h"
#include "hmla/ops/nn.h"

namespace hmla {

namespace {

Tensor f32_tmp(const Shape& sh, Device dev) { return Tensor::empty(sh, DType::f32, dev); }

// [n, 1] ones on dev.
Tensor ones_column(int64_t n, Device dev) {
  return Tensor::from_vector<float>({n, 1}, std::vector<float>(size_t(n), 1.f)).to(dev);
}

// Expert parallelism's rows at an owner: the exchange's plan for a layer's dispatch d (its
// per-expert counts read on the host: an all-to-all's sizes must be), and the owner's received
// rows as a dispatch of their own (its experts' rows in order, k = 1: order and pos the identity).
struct EpRows {
  EpPlan plan;
  MoeDispatch local;
  int64_t rows = 0;
};

EpRows ep_rows(Comm& ep, const MoeDispatch& d, Device dev) {
  const std::vector<int32_t> off = d.offsets.to_vector<int32_t>();
  std::vector<int64_t> counts(off.size() - 1);
  for (size_t e = 0; e + 1 < off.size(); ++e) counts[e] = off[e + 1] - off[e];
  EpRows r;
  r.plan = ep_plan(ep, counts);
  r.rows = r.plan.rows_received();
  std::vector<int32_t> iota(size_t(r.rows)), bounds{0};
  for (int64_t i = 0; i < r.rows; ++i) iota[size_t(i)] = int32_t(i);
  for (int64_t n : r.plan.local_expert_rows()) bounds.push_back(bounds.back() + int32_t(n));
  r.local.order = Tensor::from_vector<int32_t>({r.rows}, iota).to(dev);
  r.local.pos = r.local.order;
  r.local.offsets = Tensor::from_vector<int32_t>({int64_t(bounds.size())}, bounds).to(dev);
  return r;
}

// One SwiGLU MLP on rows x [n, hidden]: g, u, act [n, I] saved, y [n, hidden] written.
void swiglu_mlp_fwd(const SwigluTensors& w, const Tensor& x, const Tensor& g, const Tensor& u, const Tensor& act,
                    const Tensor& y, float limit = 0.f) {
  linear_fwd(x, w.gate_proj, g);
  linear_fwd(x, w.up_proj, u);
  swiglu_fwd(g, u, act, limit);
  linear_fwd(act, w.down_proj, y);
}

// Its backward: the weights' gradients added into gw, dx = the gradient reaching x (+ dx when
// dx_beta is 1).
void swiglu_mlp_bwd(const SwigluTensors& w, const SwigluTensors& gw, const Tensor& dy, const Tensor& x,
                    const Tensor& g, const Tensor& u, const Tensor& act, const Tensor& dx, float dx_beta,
                    float limit = 0.f) {
  const int64_t N = g.size(0), I = g.size(1);
  Tensor dact = f32_tmp({N, I}, x.device()), dg = f32_tmp({N, I}, x.device()), du = f32_tmp({N, I}, x.device());
  linear_bwd(dy, act, w.down_proj, gw.down_proj, dact);
  swiglu_bwd(dact, g, u, dg, du, limit);
  linear_bwd(dg, x, w.gate_proj, gw.gate_proj, dx, dx_beta);
  linear_bwd(du, x, w.up_proj, gw.up_proj, dx, 1.f);
}

// The fields each MLP kind keeps (mlp_fields, Mlp::fields), in arena order.
std::vector<ActField> dense_fields(int64_t I) { return {{"g", I}, {"u", I}, {"act", I}}; }
std::vector<ActField> moe_fields(const MoeConfig& m) {
  const int64_t k = m.num_experts_per_tok, kI = k * m.moe_intermediate_size, Is = m.shared_intermediate();
  std::vector<ActField> f{{"router.idx", k, false, true},    {"router.weight", k, true}, {"router.score", k, true},
                          {"experts.g", kI},                 {"experts.u", kI},          {"experts.act", kI}};
  if (Is > 0) f.insert(f.end(), {{"shared.g", Is}, {"shared.u", Is}, {"shared.act", Is}});
  return f;
}

class DenseMlp final : public Mlp {
 public:
  DenseMlp(const ModelConfig& c, const LayerTensors& w, const LayerTensors* g) : I_(c.intermediate_size), w_(w), g_(g) {}

  std::vector<ActField> fields() const override { return dense_fields(I_); }

  void forward(const Tensor& x, const std::vector<Tensor>& sv, const Tensor& y) const override {
    swiglu_mlp_fwd(weights(w_), x, sv[kG], sv[kU], sv[kAct], y);
  }

  void backward(const Tensor& dy, const Tensor& x, const std::vector<Tensor>& sv, const Tensor& dx) const override {
    swiglu_mlp_bwd(weights(w_), weights(*g_), dy, x, sv[kG], sv[kU], sv[kAct], dx, 0.f);
  }

 private:
  enum { kG, kU, kAct };  // fields()' order
  static SwigluTensors weights(const LayerTensors& l) { return {l.gate_proj, l.up_proj, l.down_proj}; }
  int64_t I_;
  const LayerTensors& w_;
  const LayerTensors* g_;
};

// Saved per token: the router's choice (idx), gating weights and chosen scores [N, k]; per slot,
// in dispatch order, the experts' g, u, act [N * k, I] (as [N, k * I] fields); the shared experts'
// g, u, act [N, n_shared x I]. The dispatch and the experts' input rows are rebuilt in the
// backward from idx and x (a counting sort and a gather: no [N * k, hidden] buffer is kept).
class MoeMlp final : public Mlp {
 public:
  MoeMlp(const ModelConfig& c, const LayerTensors& w, const LayerTensors* g)
      : m_(c.moe), hid_(c.hidden_size), w_(w.moe), g_(g ? &g->moe : nullptr), router_(router_of(c)),
        limit_(c.is_v4() ? float(c.v4.swiglu_limit) : 0.f) {}

  std::vector<ActField> fields() const override { return moe_fields(m_); }

  void forward(const Tensor& x, const std::vector<Tensor>& sv, const Tensor& y_in) const override {
    const int64_t N = x.size(0), E = m_.n_routed_experts, k = m_.num_experts_per_tok;
    const Device dev = x.device();
    const MoeRouting r = routing(sv);
    const Tensor y = y_in.view({N, hid_});  // the decoder's [b, s, hidden] output as rows
    Tensor logits = f32_tmp({N, E}, dev);
    linear_fwd(x, w_.gate, logits);  // f32: the gate is kept f32 (Model::wc)
    moe_route_fwd(logits, w_.e_score_correction_bias, router_, r, fixed);
    const MoeDispatch d = moe_dispatch(r.idx, E);
    Tensor xs = f32_tmp({N * k, hid_}, dev), ys;
    moe_gather(x, d, k, Tensor(), true, xs);
    if (expert_parallel()) {
      ys = ep_forward(xs, d);
    } else {
      ys = f32_tmp({N * k, hid_}, dev);
      const Tensor G = slots(sv[kG], k), U = slots(sv[kU], k), A = slots(sv[kAct], k);
      // Each expert's SwiGLU over its rows, as grouped products (the bounds stay on the device).
      moe_grouped_fwd(xs, each(w_.experts, &SwigluTensors::gate_proj), d, G);
      moe_grouped_fwd(xs, each(w_.experts, &SwigluTensors::up_proj), d, U);
      swiglu_fwd(G, U, A, limit_);
      moe_grouped_fwd(A, each(w_.experts, &SwigluTensors::down_proj), d, ys);
    }
    const bool shared = m_.shared_intermediate() > 0;
    if (shared) swiglu_mlp_fwd(w_.shared, x, sv[kSharedG], sv[kSharedU], sv[kSharedAct], y, limit_);
    moe_combine(ys, d, k, r.weight.view({N * k}), shared, y);  // y = shared + sum_j w_j expert_j(x)
  }

  void backward(const Tensor& dy_in, const Tensor& x, const std::vector<Tensor>& sv, const Tensor& dx) const override {
    const int64_t N = x.size(0), E = m_.n_routed_experts, k = m_.num_experts_per_tok, I = m_.moe_intermediate_size;
    const Device dev = x.device();
    const MoeRouting r = routing(sv);
    const Tensor w = r.weight.view({N * k}), dy = dy_in.view({N, hid_});
    const MoeDispatch d = moe_dispatch(r.idx, E);
    const Tensor G = slots(sv[kG], k), U = slots(sv[kU], k), A = slots(sv[kAct], k);
    // y_t = sum_j w_j down_e(act_j): the down products see act scaled by w (actw), so dW_down gets
    // w dy act^T, and dz = dy W_down is the unweighted gradient of act, from which dw_j = dz_j . act_j
    // and dact_j = w_j dz_j.
    Tensor xs = f32_tmp({N * k, hid_}, dev), dys = f32_tmp({N * k, hid_}, dev), dxs = f32_tmp({N * k, hid_}, dev),
           dw = f32_tmp({N * k}, dev);
    moe_gather(x, d, k, Tensor(), true, xs);
    moe_gather(dy, d, k, Tensor(), true, dys);
    if (expert_parallel()) {
      ep_backward(xs, dys, w, d, dxs, dw);
    } else {
      Tensor actw = f32_tmp({N * k, I}, dev), dz = f32_tmp({N * k, I}, dev), dact = f32_tmp({N * k, I}, dev),
             dG = f32_tmp({N * k, I}, dev), dU = f32_tmp({N * k, I}, dev);
      moe_gather(A, d, k, w, false, actw);
      moe_grouped_bwd(dys, actw, each(w_.experts, &SwigluTensors::down_proj),
                      each(g_->experts, &SwigluTensors::down_proj), d, dz);
      moe_rowdot(dz, A, d, k, dw);
      moe_gather(dz, d, k, w, false, dact);
      swiglu_bwd(dact, G, U, dG, dU, limit_);
      moe_grouped_bwd(dG, xs, each(w_.experts, &SwigluTensors::gate_proj),
                      each(g_->experts, &SwigluTensors::gate_proj), d, dxs);
      moe_grouped_bwd(dU, xs, each(w_.experts, &SwigluTensors::up_proj), each(g_->experts, &SwigluTensors::up_proj),
                      d, dxs, 1.f);
    }
    moe_combine(dxs, d, k, Tensor(), false, dx);  // each token's slots in slot order
    if (m_.shared_intermediate() > 0)
      swiglu_mlp_bwd(w_.shared, g_->shared, dy, x, sv[kSharedG], sv[kSharedU], sv[kSharedAct], dx, 1.f, limit_);
    // The gate: through the weights only (the bias chose, it has no gradient); sqrt(softplus)'s
    // derivative reads the logits again.
    Tensor dlogits = f32_tmp({N, E}, dev), u;
    if (router_.score == MoeScore::sqrtsoftplus) {
      u = f32_tmp({N, E}, dev);
      linear_fwd(x, w_.gate, u);
    }
    moe_route_bwd(dw.view({N, k}), r, router_, dlogits, u);
    if (aux.counts.defined()) {  // the balance loss's gradient through the scores, on the same logits
      Tensor u = f32_tmp({N, E}, dev);
      linear_fwd(x, w_.gate, u);
      moe_aux_loss(u, aux.counts, aux.mask, k, aux.scale, dlogits, aux.loss);
    }
    linear_bwd(dlogits, x, w_.gate, g_->gate, dx, 1.f);
  }

  Tensor chosen_experts(const std::vector<Tensor>& sv) const override { return sv[kIdx]; }

 private:
  bool expert_parallel() const { return ep && ep->size() > 1; }
  // This rank's block of the experts' matrices (ep.h: rank q owns [q E / R, (q + 1) E / R)).
  std::vector<Tensor> block(const std::vector<SwigluTensors>& ex, Tensor SwigluTensors::*m) const {
    const int64_t El = int64_t(ex.size()) / ep->size(), e0 = ep->rank() * El;
    std::vector<Tensor> t;
    for (int64_t e = e0; e < e0 + El; ++e) t.push_back(ex[size_t(e)].*m);
    return t;
  }
  // The experts' SwiGLU over the rows an owner received (g, u, act [rows, I] written, y [rows, D]).
  void local_experts_fwd(const Tensor& xr, const MoeDispatch& local, const Tensor& G, const Tensor& U, const Tensor& A,
                         const Tensor& yr) const {
    moe_grouped_fwd(xr, block(w_.experts, &SwigluTensors::gate_proj), local, G);
    moe_grouped_fwd(xr, block(w_.experts, &SwigluTensors::up_proj), local, U);
    swiglu_fwd(G, U, A, limit_);
    if (yr.defined()) moe_grouped_fwd(A, block(w_.experts, &SwigluTensors::down_proj), local, yr);
  }
  // The routed experts' outputs ys [N k, D] (dispatch order) from xs under expert parallelism: xs's
  // rows to their owners, this rank's experts over what it received, the outputs back.
  Tensor ep_forward(const Tensor& xs, const MoeDispatch& d) const {
    const Device dev = xs.device();
    const int64_t I = m_.moe_intermediate_size;
    const EpRows r = ep_rows(*ep, d, dev);
    const Tensor xr = ep_dispatch(*ep, r.plan, xs);
    Tensor G = f32_tmp({r.rows, I}, dev), U = f32_tmp({r.rows, I}, dev), A = f32_tmp({r.rows, I}, dev),
           yr = f32_tmp({r.rows, hid_}, dev);
    local_experts_fwd(xr, r.local, G, U, A, yr);
    return ep_return(*ep, r.plan, yr);
  }
  // Its backward: xs, dys [N k, D] and the slots' weights w [N k] (slot order) -> dxs [N k, D]
  // (dispatch order) and dw [N k] (slot order), the block's weight gradients added. The rows travel
  // again with their gradients and weights; the owner recomputes its experts' activations (they
  // were not kept: their rows are another rank's count).
  void ep_backward(const Tensor& xs, const Tensor& dys, const Tensor& w, const MoeDispatch& d, const Tensor& dxs,
                   const Tensor& dw) const {
    const Device dev = xs.device();
    const int64_t I = m_.moe_intermediate_size, slots = xs.size(0), k = m_.num_experts_per_tok;
    const Tensor ones = ones_column(slots, dev);
    Tensor wd = f32_tmp({slots, 1}, dev);  // each dispatch row's weight: wd[i] = w[order[i]]
    moe_gather(ones, d, k, w, false, wd);
    const EpRows r = ep_rows(*ep, d, dev);
    const int64_t R = r.rows;
    const Tensor xr = ep_dispatch(*ep, r.plan, xs), dyr = ep_dispatch(*ep, r.plan, dys);
    const Tensor wr = ep_dispatch(*ep, r.plan, wd).view({R});
    Tensor G = f32_tmp({R, I}, dev), U = f32_tmp({R, I}, dev), A = f32_tmp({R, I}, dev);
    local_experts_fwd(xr, r.local, G, U, A, Tensor());
    Tensor actw = f32_tmp({R, I}, dev), dz = f32_tmp({R, I}, dev), dact = f32_tmp({R, I}, dev),
           dG = f32_tmp({R, I}, dev), dU = f32_tmp({R, I}, dev), dxr = f32_tmp({R, hid_}, dev),
           dwr = f32_tmp({R, 1}, dev);
    moe_gather(A, r.local, 1, wr, false, actw);
    moe_grouped_bwd(dyr, actw, block(w_.experts, &SwigluTensors::down_proj),
                    block(g_->experts, &SwigluTensors::down_proj), r.local, dz);
    moe_rowdot(dz, A, r.local, 1, dwr.view({R}));
    moe_gather(dz, r.local, 1, wr, false, dact);
    swiglu_bwd(dact, G, U, dG, dU, limit_);
    moe_grouped_bwd(dG, xr, block(w_.experts, &SwigluTensors::gate_proj), block(g_->experts, &SwigluTensors::gate_proj),
                    r.local, dxr);
    moe_grouped_bwd(dU, xr, block(w_.experts, &SwigluTensors::up_proj), block(g_->experts, &SwigluTensors::up_proj),
                    r.local, dxr, 1.f);
    Tensor(dxs).copy_from(ep_return(*ep, r.plan, dxr));
    moe_rowdot(ep_return(*ep, r.plan, dwr), ones, d, k, dw);  // each row's dw to its slot
  }
  enum { kIdx, kWeight, kScore, kG, kU, kAct, kSharedG, kSharedU, kSharedAct };  // fields()' order
  static MoeRouting routing(const std::vector<Tensor>& sv) { return {sv[kIdx], sv[kWeight], sv[kScore]}; }
  // DeepSeek-V4: one group, scores by scoring_func, weights always normalised (transformers
  // ignores norm_topk_prob there: docs/deepseek_v4_math.md section 0).
  static MoeRouter router_of(const ModelConfig& c) {
    const MoeConfig& m = c.moe;
    if (!c.is_v4()) return {m.n_group, m.topk_group, m.norm_topk_prob, float(m.routed_scaling_factor)};
    const MoeScore sc = c.v4.scoring == ScoringFunc::sqrtsoftplus ? MoeScore::sqrtsoftplus : MoeScore::sigmoid;
    return {1, 1, true, float(m.routed_scaling_factor), sc};
  }
  // One matrix (gate_proj, up_proj or down_proj) of every routed expert, for the grouped products.
  static std::vector<Tensor> each(const std::vector<SwigluTensors>& ex, Tensor SwigluTensors::*m) {
    std::vector<Tensor> t;
    t.reserve(ex.size());
    for (const SwigluTensors& e : ex) t.push_back(e.*m);
    return t;
  }
  // A [N, k * I] field as its N * k dispatch rows.
  static Tensor slots(const Tensor& f, int64_t k) { return f.view({f.size(0) * k, f.size(1) / k}); }
  const MoeConfig& m_;
  int64_t hid_;
  const MoeTensors& w_;
  const MoeTensors* g_;
  MoeRouter router_;
  float limit_;  // DeepSeek-V4's swiglu_limit on routed and shared experts; 0: no clamp
};

}  // namespace

std::vector<ActField> mlp_fields(const ModelConfig& c, int64_t L) {
  return c.is_moe_layer(L) ? moe_fields(c.moe) : dense_fields(c.intermediate_size);
}

std::unique_ptr<Mlp> make_mlp(const ModelConfig& c, int64_t L, const LayerTensors& w, const LayerTensors* g) {
  if (c.is_moe_layer(L)) return std::make_unique<MoeMlp>(c, w, g);
  return std::make_unique<DenseMlp>(c, w, g);
}

}  // namespace hmla
