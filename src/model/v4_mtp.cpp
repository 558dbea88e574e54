// DeepSeek-V4's multi-token prediction in training (v4_internal.h's v4_mtp_step;
// docs/deepseek_v4_math.md section 14: DeepSeek-V3's definition on V4's blocks, names and wiring
// of DeepSeek's V4 MTPBlock). Depth k < D reads the streams X_k (X_0: the stack's last, before
// model.hc_head) and the token k + 1 ahead, u_k(t) = ids[t + k + 1] inside t's document (else pad):
//   Y(t, i)  = e_proj enorm(E[u_k(t)]) + h_proj hnorm(X_k(t, i))   for every stream i
//   X_{k+1}  = the block of layer num_hidden_layers + k on Y (its kind's attention, MoE, mHC)
//   logits_k = head norm_k(hc_head_k(X_{k+1})), against ids[t + k + 2] (count_lm_targets' rules)
// and the loss coeff / D sum_k CE_k, each CE_k a mean over the step's targets of depth k. The
// backward runs the depths from the last: depth k's output streams get its head's gradient and the
// next depth's input gradient; X_0's goes into the stack (dx), E and the head get theirs. A
// hybrid_mla MTP layer runs the phase's mode (mtp_mode) and trains its indexer by its KL in the dsa
// modes; in dsa_warmup (no backbone) only that runs, after the depths' forwards. The forward keeps
// every depth (D is 1 in DeepSeek's releases). CPU, f32, as v4_model.cpp.
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "hmla/dist/cp.h"
#include "hmla/model/mlp.h"
#include "hmla/model/model.h"
#include "hmla/model/v4_tables.h"
#include "hmla/ops/optim.h"
#include "model_internal.h"
#include "v4_internal.h"

namespace hmla {

namespace {

Tensor f32(Device dev, const Shape& sh) { return Tensor::empty(sh, DType::f32, dev); }

// mtp.{i}.* (v4_mtp_params), weights or gradients.
struct MtpTensors {
  Tensor e_proj, enorm, h_proj, hnorm, norm;
  MhcWeights hc_head;
  V4LayerTensors block;
};

MtpTensors mtp_tensors(const io::TensorMap& t, const ModelConfig& c, int64_t i) {
  const std::string pre = mtp_prefix(i);
  MtpTensors w;
  w.e_proj = t.at(pre + "e_proj.weight");
  w.enorm = t.at(pre + "enorm.weight");
  w.h_proj = t.at(pre + "h_proj.weight");
  w.hnorm = t.at(pre + "hnorm.weight");
  w.norm = t.at(pre + "norm.weight");
  w.hc_head = {t.at(pre + "hc_head_fn"), t.at(pre + "hc_head_base"), t.at(pre + "hc_head_scale")};
  w.block = v4_block_tensors(t, c, c.num_hidden_layers + i, pre, "kv_norm.weight");
  return w;
}

// What one depth keeps for its backward (N = b s rows, n streams of width D).
struct Depth {
  Tensor x;                          // X_k [N, n, D], its input streams
  Tensor ids;                        // u_k [b, s] i32
  Tensor e, en, rstd_e, ep;          // E[u_k], enorm's output [N, D] and rstd [N], e_proj's output
  Tensor hn, rstd_h;                 // hnorm over each stream [N n, D], [N n]
  Tensor y;                          // the block's input [N, n, D]
  MhcSaved hc1, hc2;                 // the block, as v4_model.cpp's layers keep it
  Tensor xa, post1, comb1, a, rstd_a, ya, x_mid, xf, post2, comb2, f, rstd_f, yf, x_out;
  V4AttnSaved attn;
  V4HybridSaved hybrid;              // a hybrid_mla layer's attention (attn unused)
  std::unique_ptr<Mlp> moe;
  std::vector<Tensor> mlp;
  MhcSaved head;                     // hc_head's rstd, z
  Tensor hh, rstd_n, n_final;        // hc_head's output, the norm's rstd and output
  Tensor target, keep;               // [N]: ids[t + k + 2] and coeff / (D T_k) on the counted rows
};

// The MTP block's attention by its layer's kind: the one place an MTP layer picks it. ya = the
// attention of x [b, s, D] (attn_norm's output).
void attention_fwd(const ModelConfig& c, int64_t L, const V4LayerTensors& w, const Tensor& x, const DocLayout& layout,
                   const V4Rows& ropes, Depth& d) {
  switch (c.v4.kind(L)) {
    case V4Kind::sliding:
    case V4Kind::csa:
    case V4Kind::hca:
      return v4_attention_fwd(c, L, w.attn, x, layout, ropes, d.attn, d.ya);
    case V4Kind::hybrid_mla:
      return v4_hybrid_fwd(c, L, w.mla, x, layout, d.hybrid, d.ya, *ropes.cp, ropes.hybrid);
  }
}

// The step's KL slots (f64 [1] each) an MTP layer's indexer KL goes into, by its kind.
struct KlSlots {
  Tensor hybrid, csa;
};

// Its backward: dx from dy (both undefined without the backbone: dsa_warmup). A layer that runs its
// indexer (hybrid_mla, CSA) trains it by its KL, added into its kind's slot, as the stack's layers
// do; other layers have nothing to do without the backbone.
void attention_bwd(const ModelConfig& c, int64_t L, const V4LayerTensors& w, const V4LayerTensors& g, const Tensor& x,
                   const DeviceBatch& in, const V4Rows& ropes, const Depth& d, const Tensor& dy, const Tensor& dx,
                   const KlSlots& slots) {
  const bool kl = c.runs_indexer(L);
  switch (c.v4.kind(L)) {
    case V4Kind::sliding:
    case V4Kind::csa:
    case V4Kind::hca: {
      if (!dy.defined() && !kl) return;
      V4BackwardOptions o;
      o.backbone = dy.defined();
      if (kl) o.row_weight = in.row_weight, o.kl_acc = slots.csa;
      v4_attention_bwd(c, w.attn, g.attn, x, in.layout, ropes, d.attn, dy, dx, o);
      return;
    }
    case V4Kind::hybrid_mla:
      v4_hybrid_bwd(d.hybrid, w.mla, g.mla, x, in.layout, dy, dx,
                    {dy.defined(), kl ? in.row_weight : Tensor(), kl ? slots.hybrid : Tensor()}, *ropes.cp);
      return;
  }
}

void depth_forward(const Model& m, const MtpTensors& w, const Tensor& embed, const DeviceBatch& in,
                   const V4Rows& ropes, int64_t k, Depth& d) {
  const ModelConfig& c = m.cfg;
  const int64_t b = in.ids.size(0), s = in.ids.size(1), N = b * s, n = c.v4.hc_mult, D = c.hidden_size;
  const int64_t L = c.num_hidden_layers + k;
  const Device dev = m.device();
  const float eps = float(c.rms_norm_eps);
  d.e = f32(dev, {N, D}), d.en = v4_act(dev, {N, D}), d.rstd_e = f32(dev, {N}), d.ep = f32(dev, {N, D});
  embedding_fwd(d.ids, embed, d.e);
  rmsnorm_fwd(d.e, w.enorm, eps, d.en, d.rstd_e);
  linear_fwd(d.en, w.e_proj, d.ep);
  d.hn = v4_act(dev, {N * n, D}), d.rstd_h = f32(dev, {N * n}), d.y = f32(dev, {N, n, D});
  rmsnorm_fwd(d.x.view({N * n, D}), w.hnorm, eps, d.hn, d.rstd_h);
  linear_fwd(d.hn, w.h_proj, d.y.view({N * n, D}));
  for (int64_t i = 0; i < n; ++i) add(d.y.select(1, i), d.ep, d.y.select(1, i));
  const V4LayerTensors& lw = w.block;
  v4_block_entry(c, lw.hc_attn, lw.attn_norm, d.y, {d.hc1, d.xa, d.post1, d.comb1, d.a, d.rstd_a});
  d.ya = f32(dev, {N, D});
  attention_fwd(c, L, lw, d.a.view({b, s, D}), in.layout, ropes, d);
  d.x_mid = f32(dev, {N, n, D});
  mhc_post_fwd(d.y, d.ya, d.post1, d.comb1, d.x_mid);
  v4_block_entry(c, lw.hc_ffn, lw.ffn_norm, d.x_mid, {d.hc2, d.xf, d.post2, d.comb2, d.f, d.rstd_f});
  d.moe = make_mlp(c, L, lw.mlp);  // learned routing (a hash MTP layer is refused: v4_mtp_step)
  d.moe->ep = m.ep;
  for (const ActField& fl : d.moe->fields())
    d.mlp.push_back(Tensor::empty(fl.width ? Shape{N, fl.width} : Shape{N}, field_dtype(fl, compute_dtype(dev)), dev));
  d.yf = f32(dev, {N, D});
  d.moe->forward(d.f, d.mlp, d.yf);
  d.x_out = f32(dev, {N, n, D});
  mhc_post_fwd(d.x_mid, d.yf, d.post2, d.comb2, d.x_out);
  d.head = {f32(dev, {N}), f32(dev, {N, n})};
  d.hh = f32(dev, {N, D}), d.rstd_n = f32(dev, {N}), d.n_final = f32(dev, {N, D});
  mhc_head_fwd(d.x_out, w.hc_head, eps, float(c.v4.hc_eps), d.hh, d.head);
  rmsnorm_fwd(d.hh, w.norm, eps, d.n_final, d.rstd_n);
}

// Depth k's loss (added into acc) and backward from dnext (the next depth's gradient on this one's
// output streams; undefined for the last): the gradient on its input streams X_k.
Tensor depth_backward(const Model& m, const MtpTensors& w, const MtpTensors& g, const V4Tensors& mw,
                      const V4Tensors& mg, const DeviceBatch& in, const V4Rows& ropes, int64_t k, Depth& d,
                      const Tensor& dnext, const Tensor& acc, const KlSlots& kl) {
  const ModelConfig& c = m.cfg;
  const int64_t b = in.ids.size(0), s = in.ids.size(1), N = b * s, n = c.v4.hc_mult, D = c.hidden_size;
  const int64_t L = c.num_hidden_layers + k;
  const Device dev = m.device();
  Tensor dn = f32(dev, {N, D}), dhh = f32(dev, {N, D}), dz = f32(dev, {N, n, D});
  lm_head_loss(m, mw.head, d.n_final, d.target, d.keep, mg.head, dn, acc);
  rmsnorm_bwd(dn, d.hh, w.norm, d.rstd_n, dhh, g.norm);
  mhc_head_bwd(dhh, d.x_out, w.hc_head, d.head, float(c.v4.hc_eps), dz, g.hc_head);
  if (dnext.defined()) add(dz.view({N, n * D}), dnext.view({N, n * D}), dz.view({N, n * D}));
  const V4LayerTensors &lw = w.block, &lg = g.block;
  const std::unique_ptr<Mlp> mlp = make_mlp(c, L, lw.mlp, &lg.mlp);
  mlp->ep = m.ep;
  dz = v4_block_backward(c, lw.hc_ffn, lg.hc_ffn, lw.ffn_norm, lg.ffn_norm, d.x_mid, d.yf,
                         {d.hc2, d.xf, d.post2, d.comb2, d.f, d.rstd_f}, dz, [&](const Tensor& dy, const Tensor& dnx) { mlp->backward(dy, d.f, d.mlp, dnx); });
  dz = v4_block_backward(c, lw.hc_attn, lg.hc_attn, lw.attn_norm, lg.attn_norm, d.y, d.ya,
                         {d.hc1, d.xa, d.post1, d.comb1, d.a, d.rstd_a}, dz, [&](const Tensor& dy, const Tensor& dnx) {
                           attention_bwd(c, L, lw, lg, d.a.view({b, s, D}), in, ropes, d, dy, dnx, kl);
                         });
  // dz is dY: through h_proj and hnorm to each stream of X_k; its sum over the streams through
  // e_proj and enorm to the embedding's rows (e_proj's output was added to every stream).
  Tensor dhn = f32(dev, {N * n, D}), dx = f32(dev, {N, n, D});
  linear_bwd(dz.view({N * n, D}), d.hn, w.h_proj, g.h_proj, dhn);
  rmsnorm_bwd(dhn, d.x.view({N * n, D}), w.hnorm, d.rstd_h, dx.view({N * n, D}), g.hnorm);
  Tensor dep = f32(dev, {N, D}), den = f32(dev, {N, D}), de = f32(dev, {N, D});
  scale(dz.select(1, 0), 1.f, dep);
  for (int64_t i = 1; i < n; ++i) add(dep, dz.select(1, i), dep);
  linear_bwd(dep, d.en, w.e_proj, g.e_proj, den);
  rmsnorm_bwd(den, d.e, w.enorm, d.rstd_e, de, g.enorm);
  embedding_bwd(d.ids, de, mg.embed);
  return dx;
}

}  // namespace

double v4_mtp_step(const Model& m, const DeviceBatch& in, const StepOptions& opt, const V4Rows& ropes,
                   const Tensor& x_final, const V4Tensors& w, const V4Tensors& g, io::TensorMap& grads,
                   const Tensor& dx, const Tensor& kl_acc, const Tensor& kl_acc_csa) {
  const KlSlots kl{kl_acc, kl_acc_csa};
  const ModelConfig& c = m.cfg;
  const int64_t depths = c.form.num_nextn_predict_layers, N = in.ids.numel(), n = c.v4.hc_mult, D = c.hidden_size;
  HMLA_CHECK(c.v4.mtp_params && depths > 0, ConfigError, "mtp_loss_coeff = ", opt.mtp_coeff,
             ": the model's multi-token-prediction layers are not parameters (num_nextn_predict_layers = ", depths,
             "; the trainer makes them so for a programme with mtp_loss_coeff > 0)");
  HMLA_CHECK(opt.mtp_targets.empty() || int64_t(opt.mtp_targets.size()) == depths, ConfigError,
             "StepOptions::mtp_targets has ", opt.mtp_targets.size(), " counts for ", depths, " MTP layers");
  HMLA_CHECK(int64_t(in.mtp_ids.size()) == depths, ConfigError, "the micro-batch has MTP inputs for ",
             in.mtp_ids.size(), " depths, the model ", depths);
  const int64_t b = in.layout.b;
  const RowShard& sh = ropes.sh;
  const Device dev = m.device();
  std::vector<Depth> dd(static_cast<size_t>(depths));
  std::vector<MtpTensors> mw, mg;
  Tensor x = x_final;
  for (int64_t k = 0; k < depths; ++k) {
    HMLA_CHECK(!c.v4.hash_layer(c.num_hidden_layers + k), ConfigError, "mlp_layer_types[",
               c.num_hidden_layers + k, "] = hash_moe: a hash-routed MTP layer does not train (it would route by u_k)");
    Depth& d = dd[size_t(k)];
    mw.push_back(mtp_tensors(v4_compute_views(m), c, k));
    mg.push_back(mtp_tensors(grads, c, k));
    d.x = x;
    // The depth's inputs and targets came with the batch (every row's ids were on the host: under
    // context parallelism the token k + 1 ahead may be another rank's); its targets' weights are
    // the batch's 0/1 times coeff / D / (the step's target count).
    d.ids = in.mtp_ids[size_t(k)];
    d.target = in.mtp_target[size_t(k)];
    const int64_t T = std::max<int64_t>(opt.mtp_targets.empty() ? in.mtp_count[size_t(k)]
                                                                : opt.mtp_targets[size_t(k)], 1);
    d.keep = f32(dev, {N});
    scale(in.mtp_keep[size_t(k)], float(opt.mtp_coeff / double(depths) / double(T)), d.keep);
    depth_forward(m, mw.back(), w.embed, in, ropes, k, d);
    x = d.x_out;
  }
  if (!opt.backbone) {  // dsa_warmup: the hybrid_mla MTP layers' indexers by their KL, nothing else
    for (int64_t k = 0; k < depths; ++k)
      attention_bwd(c, c.num_hidden_layers + k, mw[size_t(k)].block, mg[size_t(k)].block, dd[size_t(k)].a.view({b, sh.rows, D}),
                    in, ropes, dd[size_t(k)], Tensor(), Tensor(), kl);
    return 0;
  }
  // acc: coeff / D sum_k CE_k (the rows' weights carry the factors), then without coeff.
  const bool on_stats = opt.stats.defined();
  Tensor acc = on_stats ? opt.stats.slice(0, kStatMbMtp, kStatMbMtp + 1) : Tensor::zeros({1}, DType::f64, dev);
  if (on_stats) acc.fill_zero();
  Tensor dnext;
  for (int64_t k = depths - 1; k >= 0; --k)
    dnext = depth_backward(m, mw[size_t(k)], mg[size_t(k)], w, g, in, ropes, k, dd[size_t(k)], dnext, acc, kl);
  add(dx.view({N, n * D}), dnext.view({N, n * D}), dx.view({N, n * D}));
  if (on_stats) {  // kept on the device for the step's one read-back
    stats_add(opt.stats, kStatMtp, kStatMbMtp, opt.mtp_coeff);
    return std::numeric_limits<double>::quiet_NaN();
  }
  return acc.to_vector<double>()[0] / opt.mtp_coeff;
}

}  // namespace hmla
