// Whole-model forward/backward, on ops: the embedding, the decoder layers (decoder_layer.h: each a
// forward/backward pair whose saved state is LayerSaved), the final norm and the LM head. The
// backward runs the layers in reverse and every op adds its weight gradient straight into the
// gradient arena (hmla/ops/nn.h), in a fixed order.
#include "hmla/model/model.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "hmla/dist/cp.h"
#include "hmla/model/decoder_layer.h"
#include "hmla/model/v4_model.h"
#include "hmla/ops/backend.h"
#include "hmla/ops/moe.h"
#include "hmla/ops/nn.h"
#include "hmla/ops/optim.h"
#include "model_internal.h"

namespace hmla {

namespace {

struct Forward {
  std::vector<LayerSaved> layers;  // their fields are views of the activation arena
  Tensor h_final, rstd_final, n_final;  // before/after model.norm
  Tensor logits;                        // [N, V], only when asked for (model_logits)
};

// Before a forward allocates anything: does it fit, next to the parameters (and, training,
// their gradients and the optimizer's moments)?
void check_forward_memory(const Model& m, const Batch& batch, const Comm& cp, bool training) {
  const int64_t b = batch.input_ids.size(0), s = row_shard(cp, batch.input_ids.size(1)).rows;
  MemoryPlan plan;
  const DType compute = compute_dtype(m.device());
  plan_parameters(plan, m.cfg, m.has_indexer, training, compute, m.ep ? m.ep->size() : 1);
  plan_activations(plan, m.cfg, {"b", b}, {"s", s}, training, compute);
  plan.check(std::string(training ? "a training step" : "a forward") + " over input_ids " +
                 shape_str(batch.input_ids.shape()),
             m.device());
}

// The forward over the micro-batch `in`, which the caller keeps for the backward (the layers'
// saved state points at in.layout).
Forward forward(const Model& m, const DeviceBatch& in, Comm& cp, bool drop_core = false, bool logits = false) {
  const ModelConfig& c = m.cfg;
  const int64_t b = in.ids.size(0), s = in.ids.size(1), N = b * s, hid = c.hidden_size, V = c.vocab_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const DocLayout& layout = in.layout;
  Forward f;
  // Every activation the forward keeps, the attention's saved tensors included, from one arena
  // of activation_table, taken in its order (no names on this path; each view's shape is checked
  // against the table's).
  const DType compute = compute_dtype(m.device());
  const ActRows rows{b, s, layout.s, drop_core};
  const std::vector<ActSpec> table = activation_table(c, rows, compute);
  ArenaCursor act(table, m.device());
  Tensor h = act.next({N, hid}).view({b, s, hid});
  embedding_fwd(in.ids, m.w.embed_tokens, h);
  f.layers.resize(c.num_hidden_layers);
  const RopeCache& rope = m.rope(s, row_shard(cp, layout.s).row0);  // one per shape, on the device
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) {
    LayerSaved& sv = f.layers[L];
    sv.attn.rope = rope;
    take_layer_views(act, c, L, rows, compute, sv);
    if (c.layer_modes[L] == LayerMode::dsa_sparse && c.indexer_shared(L))  // IndexShare: same rows, same keys
      sv.attn.topk = f.layers[c.indexer_source(L)].attn.topk;
    decoder_layer_forward(decoder_layer(m, L, nullptr), h, layout, sv, cp, drop_core);
    h = sv.out;
  }
  f.h_final = h;
  f.n_final = act.next({N, hid});
  f.rstd_final = act.next({N});
  act.finish();
  rmsnorm_fwd(h, m.w.norm, eps, f.n_final, f.rstd_final);
  if (logits) {
    f.logits = Tensor::empty({N, V}, DType::f32, m.device());
    linear_fwd(f.n_final, m.wc.lm_head, f.logits);
  }
  return f;
}

}  // namespace

Tensor model_logits(const Model& m, const Batch& batch, std::vector<Tensor>* topk, Comm& cp,
                    std::vector<Tensor>* experts) {
  check_forward_memory(m, batch, cp, false);
  const DeviceBatch in = device_batch(m, batch, cp, 0, 0);
  if (m.cfg.is_v4()) return v4_logits(m, in, topk, experts, cp).view({batch.input_ids.size(0), -1, m.cfg.vocab_size});
  Forward f = forward(m, in, cp, false, true);
  if (topk) {
    topk->clear();
    for (const LayerSaved& l : f.layers) topk->push_back(l.attn.topk);
  }
  if (experts) {
    experts->clear();
    for (int64_t L = 0; L < m.cfg.num_hidden_layers; ++L) {
      const Tensor e = decoder_layer(m, L, nullptr).mlp->chosen_experts(f.layers[L].mlp);
      experts->push_back(e.defined() ? e.clone() : e);  // out of the activation arena
    }
  }
  return f.logits.view({batch.input_ids.size(0), -1, m.cfg.vocab_size});
}

double model_lm_loss(const Model& m, const Batch& batch, Comm& cp) {
  check_forward_memory(m, batch, cp, false);
  const DeviceBatch in = device_batch(m, batch, cp, 0, 0);
  if (m.cfg.is_v4()) return v4_lm_loss(m, in, cp);
  Forward f = forward(m, in, cp);
  const Tensor acc = Tensor::zeros({1}, DType::f64, m.device());
  lm_head_loss(m, m.wc.lm_head, f.n_final, in.target, in.keep, Tensor(), Tensor(), acc);
  return acc.to_vector<double>()[0];
}

std::vector<int64_t> moe_layers(const ModelConfig& c) {
  std::vector<int64_t> v;
  for (int64_t L = 0; L < c.num_hidden_layers; ++L)
    if (c.is_moe_layer(L)) v.push_back(L);
  return v;
}

std::string moe_bias_name(const ModelConfig& c, int64_t L) {
  if (!c.is_v4()) return layer_prefix(L) + "mlp.gate.e_score_correction_bias";
  return c.v4.hash.at(size_t(L)) ? std::string() : layer_prefix(L) + "ffn.gate.bias";
}

bool is_router_bias(const std::string& name) {
  return name.ends_with(".e_score_correction_bias") || name.ends_with(".ffn.gate.bias");
}

namespace {

// StepOptions' load counting and, when the balance loss is on, each MoE layer's inputs to it (its
// rows' counts summed over the CP group), set on the layers' MLPs by the backward loop.
std::vector<MoeAuxInputs> count_expert_load(const Model& m, const StepOptions& opt, const Forward& f,
                                            const DeviceBatch& in, Comm& cp) {
  const ModelConfig& c = m.cfg;
  const std::vector<int64_t> moe = moe_layers(c);
  const bool aux = opt.moe_aux_coeff > 0 && opt.backbone && !moe.empty();
  if (moe.empty() || (!opt.expert_load.defined() && !aux)) return {};
  const int64_t b = in.ids.size(0), N = in.ids.numel(), E = c.moe.n_routed_experts, k = c.moe.num_experts_per_tok;
  const Tensor mask = in.row_weight.view({N});  // > 0 exactly on the loss rows (DESIGN.md section 3)
  Tensor counts = aux ? Tensor::empty({int64_t(moe.size()), b, E}, DType::f64, m.device()) : Tensor();
  for (size_t j = 0; j < moe.size(); ++j) {
    const int64_t L = moe[j], jj = int64_t(j);
    const Tensor idx = make_mlp(c, L, m.wc.layers[L])->chosen_experts(f.layers[L].mlp);
    if (opt.expert_load.defined()) moe_expert_load(idx, mask, 1, true, opt.expert_load.slice(0, jj, jj + 1));
    if (aux) moe_expert_load(idx, mask, b, false, counts.select(0, jj));
  }
  if (!aux) return {};
  if (cp.size() > 1) {  // whole rows' counts; Comm's f64 all-reduce is a host one (a device's counts go round)
    std::vector<double> h = counts.to_vector<double>();
    cp.allreduce_sum(h.data(), int64_t(h.size()));
    counts.copy_from(Tensor::from_vector<double>(counts.shape(), h));
  }
  std::vector<MoeAuxInputs> in_aux(size_t(c.num_hidden_layers));
  const double scale = opt.moe_aux_coeff * double(E) / (double(k) * double(std::max<int64_t>(opt.aux_sequences, 1)));
  for (size_t j = 0; j < moe.size(); ++j) {
    const int64_t jj = int64_t(j);
    in_aux[size_t(moe[j])] = {counts.select(0, jj), mask, opt.aux_loss.slice(0, jj, jj + 1), scale};
  }
  return in_aux;
}

}  // namespace

StepStats model_step(const Model& m, const Batch& batch, const StepOptions& opt, io::TensorMap& grads, Comm& cp) {
  const ModelConfig& c = m.cfg;
  check_forward_memory(m, batch, cp, true);
  const DeviceBatch in = device_batch(m, batch, cp, opt.lm_targets, opt.valid_rows);
  if (c.is_v4()) return v4_step(m, in, opt, grads, cp);
  Forward f = forward(m, in, cp, opt.recompute_attention);
  const std::vector<MoeAuxInputs> aux = count_expert_load(m, opt, f, in, cp);
  const int64_t b = in.ids.size(0), s = in.ids.size(1), N = b * s, hid = c.hidden_size;
  StepStats st;
  st.tokens = N;
  const ModelTensors gw = model_tensors(grads, c.num_hidden_layers, c.tie_word_embeddings);
  auto tmp = [&m](const Shape& sh) { return Tensor::empty(sh, DType::f32, m.device()); };

  // The micro-batch's LM loss and KL sum from 0 in device slots (hmla/ops/optim.h), each in the
  // order the host sums had, then go into the step's slots, or are read back once without them.
  const Tensor stats = opt.stats.defined() ? opt.stats : Tensor::zeros({kStatCount}, DType::f64, m.device());
  stats.slice(0, kStatMbLm, kStatMbKlCsa + 1).fill_zero();
  auto slot = [&stats](StatSlot k) { return stats.slice(0, k, k + 1); };

  // Head (with the LM loss, chunk by chunk) and final norm.
  Tensor dn = opt.backbone ? tmp({N, hid}) : Tensor(), dh;
  lm_head_loss(m, m.wc.lm_head, f.n_final, in.target, in.keep, gw.lm_head, dn, slot(kStatMbLm));
  if (opt.backbone) {
    dh = tmp({b, s, hid});
    rmsnorm_bwd(dn, f.h_final, m.w.norm, f.rstd_final, dh, gw.norm);
  }

  int dsa_layers = 0;
  for (int64_t L = c.num_hidden_layers - 1; L >= 0; --L) {
    MlaBackwardOptions mo;
    mo.backbone = opt.backbone;
    if (c.runs_indexer(L)) mo.row_weight = in.row_weight, mo.kl_acc = slot(kStatMbKl);
    DecoderLayer dl = decoder_layer(m, L, &gw.layers[L]);
    if (!aux.empty()) dl.mlp->aux = aux[size_t(L)];  // the balance loss (undefined counts on dense layers)
    const LayerBackward r =
        decoder_layer_backward(dl, dh, in.layout, f.layers[L], mo, gw.layers[L], opt.recompute_attention, cp);
    if (opt.backbone) dh = r.dh_in;
    if (c.runs_indexer(L)) ++dsa_layers;  // its KL went into the kStatMbKl slot (shared layers have none)
  }
  if (opt.backbone) embedding_bwd(in.ids, dh, gw.embed_tokens);  // rows in token order
  if (opt.stats.defined()) {
    stats_add(stats, kStatLm, kStatMbLm, 1);  // x / 1 is x: the host's sum += lm
    if (dsa_layers > 0) stats_add(stats, kStatKl, kStatMbKl, dsa_layers);
    st.lm_loss = st.indexer_kl = std::numeric_limits<double>::quiet_NaN();  // on the device only
  } else {
    const std::vector<double> h = stats.to_vector<double>();
    st.lm_loss = h[kStatMbLm];
    if (dsa_layers > 0) st.indexer_kl = h[kStatMbKl] / dsa_layers;
  }
  return st;
}

}  // namespace hmla
