// Whole-model forward/backward, on ops: the embedding, the decoder layers (decoder_layer.h: each a
// forward/backward pair whose saved state is LayerSaved), the final norm and the LM head. The
// backward runs the layers in reverse and every op adds its weight gradient straight into the
// gradient arena (hmla/ops/nn.h), in a fixed order.
#include "hmla/model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>

#include "hmla/dist/cp.h"
#include "hmla/model/decoder_layer.h"
#include "hmla/model/indexer.h"
#include "hmla/ops/backend.h"
#include "hmla/ops/moe.h"
#include "hmla/ops/nn.h"
#include "hmla/ops/optim.h"
#include "model_internal.h"

namespace hmla {

namespace {

// One micro-batch as the step's kernels read it, on the model's device: this rank's token ids, the
// LM targets and their weights, the indexer's loss-row weights, and the layout's device form. Built
// on the host as one buffer of 4-byte words and uploaded in one copy (issue 27: one upload per
// micro-batch; no op uploads a layout of its own); on the CPU the views are that buffer itself.
struct DeviceBatch {
  Tensor ids;         // [b, s] i32, this rank's rows
  Tensor target;      // [N] i32, N = b * s
  Tensor keep;        // [N] f32, the LM loss's row weights (already over the step's target count)
  Tensor row_weight;  // [b, s] f32, the indexer KL's loss-row weights of this rank's rows
  DocLayout layout;   // the whole batch's layout ([b, S]) with its device form
};

struct Forward {
  std::vector<LayerSaved> layers;  // their fields are views of the activation arena
  Tensor h_final, rstd_final, n_final;  // before/after model.norm
  Tensor logits;                        // [N, V], only when asked for (model_logits)
};

// Targets and weights of the LM loss: row n predicts ids[n + 1] when both are in one document.
// Over the whole batch; shard_targets keeps a context-parallel rank's rows.
void lm_targets(const Batch& batch, int64_t pad, std::vector<int32_t>& target, std::vector<float>& keep) {
  const int64_t b = batch.input_ids.size(0), s = batch.input_ids.size(1);
  const int32_t* ids = batch.input_ids.data<int32_t>();
  const int32_t* de = batch.layout.doc_end.data<int32_t>();
  target.assign(b * s, 0);
  keep.assign(b * s, 0.f);
  for (int64_t r = 0; r < b; ++r)
    for (int64_t t = 0; t + 1 < s; ++t) {
      const int64_t n = r * s + t;
      if (batch.layout.is_padding(r, t) || t + 1 >= de[n] || ids[n + 1] == pad) continue;
      target[n] = ids[n + 1];
      keep[n] = 1.f;
    }
}

// The LM loss's targets and weights (already divided by the step's target count) of this rank's
// rows.
void shard_targets(const Batch& batch, int64_t pad, int64_t global_targets, const Comm& cp, std::vector<int32_t>& target,
                   std::vector<float>& keep) {
  lm_targets(batch, pad, target, keep);
  int64_t count = 0;
  for (float k : keep) count += k > 0.f;
  const int64_t denom = global_targets > 0 ? global_targets : std::max<int64_t>(count, 1);
  for (float& k : keep) k /= float(denom);
  const int64_t b = batch.input_ids.size(0);
  const RowShard sh = row_shard(cp, batch.input_ids.size(1));
  std::vector<int32_t> t;
  std::vector<float> k;
  for (int64_t r = 0; r < b; ++r)
    for (int64_t i = sh.row0; i < sh.row0 + sh.rows; ++i) {
      t.push_back(target[r * sh.s + i]);
      k.push_back(keep[r * sh.s + i]);
    }
  target.swap(t);
  keep.swap(k);
}

// Token ids are checked where they enter the model, on the host, so that a device's embedding
// never reads a row outside the table and no kernel's ids are copied back to be checked.
void check_token_ids(const Batch& batch, int64_t V) {
  const int32_t* id = batch.input_ids.data<int32_t>();
  for (int64_t n = 0; n < batch.input_ids.numel(); ++n)
    HMLA_CHECK(id[n] >= 0 && id[n] < V, ShapeError, "token id ", id[n], " at position ", n,
               " is outside the vocabulary [0, ", V, ")");
}

// The micro-batch on the model's device (DeviceBatch); `lm_targets` and `valid_rows` are the
// step's global counts (0: this batch's own).
DeviceBatch device_batch(const Model& m, const Batch& batch, const Comm& cp, int64_t lm_targets, int64_t valid_rows) {
  const ModelConfig& c = m.cfg;
  check_token_ids(batch, c.vocab_size);
  const int64_t b = batch.input_ids.size(0), S = batch.input_ids.size(1);
  const RowShard sh = row_shard(cp, S);
  const int64_t N = b * sh.rows, BS = b * S;
  std::vector<int32_t> target;
  std::vector<float> keep;
  shard_targets(batch, c.pad_token_id, lm_targets, cp, target, keep);
  const Tensor ids = take_rows(batch.input_ids.view({b, S, 1}), sh);
  const Tensor rw = take_rows(loss_row_weights(batch.layout, &batch.input_ids, c.pad_token_id, valid_rows).view({b, S, 1}), sh);
  // Words: ids, target, keep, row_weight (N each), then doc_start, doc_end (b * S each).
  const Tensor host = Tensor::empty({4 * N + 2 * BS}, DType::i32);
  char* w = static_cast<char*>(host.raw_data());
  for (auto [src, n] : {std::pair<const void*, int64_t>{ids.data<int32_t>(), N}, {target.data(), N}, {keep.data(), N},
                        {rw.data<float>(), N}, {batch.layout.doc_start.data<int32_t>(), BS},
                        {batch.layout.doc_end.data<int32_t>(), BS}}) {
    std::memcpy(w, src, size_t(n) * 4);
    w += n * 4;
  }
  const Tensor all = host.on(m.device());
  int64_t off = 0;
  auto words = [&](int64_t n) {
    off += n;
    return all.slice(0, off - n, off);
  };
  DeviceBatch d;
  d.ids = words(N).view({b, sh.rows});
  d.target = words(N);
  d.keep = words(N).bitcast(DType::f32);
  d.row_weight = words(N).bitcast(DType::f32).view({b, sh.rows});
  d.layout = batch.layout;
  d.layout.device_start = words(BS).view({b, S});
  d.layout.device_end = words(BS).view({b, S});
  return d;
}

// The LM loss over rows n_final [N, hidden] (sum of keep-weighted cross-entropies, rows in order)
// added into the device scalar acc; with dn defined, the head's weight gradient is added into gW
// and the rows' gradient written into dn [N, hidden].
void lm_head_loss(const Model& m, const Tensor& n_final, const Tensor& target, const Tensor& keep, const Tensor& gW,
                  const Tensor& dn, const Tensor& acc) {
  const int64_t N = n_final.size(0), V = m.cfg.vocab_size, rows = std::max<int64_t>(1, std::min(N, head_chunk_rows(V)));
  const Tensor logits = Tensor::empty({rows, V}, DType::f32, m.device());
  const Tensor dl = dn.defined() ? Tensor::empty({rows, V}, DType::f32, m.device()) : Tensor();
  for (int64_t r0 = 0; r0 < N; r0 += rows) {
    const int64_t r1 = std::min(N, r0 + rows);
    const Tensor nc = n_final.slice(0, r0, r1), lg = logits.slice(0, 0, r1 - r0);
    const Tensor d = dl.defined() ? dl.slice(0, 0, r1 - r0) : Tensor();
    linear_fwd(nc, m.wc.lm_head, lg);
    cross_entropy_into(lg, target.slice(0, r0, r1), keep.slice(0, r0, r1), d, acc);
    if (d.defined()) linear_bwd(d, nc, m.wc.lm_head, gW, dn.slice(0, r0, r1));
  }
}

// Before a forward allocates anything: does it fit, next to the parameters (and, training,
// their gradients and the optimizer's moments)?
void check_forward_memory(const Model& m, const Batch& batch, const Comm& cp, bool training) {
  const int64_t b = batch.input_ids.size(0), s = row_shard(cp, batch.input_ids.size(1)).rows;
  MemoryPlan plan;
  const DType compute = compute_dtype(m.device());
  plan_parameters(plan, m.cfg, m.has_indexer, training, compute);
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

// Model::wc: the matrices from a compute copy of the arena where the compute dtype is not f32.
ModelTensors compute_tensors(Model& m) {
  const DType dt = compute_dtype(m.device());
  if (dt == DType::f32) return m.w;
  m.compute_arena = Tensor::empty({m.arena.numel()}, dt, m.device());
  const io::TensorMap copy = arena_views(m.table, m.compute_arena);
  io::TensorMap views = copy;
  for (auto& [name, t] : views)
    if (t.dim() < 2 || name == "model.embed_tokens.weight" || name.ends_with(".mlp.gate.weight"))
      t = m.params.at(name);  // read as f32 (the MoE router's gate too: its logits are f32)
  ModelTensors wc = model_tensors(views, m.cfg.num_hidden_layers, m.cfg.tie_word_embeddings);
  if (m.cfg.tie_word_embeddings) wc.lm_head = copy.at("model.embed_tokens.weight");  // a product reads it
  return wc;
}

}  // namespace

const RopeCache& Model::rope(int64_t s, int64_t pos0) const {
  auto it = rope_.find({s, pos0});
  if (it == rope_.end()) {
    const RopeCache h = rope_cache(cfg, s, pos0);
    it = rope_.emplace(std::pair{s, pos0}, RopeCache{h.cos.on(device()), h.sin.on(device())}).first;
  }
  return it->second;
}

Model build_model(const ModelConfig& c, const std::vector<bool>& has_indexer, Device device) {
  bool dense_mlp = false;
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) dense_mlp |= !c.is_moe_layer(L);
  HMLA_CHECK(c.vocab_size > 0 && (c.intermediate_size > 0 || !dense_mlp), ConfigError,
             "a model needs vocab_size and intermediate_size (>= 1; intermediate_size sizes the dense MLPs)");
  HMLA_CHECK(static_cast<int64_t>(has_indexer.size()) == c.num_hidden_layers, ConfigError,
             "has_indexer needs one entry per layer");
  std::vector<bool> own(has_indexer.size());  // shared layers (IndexShare) have none
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) {
    own[L] = own_indexer(c, has_indexer, L);
    HMLA_CHECK(!c.runs_indexer(L) || own[L], ConfigError, "layer ", L, " runs ",
               mode_name(c.layer_modes[L]), " without an indexer");
  }
  MemoryPlan plan;
  plan_parameters(plan, c, own, false, compute_dtype(device));
  plan.check("the model", device);
  Model m;
  m.cfg = c;
  m.has_indexer = own;
  m.table = model_param_table(c, own);
  m.arena = Tensor::zeros({table_numel(m.table)}, DType::f32, device);
  m.params = arena_views(m.table, m.arena);
  m.w = model_tensors(m.params, c.num_hidden_layers, c.tie_word_embeddings);
  m.wc = compute_tensors(m);
  return m;
}

void refresh_compute_weights(Model& m) {
  if (m.compute_arena.defined()) convert(m.arena, m.compute_arena);  // one launch for every weight
}

void init_model(Model& m, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, static_cast<float>(m.cfg.initializer_range));
  const Tensor host = Tensor::empty({m.arena.numel()}, DType::f32);  // drawn on the host, then copied
  float* v = host.data<float>();
  for (const ParamSpec& p : m.table) {
    const int64_t n = shape_numel(p.shape);
    const bool ones = p.name.find("norm.weight") != std::string::npos || p.name.find("layernorm") != std::string::npos;
    const bool zeros = p.name.find(".bias") != std::string::npos || p.name.find("softmax_offset") != std::string::npos ||
                       p.name.ends_with(".e_score_correction_bias");
    for (int64_t i = 0; i < n; ++i) v[i] = ones ? 1.f : zeros ? 0.f : nd(rng);
    v += n;
  }
  m.arena.copy_from(host);
  refresh_compute_weights(m);
}

namespace {

// README: a tensor a command would ignore is an error. A checkpoint with more layers than the
// config, a sink or an indexer the config does not run, is refused before anything is copied.
void check_no_unexpected(const Model& m, const io::TensorMap& tensors, const std::string& what) {
  const std::vector<std::string> extra = unexpected_tensors(m.table, tensors);
  if (extra.empty()) return;
  for (int64_t L = 0; L < m.cfg.num_hidden_layers; ++L) {  // IndexShare: a shared layer has no indexer
    const std::string pre = layer_prefix(L) + "self_attn.indexer.";
    for (const std::string& n : extra)
      HMLA_CHECK(!m.cfg.indexer_shared(L) || n.compare(0, pre.size(), pre) != 0, IoError, what, ": tensor '", n,
                 "': layer ", L, " is 'shared' in indexer_types (it reuses layer ", m.cfg.indexer_source(L),
                 "'s top-k) and has no indexer; remove the tensor or make the layer full");
  }
  std::string names;
  for (size_t i = 0; i < std::min<size_t>(extra.size(), 3); ++i) names += (i ? ", '" : "'") + extra[i] + "'";
  if (extra.size() > 3) names += " and " + std::to_string(extra.size() - 3) + " more";
  throw IoError(what + ": " + std::to_string(extra.size()) + " tensor" + (extra.size() > 1 ? "s" : "") +
                " the config's model does not have (" + names + "); an ignored tensor is an error: check that the "
                "config (num_hidden_layers = " + std::to_string(m.cfg.num_hidden_layers) +
                ", num_nextn_predict_layers = " + std::to_string(m.cfg.form.num_nextn_predict_layers) + ", attention_sink, tie_word_embeddings, the layer modes) matches the checkpoint");
}

}  // namespace

void load_into_model(Model& m, const io::TensorMap& tensors, const std::string& what,
                     const std::vector<std::string>& may_be_missing) {
  check_no_unexpected(m, tensors, what);
  for (const ParamSpec& p : m.table) {
    auto it = tensors.find(p.name);
    if (it == tensors.end()) {
      bool ok = false;
      for (const auto& n : may_be_missing) ok |= n == p.name;
      HMLA_CHECK(ok, IoError, what, ": tensor '", p.name, "' is missing");
      continue;
    }
    const Tensor& t = it->second;
    HMLA_CHECK(t.shape() == p.shape, IoError, what, ": tensor '", p.name, "' is ", shape_str(t.shape()),
               ", the config needs ", shape_str(p.shape));
    Tensor dst = Tensor::empty(p.shape, DType::f32);  // on the host, checked, then into the arena
    if (t.dtype() == DType::f32) {
      dst.copy_from(t);
    } else {
      HMLA_CHECK(t.dtype() == DType::bf16, IoError, what, ": tensor '", p.name, "' is ", dtype_name(t.dtype()),
                 "; weights must be f32 or bf16");
      const bf16* src = t.data<bf16>();
      for (int64_t i = 0; i < t.numel(); ++i) dst.data<float>()[i] = bf16_to_f32(src[i]);
    }
    check_finite_weight(dst, what, p.name);
    m.params.at(p.name).copy_from(dst);
  }
  refresh_compute_weights(m);
}

void load_checkpoint_into_model(Model& m, CheckpointTensors ck, const std::string& what) {
  int64_t bytes = 0;
  for (const auto& [name, t] : ck.kept) bytes += int64_t(t.bytes.size());
  MemoryPlan plan;
  plan.add_bytes("the multi-token-prediction layers, kept as read", bytes,
                 std::to_string(ck.kept.size()) + " tensors of num_nextn_predict_layers = " +
                     std::to_string(m.cfg.form.num_nextn_predict_layers));
  plan.check(what + ": the tensors hmla carries");
  load_into_model(m, ck.tensors, what);
  m.kept = std::move(ck.kept);
}

int64_t count_lm_targets(const Batch& batch, int64_t pad) {
  std::vector<int32_t> target;
  std::vector<float> keep;
  lm_targets(batch, pad, target, keep);
  int64_t n = 0;
  for (float k : keep) n += k > 0.f;
  return n;
}

Tensor model_logits(const Model& m, const Batch& batch, std::vector<Tensor>* topk, Comm& cp,
                    std::vector<Tensor>* experts) {
  check_forward_memory(m, batch, cp, false);
  const DeviceBatch in = device_batch(m, batch, cp, 0, 0);
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
  Forward f = forward(m, in, cp);
  const Tensor acc = Tensor::zeros({1}, DType::f64, m.device());
  lm_head_loss(m, f.n_final, in.target, in.keep, Tensor(), Tensor(), acc);
  return acc.to_vector<double>()[0];
}

std::vector<int64_t> moe_layers(const ModelConfig& c) {
  std::vector<int64_t> v;
  for (int64_t L = 0; L < c.num_hidden_layers; ++L)
    if (c.is_moe_layer(L)) v.push_back(L);
  return v;
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
  stats.slice(0, kStatMbLm, kStatMbKl + 1).fill_zero();
  auto slot = [&stats](StatSlot k) { return stats.slice(0, k, k + 1); };

  // Head (with the LM loss, chunk by chunk) and final norm.
  Tensor dn = opt.backbone ? tmp({N, hid}) : Tensor(), dh;
  lm_head_loss(m, f.n_final, in.target, in.keep, gw.lm_head, dn, slot(kStatMbLm));
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
