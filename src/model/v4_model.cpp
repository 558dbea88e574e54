// The DeepSeek-V4 model on ops (v4_model.h; docs/deepseek_v4_math.md sections 7-8). Per layer, on
// the streams X [N, n, D]:
//   attention block: (post, comb, xa) = mhc_pre(X); a = attn_norm(xa); y = attention(a);
//                    X_mid = mhc_post(X, y, post, comb)
//   MoE block:       the same around ffn_norm and the MoE (hash layers route by tid2eid[input id]);
// then hh = hc_head(X), the final norm and the head. The streams start as n copies of the
// embedding. Backward: each block's exit (mhc_post_bwd) gives the stream gradient through comb and
// the sublayer's output gradient; the sublayer's input gradient goes back through its norm and the
// entry (mhc_pre_bwd); the two stream gradients are summed. The streams, mixers and gradients are
// f32, the sublayers' inputs and saved activations the compute dtype (v4_internal.h v4_act).
#include "hmla/model/v4_model.h"

#include <limits>
#include <memory>
#include <string>

#include "hmla/model/mlp.h"
#include "hmla/model/model.h"
#include "hmla/ops/moe.h"
#include "hmla/ops/nn.h"
#include "hmla/ops/optim.h"
#include "model_internal.h"
#include "v4_internal.h"

namespace hmla {

namespace {

MhcWeights hc_weights(const io::TensorMap& t, const std::string& at) {
  return {t.at(at + "_fn"), t.at(at + "_base"), t.at(at + "_scale")};
}

Tensor maybe(const io::TensorMap& t, const std::string& name) {
  const auto it = t.find(name);
  return it == t.end() ? Tensor() : it->second;
}

V4CompressorTensors compressor(const io::TensorMap& t, const std::string& at) {
  return {maybe(t, at + "wkv.weight"), maybe(t, at + "wgate.weight"), maybe(t, at + "ape"), maybe(t, at + "norm.weight")};
}

SwigluTensors swiglu(const io::TensorMap& t, const std::string& at) {
  return {t.at(at + "w1.weight"), t.at(at + "w3.weight"), t.at(at + "w2.weight")};
}

// A V4 attention's attn.* (every kind but hybrid_mla), its kv norm `kv_norm`.
V4AttnTensors attn_tensors_at(const io::TensorMap& t, const std::string& at, const std::string& kv_norm) {
  V4AttnTensors a;
  a.wq_a = t.at(at + "wq_a.weight");
  a.q_norm = t.at(at + "q_norm.weight");
  a.wq_b = t.at(at + "wq_b.weight");
  a.wkv = t.at(at + "wkv.weight");
  a.norm = t.at(at + kv_norm);
  a.wo_a = t.at(at + "wo_a.weight");
  a.wo_b = t.at(at + "wo_b.weight");
  a.sink = t.at(at + "attn_sink");
  a.comp = compressor(t, at + "compressor.");
  a.icomp = compressor(t, at + "indexer.compressor.");
  a.iwq_b = maybe(t, at + "indexer.wq_b.weight");
  a.iweights = maybe(t, at + "indexer.weights_proj.weight");
  return a;
}

// A hybrid_mla layer's self_attn.* (the MLA layer's names).
AttnTensors hybrid_tensors(const io::TensorMap& t, const std::string& at) {
  io::TensorMap w;
  for (auto it = t.lower_bound(at); it != t.end() && it->first.starts_with(at); ++it)
    w[it->first.substr(at.size())] = it->second;
  return attn_tensors(w);
}

}  // namespace

V4LayerTensors v4_block_tensors(const io::TensorMap& t, const ModelConfig& c, int64_t L, const std::string& pre,
                                const std::string& kv_norm) {
  const std::string ffn = pre + "ffn.";
  V4LayerTensors l;
  l.hc_attn = hc_weights(t, pre + "hc_attn");
  l.hc_ffn = hc_weights(t, pre + "hc_ffn");
  l.attn_norm = t.at(pre + "attn_norm.weight");
  l.ffn_norm = t.at(pre + "ffn_norm.weight");
  if (c.v4.is_hybrid_mla(L)) l.mla = hybrid_tensors(t, pre + "self_attn.");
  else l.attn = attn_tensors_at(t, pre + "attn.", kv_norm);
  MoeTensors& m = l.mlp.moe;
  m.gate = t.at(ffn + "gate.weight");
  m.e_score_correction_bias = maybe(t, ffn + "gate.bias");
  for (int64_t e = 0; e < c.moe.n_routed_experts; ++e) {  // another expert-parallel rank's: undefined
    const std::string at = ffn + "experts." + std::to_string(e) + ".";
    m.experts.push_back(t.count(at + "w1.weight") ? swiglu(t, at) : SwigluTensors{});
  }
  m.shared = swiglu(t, ffn + "shared_experts.");
  return l;
}

namespace {

Tensor f32(Device dev, const Shape& sh) { return Tensor::empty(sh, DType::f32, dev); }

// What one layer keeps for its backward (N rows, n streams of width D).
struct LayerSaved {
  Tensor x;                            // the layer's input streams [N, n, D]
  MhcSaved hc1, hc2;                   // the two entries' rstd [N], z [N, (2 + n) n]
  Tensor xa, post1, comb1, a, rstd_a;  // attention block: collapsed input, mixers, attn_norm output and rstd
  V4AttnSaved attn;
  V4HybridSaved hybrid;                // a hybrid_mla layer's attention (attn unused)
  Tensor ya;                           // the attention's output [N, D]
  Tensor x_mid;                        // the streams after the attention block
  Tensor xf, post2, comb2, f, rstd_f;  // MoE block: likewise
  std::vector<Tensor> mlp;             // the MoE's fields (Mlp::fields)
  Tensor yf;                           // the MoE's output [N, D]
  Tensor x_out;                        // the layer's output streams
};

struct Forward {
  std::vector<LayerSaved> layers;
  Tensor x_final;                   // the last layer's streams
  MhcSaved head;                    // hc_head's rstd, z
  Tensor hh, rstd_n, n_final;       // hc_head's output, the final norm's rstd and output
  V4Rows rows;                      // this rank's rows, its RoPE tables
  std::vector<std::unique_ptr<Mlp>> mlps;  // each layer's MoE (its hash routing set)
};

}  // namespace

// The hash layer's experts: tid2eid's rows of the tokens ([N, k] i32). Shared with decoding
// (v4_internal.h); a training step's come with its batch (v4_batch.cpp).
Tensor hash_experts(const Model& m, int64_t L, const Tensor& ids) {
  const Tensor& table = m.ints.at(layer_prefix(L) + "ffn.gate.tid2eid");  // on the host
  const Tensor h = ids.to(Device::cpu);  // a contiguous copy
  const int64_t N = h.numel(), k = table.size(1);
  Tensor out = Tensor::empty({N, k}, DType::i32);
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < k; ++j) out.data<int32_t>()[t * k + j] = table.data<int32_t>()[h.data<int32_t>()[t] * k + j];
  return out.on(ids.device());
}

namespace {

Forward forward(const Model& m, const V4Tensors& w, const DeviceBatch& in, Comm& cp) {
  const ModelConfig& c = m.cfg;
  const int64_t b = in.ids.size(0), s = in.ids.size(1), N = b * s, n = c.v4.hc_mult, D = c.hidden_size;
  const Device dev = m.device();
  const float eps = float(c.rms_norm_eps);
  Forward f;
  f.rows = v4_rows(m, in, cp);
  Tensor e0 = f32(dev, {N, D}), x = f32(dev, {N, n, D});
  embedding_fwd(in.ids, w.embed, e0);
  for (int64_t i = 0; i < n; ++i) scale(e0, 1.f, x.select(1, i));
  f.layers.resize(size_t(c.num_hidden_layers));
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) {
    LayerSaved& sv = f.layers[size_t(L)];
    const V4LayerTensors& lw = w.layers[size_t(L)];
    sv.x = x;
    v4_block_entry(c, lw.hc_attn, lw.attn_norm, x, {sv.hc1, sv.xa, sv.post1, sv.comb1, sv.a, sv.rstd_a});
    sv.ya = f32(dev, {N, D});
    if (c.v4.is_hybrid_mla(L)) v4_hybrid_fwd(c, L, lw.mla, sv.a.view({b, s, D}), in.layout, sv.hybrid, sv.ya, cp, f.rows.hybrid);
    else v4_attention_fwd(c, L, lw.attn, sv.a.view({b, s, D}), in.layout, f.rows, sv.attn, sv.ya);
    sv.x_mid = f32(dev, {N, n, D});
    mhc_post_fwd(x, sv.ya, sv.post1, sv.comb1, sv.x_mid);
    v4_block_entry(c, lw.hc_ffn, lw.ffn_norm, sv.x_mid, {sv.hc2, sv.xf, sv.post2, sv.comb2, sv.f, sv.rstd_f});
    f.mlps.push_back(make_mlp(c, L, lw.mlp));
    Mlp& mlp = *f.mlps.back();
    mlp.ep = m.ep;
    if (c.v4.hash.at(size_t(L))) mlp.fixed = in.hash_experts.at(L);
    for (const ActField& fl : mlp.fields())
      sv.mlp.push_back(Tensor::empty(fl.width ? Shape{N, fl.width} : Shape{N}, field_dtype(fl, compute_dtype(dev)), dev));
    sv.yf = f32(dev, {N, D});
    mlp.forward(sv.f, sv.mlp, sv.yf);
    sv.x_out = f32(dev, {N, n, D});
    mhc_post_fwd(sv.x_mid, sv.yf, sv.post2, sv.comb2, sv.x_out);
    x = sv.x_out;
  }
  f.x_final = x;
  f.head = {f32(dev, {N}), f32(dev, {N, n})};
  f.hh = f32(dev, {N, D});
  mhc_head_fwd(x, w.hc_head, eps, float(c.v4.hc_eps), f.hh, f.head);
  f.rstd_n = f32(dev, {N});
  f.n_final = f32(dev, {N, D});
  rmsnorm_fwd(f.hh, w.norm, eps, f.n_final, f.rstd_n);
  return f;
}

// Context parallelism's exchanges of a V4 stack (v4_cp.cpp) run on host tensors so far.
void check_v4_batch(const Model& m, const Comm& cp) {
  HMLA_CHECK(m.device() == Device::cpu || cp.size() == 1, ConfigError,
             "deepseek_v4: context parallelism on a V4 stack runs on the CPU so far (--cp ", cp.size(),
             " with --device cuda; docs/deepseek_v4.md)");
}


}  // namespace

MtpKlLayers v4_mtp_kl_layers(const ModelConfig& c) {
  MtpKlLayers n;
  for (int64_t L = c.num_hidden_layers; c.v4.mtp_params && L < c.num_hidden_layers + c.form.num_nextn_predict_layers; ++L)
    if (c.runs_indexer(L)) ++(c.v4.is_hybrid_mla(L) ? n.hybrid : n.csa);
  return n;
}

V4Tensors v4_tensors(const io::TensorMap& named, const ModelConfig& c) {
  V4Tensors t;
  t.embed = named.at("model.embed_tokens.weight");
  t.norm = named.at("model.norm.weight");
  t.head = c.tie_word_embeddings ? t.embed : named.at("head.weight");
  t.hc_head = {named.at("model.hc_head.hc_fn"), named.at("model.hc_head.hc_base"), named.at("model.hc_head.hc_scale")};
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) t.layers.push_back(v4_block_tensors(named, c, L, layer_prefix(L)));
  return t;
}

Tensor v4_logits(const Model& m, const DeviceBatch& in, std::vector<Tensor>* topk, std::vector<Tensor>* experts,
                 Comm& cp) {
  check_v4_batch(m, cp);
  const V4Tensors w = v4_tensors(v4_compute_views(m), m.cfg);
  Forward f = forward(m, w, in, cp);
  const int64_t N = in.ids.numel(), V = m.cfg.vocab_size;
  Tensor logits = Tensor::empty({N, V}, DType::f32, m.device());
  linear_fwd(f.n_final, w.head, logits);
  if (topk) {
    topk->clear();
    for (const LayerSaved& l : f.layers) topk->push_back(l.hybrid.mla.topk.defined() ? l.hybrid.mla.topk : l.attn.idx);
  }
  if (experts) {
    experts->clear();
    for (size_t L = 0; L < f.layers.size(); ++L) experts->push_back(f.mlps[L]->chosen_experts(f.layers[L].mlp));
  }
  return logits;
}

double v4_lm_loss(const Model& m, const DeviceBatch& in, Comm& cp) {
  check_v4_batch(m, cp);
  const V4Tensors w = v4_tensors(v4_compute_views(m), m.cfg);
  Forward f = forward(m, w, in, cp);
  const Tensor acc = Tensor::zeros({1}, DType::f64, m.device());
  lm_head_loss(m, w.head, f.n_final, in.target, in.keep, Tensor(), Tensor(), acc);
  return acc.to_vector<double>()[0];
}

StepStats v4_step(const Model& m, const DeviceBatch& in, const StepOptions& opt, io::TensorMap& grads, Comm& cp) {
  check_v4_batch(m, cp);
  const ModelConfig& c = m.cfg;
  HMLA_CHECK(opt.moe_aux_coeff == 0, ConfigError,
             "deepseek_v4: moe_aux_loss_coeff > 0: the sequence-wise balance loss is built for sigmoid routers "
             "only; V4 balances by its router bias (moe_bias_update_rate)");
  const V4Tensors w = v4_tensors(v4_compute_views(m), c), g = v4_tensors(grads, c);
  Forward f = forward(m, w, in, cp);
  const int64_t b = in.ids.size(0), s = in.ids.size(1), N = b * s, n = c.v4.hc_mult, D = c.hidden_size;
  const Device dev = m.device();
  if (opt.expert_load.defined())  // every layer is MoE: each one's counts over the loss rows
    for (int64_t L = 0; L < c.num_hidden_layers; ++L)
      moe_expert_load(f.mlps[size_t(L)]->chosen_experts(f.layers[size_t(L)].mlp), in.row_weight.view({N}), 1, true,
                      opt.expert_load.slice(0, L, L + 1));
  if (opt.attn_mass.defined())  // the stack's V4 attention layers, each into its kind's row
    for (int64_t L = 0; L < c.num_hidden_layers; ++L)
      if (!c.v4.is_hybrid_mla(L))
        v4_attn_mass(c, w.layers[size_t(L)].attn, f.layers[size_t(L)].a.view({b, s, D}), in.layout, f.rows,
                     f.layers[size_t(L)].attn, in.row_weight, opt.attn_mass.select(0, int64_t(c.v4.kind(L))));
  StepStats st;
  st.tokens = N;
  const Tensor stats = opt.stats.defined() ? opt.stats : Tensor::zeros({kStatCount}, DType::f64, dev);
  stats.slice(0, kStatMbLm, kStatMbKlCsa + 1).fill_zero();
  auto slot = [&stats](StatSlot k) { return stats.slice(0, k, k + 1); };
  // Head, final norm, hc_head (without the backbone: the loss only, for the log).
  Tensor dn = f32(dev, {N, D}), dhh = f32(dev, {N, D}), dx = f32(dev, {N, n, D});
  lm_head_loss(m, w.head, f.n_final, in.target, in.keep, opt.backbone ? g.head : Tensor(), opt.backbone ? dn : Tensor(),
               slot(kStatMbLm));
  if (opt.backbone) {
    rmsnorm_bwd(dn, f.hh, w.norm, f.rstd_n, dhh, g.norm);
    mhc_head_bwd(dhh, f.x_final, w.hc_head, f.head, float(c.v4.hc_eps), dx, g.hc_head);
  }
  int64_t csa_layers = 0, hybrid_layers = 0;  // the layers whose KL went into kStatMbKlCsa, kStatMbKl
  // The MTP layers (adding into dx); in dsa_warmup only where an MTP layer's indexer trains.
  const MtpKlLayers mtp_kl = opt.mtp_coeff > 0 ? v4_mtp_kl_layers(c) : MtpKlLayers{};
  if (opt.mtp_coeff > 0 && (opt.backbone || mtp_kl.all() > 0)) {
    st.mtp_loss = v4_mtp_step(m, in, opt, f.rows, f.x_final, w, g, grads, dx, slot(kStatMbKl), slot(kStatMbKlCsa));
    hybrid_layers += mtp_kl.hybrid, csa_layers += mtp_kl.csa;
  }
  for (int64_t L = c.num_hidden_layers - 1; L >= 0; --L) {
    LayerSaved& sv = f.layers[size_t(L)];
    const V4LayerTensors &lw = w.layers[size_t(L)], &lg = g.layers[size_t(L)];
    const bool hybrid = c.v4.is_hybrid_mla(L), kl = c.runs_indexer(L);
    const Tensor a = sv.a.view({b, s, D});
    // The attention's backward (without the backbone: dy, dnx undefined); a layer's indexer KL goes
    // into its kind's slot.
    auto attn_bwd = [&](const Tensor& dy, const Tensor& dnx) {
      if (hybrid) {
        const V4HybridBackward ho{opt.backbone, kl ? in.row_weight : Tensor(), kl ? slot(kStatMbKl) : Tensor()};
        v4_hybrid_bwd(sv.hybrid, lw.mla, lg.mla, a, in.layout, dy, dnx, ho, cp);
        return;
      }
      V4BackwardOptions ao;
      ao.backbone = opt.backbone;
      if (kl) ao.row_weight = in.row_weight, ao.kl_acc = slot(kStatMbKlCsa);
      v4_attention_bwd(c, lw.attn, lg.attn, a, in.layout, f.rows, sv.attn, dy, dnx, ao);
    };
    if (kl) ++(hybrid ? hybrid_layers : csa_layers);
    if (!opt.backbone) {  // dsa_warmup: the indexers' KL and backward only, every other tensor frozen
      attn_bwd(Tensor(), Tensor());
      continue;
    }
    const std::unique_ptr<Mlp> mlp = make_mlp(c, L, lw.mlp, &lg.mlp);
    mlp->fixed = f.mlps[size_t(L)]->fixed;
    mlp->ep = m.ep;
    dx = v4_block_backward(c, lw.hc_ffn, lg.hc_ffn, lw.ffn_norm, lg.ffn_norm, sv.x_mid, sv.yf,
                        {sv.hc2, sv.xf, sv.post2, sv.comb2, sv.f, sv.rstd_f}, dx,
                        [&](const Tensor& dy, const Tensor& dnx) { mlp->backward(dy, sv.f, sv.mlp, dnx); });
    dx = v4_block_backward(c, lw.hc_attn, lg.hc_attn, lw.attn_norm, lg.attn_norm, sv.x, sv.ya,
                        {sv.hc1, sv.xa, sv.post1, sv.comb1, sv.a, sv.rstd_a}, dx,
                        [&](const Tensor& dy, const Tensor& dnx) {
                          attn_bwd(dy, dnx);
                        });
  }
  if (opt.backbone) {  // the embedding fed every stream: its rows' gradient is the streams' sum
    Tensor de = f32(dev, {N, D});
    scale(dx.select(1, 0), 1.f, de);
    for (int64_t i = 1; i < n; ++i) add(de, dx.select(1, i), de);
    embedding_bwd(in.ids, de, g.embed);
  }
  const int64_t kl_layers = csa_layers + hybrid_layers;  // the logged KL: the mean over the layers with one
  if (opt.stats.defined()) {
    stats_add(stats, kStatLm, kStatMbLm, 1);
    if (hybrid_layers > 0) stats_add(stats, kStatKl, kStatMbKl, double(kl_layers));
    if (csa_layers > 0) {
      stats_add(stats, kStatKl, kStatMbKlCsa, double(kl_layers));
      stats_add(stats, kStatKlCsa, kStatMbKlCsa, double(csa_layers));
    }
    st.lm_loss = st.indexer_kl = std::numeric_limits<double>::quiet_NaN();
  } else {
    const std::vector<double> h = stats.to_vector<double>();
    st.lm_loss = h[kStatMbLm];
    if (kl_layers > 0) st.indexer_kl = (h[kStatMbKl] + h[kStatMbKlCsa]) / double(kl_layers);
    if (csa_layers > 0) st.indexer_kl_csa = h[kStatMbKlCsa] / double(csa_layers);
    if (hybrid_layers > 0) st.indexer_kl_hybrid = h[kStatMbKl] / double(hybrid_layers);
  }
  return st;
}

}  // namespace hmla
