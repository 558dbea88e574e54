// MLA layer forward/backward, on ops. Rows are N = b * s, all activations contiguous.
// Letters: H heads, Dn/Dr nope/rope widths (Dqk = Dn + Dr), Dv value width, Rq/Rkv LoRA ranks.
// The mqa path absorbs W_kb into q and de-absorbs W_vb after attention; docs/mla_layer.md has
// the derivation of its backward.
#include "hmla/model/mla_layer.h"

#include "hmla/model/indexer.h"
#include "model_internal.h"

#include "hmla/dist/cp.h"
#include "hmla/ops/backend.h"
#include "hmla/ops/nn.h"
#include "hmla/ops/sparse_attention.h"

namespace hmla {

namespace {

// s and N = b * s count this rank's query rows; S and NS = b * S the key rows (all of them:
// under context parallelism the query rows are the shard [row0, row0 + s) of S).
struct Dims {
  int64_t b, s, N, hid, H, Dn, Dr, Dv, Dqk, Rq, Rkv;
  int64_t S, NS, row0;
  Device dev;  // where the layer runs: its input's device
};

Dims dims(const ModelConfig& c, const Tensor& x, const DocLayout& layout, const Comm& cp) {
  const RowShard sh = row_shard(cp, layout.s);
  HMLA_CHECK(x.dim() == 3 && x.size(0) == layout.b && x.size(1) == sh.rows, ShapeError, "mla layer: hidden_states ",
             shape_str(x.shape()), " do not match the layout's b = ", layout.b, " and this rank's ", sh.rows, " of ",
             layout.s, " rows");
  return {x.size(0), x.size(1), x.size(0) * x.size(1), c.hidden_size, c.num_attention_heads,
          c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.qk_head_dim(), c.q_lora_rank,
          c.kv_lora_rank, layout.s, x.size(0) * layout.s, sh.row0, x.device()};
}


// Precision (DESIGN.md section 4): what the layer keeps between ops is in its device's compute
// dtype (act: f32 on the CPU, bf16 on CUDA); statistics (rstd) and every gradient are f32.
Tensor f32(Device dev, const Shape& s) { return Tensor::empty(s, DType::f32, dev); }
Tensor act(Device dev, const Shape& s) { return Tensor::empty(s, compute_dtype(dev), dev); }

// The attention kernels read their backend's compute dtype: the layer's activations already are
// in it (no copy); a gradient (f32) becomes a compute copy (on the CPU: itself). Their gradients
// come back in it and are read as f32.
Tensor core_in(const Tensor& t) { return compute_operand(t); }
Tensor f32_of(const Tensor& t) { return converted(t, DType::f32); }

// Per-head absorption matrices as [H, rows, cols] views. W_kb_h is [Dn, Rkv] (the k half of
// kv_b_proj's head h), stored as such in kv_b_proj and transposed in k_b_proj [H, Rkv, Dn]; W_vb_h
// is [Dv, Rkv] in both forms. `w` holds the weights or their gradients (same names and shapes).
struct HeadMats {
  Tensor m;
  bool transposed;  // m holds the matrices' transposes
};

HeadMats w_kb(const AttnTensors& w, const Dims& d, bool split) {
  if (split) return {w.k_b_proj, true};
  return {w.kv_b_proj.view({d.H, d.Dn + d.Dv, d.Rkv}).slice(1, 0, d.Dn), false};
}

HeadMats w_vb(const AttnTensors& w, const Dims& d, bool split) {
  if (split) return {w.v_b_proj, false};
  return {w.kv_b_proj.view({d.H, d.Dn + d.Dv, d.Rkv}).slice(1, d.Dn, d.Dn + d.Dv), false};
}

Trans op(bool transposed) { return transposed ? Trans::yes : Trans::no; }

// Channels [c0, c1) of every head of t [N, H, width] as [H, N, c1 - c0] (one matrix per head).
Tensor per_head(const Tensor& t, int64_t c0, int64_t c1) { return t.slice(2, c0, c1).transpose(0, 1); }

// A gathered tensor into its slot: the arena's view when the caller set one (a copy), else itself.
void gather_into(Tensor& slot, const Tensor& gathered) {
  if (slot.defined()) saved_slot(slot, gathered.shape(), gathered.dtype(), gathered.device()).copy_from(gathered);
  else slot = gathered;
}

// The rope channels [c0, c0 + Dr) of t [N, heads, width] as the [b, s, heads, Dr] view rope takes.
void rope_rows(const Tensor& t, const Dims& d, int64_t c0, const RopeCache& rc, bool transpose) {
  rope(t.view({d.b, d.s, t.size(1), t.size(2)}).slice(3, c0, c0 + d.Dr), rc.cos, rc.sin, RopeLayout::interleaved,
       transpose);
}

AttnDenseInputs core_inputs(const MlaLayer& L, const AttnTensors& w, const MlaSaved& sv, const Dims& d,
                            const DocLayout& layout) {
  AttnDenseInputs in;
  in.layout = &layout;
  in.scale = static_cast<float>(softmax_scale(*L.cfg));
  in.q_row0 = d.row0;
  in.backend = L.attn_backend;
  if (L.cfg->attention_sink) in.sink = w.softmax_offset;
  if (L.latent()) {
    in.q = core_in(sv.qabs.view({d.b, d.s, d.H, d.Rkv + d.Dr}));
    in.k = core_in(sv.ka.view({d.b, d.S, 1, d.Rkv + d.Dr}));
    in.v = in.k.slice(3, 0, d.Rkv);  // the value is the latent: the key's first Rkv channels
  } else {
    in.q = core_in(sv.q.view({d.b, d.s, d.H, d.Dqk}));
    in.k = core_in(sv.k.view({d.b, d.S, d.H, d.Dqk}));
    in.v = core_in(sv.v.view({d.b, d.S, d.H, d.Dn + d.Dv}).slice(3, d.Dn, d.Dn + d.Dv));
  }
  return in;
}

AttnSparseInputs sparse_inputs(const MlaLayer& L, const AttnTensors& w, const MlaSaved& sv, const Dims& d) {
  AttnSparseInputs in;
  in.q = core_in(sv.qabs.view({d.b, d.s, d.H, d.Rkv + d.Dr}));
  in.kv = core_in(sv.ka.view({d.b, d.S, d.Rkv + d.Dr}));
  in.Dv = d.Rkv;
  in.idx = sv.topk;
  in.idx_origin = TableOrigin::own;  // indexer_topk's, unchanged
  in.K = L.cfg->index_topk;
  if (L.cfg->attention_sink) in.sink = w.softmax_offset;
  in.scale = static_cast<float>(softmax_scale(*L.cfg));
  return in;
}

// The attention core: dense MHA, dense latent MQA, or sparse latent MQA over the selection.
// Its outputs go where the slots say (the activation arena's views), else into new tensors.
void run_core(const MlaLayer& L, const AttnTensors& w, MlaSaved& sv, const Dims& d, const DocLayout& layout) {
  const int64_t Dv = L.latent() ? d.Rkv : d.Dv;
  saved_slot(sv.att.out, {d.b, d.s, d.H, Dv}, compute_dtype(d.dev), d.dev);
  saved_slot(sv.att.lse, {d.b, d.H, d.s}, DType::f32, d.dev);
  if (L.mode() == LayerMode::dsa_sparse) {  // over S(t) and the window
    const AttnSparseInputs in = sparse_inputs(L, w, sv, d);
    if (in.K > 0) saved_slot(sv.lse_c, {d.b, d.H, d.s}, DType::f32, d.dev);
    attn_sparse_fwd(in, AttnSparseSaved{sv.att.out, sv.att.lse, sv.lse_c});
  } else {
    attn_dense_fwd(core_inputs(L, w, sv, d, layout), sv.att);
  }
}

}  // namespace

std::vector<MlaField> mla_fields(const ModelConfig& c, int64_t L, int64_t b, int64_t s, int64_t S, DType compute,
                                 bool recompute) {
  const int64_t N = b * s, NS = b * S, H = c.num_attention_heads, Dn = c.qk_nope_head_dim, Dr = c.qk_rope_head_dim;
  const int64_t Dqk = c.qk_head_dim(), Dv = c.v_head_dim, Rq = c.q_lora_rank, Rkv = c.kv_lora_rank, Wa = Rkv + Dr;
  const int64_t HI = c.index_n_heads, DI = c.index_head_dim;
  const DType f = DType::f32;
  const bool latent = latent_mqa_enabled(c, L), sparse = c.layer_modes.at(size_t(L)) == LayerMode::dsa_sparse;
  std::vector<MlaField> t{{"q", {N, H, Dqk}, compute, false, [](MlaSaved& v) -> Tensor& { return v.q; }}};
  if (Rq > 0) {
    t.push_back({"qa", {N, Rq}, compute, false, [](MlaSaved& v) -> Tensor& { return v.qa; }});
    t.push_back({"rstd_q", {N}, f, false, [](MlaSaved& v) -> Tensor& { return v.rstd_q; }});
    t.push_back({"cq", {N, Rq}, compute, false, [](MlaSaved& v) -> Tensor& { return v.cq; }});
  }
  t.push_back({"kva", {N, Wa}, compute, false, [](MlaSaved& v) -> Tensor& { return v.kva; }});
  t.push_back({"rstd_kv", {N}, f, false, [](MlaSaved& v) -> Tensor& { return v.rstd_kv; }});
  t.push_back({"ka", {NS, 1, Wa}, compute, false, [](MlaSaved& v) -> Tensor& { return v.ka; }});
  if (c.runs_indexer(L)) {
    t.push_back({"indexer.qI", {b, s, HI, DI}, compute, false, [](MlaSaved& v) -> Tensor& { return v.ind.sc.qI; }});
    t.push_back({"indexer.kpre", {N, DI}, compute, false, [](MlaSaved& v) -> Tensor& { return v.ind.kpre; }});
    t.push_back({"indexer.k_mean", {N}, f, false, [](MlaSaved& v) -> Tensor& { return v.ind.k_mean; }});
    t.push_back({"indexer.k_rstd", {N}, f, false, [](MlaSaved& v) -> Tensor& { return v.ind.k_rstd; }});
    t.push_back({"indexer.kI", {b, S, DI}, compute, false, [](MlaSaved& v) -> Tensor& { return v.ind.sc.kI; }});
    t.push_back({"indexer.w", {b, s, HI}, f, false, [](MlaSaved& v) -> Tensor& { return v.ind.sc.w; }});
    t.push_back({"topk", {b, s, c.index_topk + c.index_window}, DType::i32, false,
                 [](MlaSaved& v) -> Tensor& { return v.topk; }});
  }
  if (latent) {
    t.push_back({"qabs", {N, H, Wa}, compute, false, [](MlaSaved& v) -> Tensor& { return v.qabs; }});
  } else {
    t.push_back({"v", {NS, H * (Dn + Dv)}, compute, false, [](MlaSaved& v) -> Tensor& { return v.v; }});
    t.push_back({"k", {NS, H, Dqk}, compute, false, [](MlaSaved& v) -> Tensor& { return v.k; }});
  }
  if (!recompute) {
    t.push_back({"core.out", {b, s, H, latent ? Rkv : Dv}, compute, true, [](MlaSaved& v) -> Tensor& { return v.att.out; }});
    t.push_back({"core.lse", {b, H, s}, f, true, [](MlaSaved& v) -> Tensor& { return v.att.lse; }});
    if (sparse && c.index_topk > 0)
      t.push_back({"core.lse_c", {b, H, s}, f, true, [](MlaSaved& v) -> Tensor& { return v.lse_c; }});
  }
  if (latent) t.push_back({"o", {N, H, Dv}, compute, false, [](MlaSaved& v) -> Tensor& { return v.o; }});
  return t;
}

void mla_memory_plan(MemoryPlan& plan, const ModelConfig& c, LayerMode mode, const SizeFactor& layers,
                     const SizeFactor& rows, const SizeFactor& s, DType compute, bool indexer) {
  const std::string in = std::string(" of the ") + mode_name(mode) + " layers (" + dtype_name(compute) + ")";
  const SizeFactor H{"num_attention_heads", c.num_attention_heads};
  const int64_t f = int64_t(dtype_size(compute));  // every saved activation here is kept in it

  plan.add("the queries" + in, {layers, rows, s, H, {"qk_nope_head_dim + qk_rope_head_dim", c.qk_head_dim()}}, f);
  ModelConfig one = c;  // latent_mqa_enabled decides per layer: ask it about one layer in `mode`
  one.num_hidden_layers = 1;
  one.layer_modes = {mode};
  if (latent_mqa_enabled(one, 0))
    plan.add("the absorbed queries" + in, {layers, rows, s, H, {"kv_lora_rank + qk_rope_head_dim", c.kv_lora_rank + c.qk_rope_head_dim}}, f);
  else
    plan.add("the per-head keys and values" + in,
             {layers, rows, s, H, {"2 qk_nope_head_dim + qk_rope_head_dim + v_head_dim",
                                   c.qk_head_dim() + c.qk_nope_head_dim + c.v_head_dim}},
             f);
  if (!is_dsa(mode) || !indexer) return;  // a shared layer reads its source's table
  plan.add("the indexer's queries" + in,
           {layers, rows, s, {"index_n_heads", c.index_n_heads}, {"index_head_dim", c.index_head_dim}}, f);
  plan.add(std::string("the top-k tables of the ") + mode_name(mode) + " layers",
           {layers, rows, s, {"index_topk + index_window", c.index_topk + c.index_window}}, sizeof(int32_t));
}

CpTraffic mla_cp_traffic(const ModelConfig& c, LayerMode mode, int64_t b, int64_t s, int64_t R, bool backbone,
                         bool indexer) {
  if (R == 1) return {};
  const int64_t block = b * (s / R) * int64_t(sizeof(float)) * (R - 1);  // per channel
  const int64_t key = c.kv_lora_rank + c.qk_rope_head_dim, ikey = is_dsa(mode) && indexer ? c.index_head_dim : 0;
  return {block * (key + ikey), block * ((backbone ? key : 0) + ikey)};
}

void mla_drop_core(MlaSaved& sv) {
  // The MHA form's o is a view of the core's output: dropped with it, or the output stays alive
  // (ActivationArena.ThePlanIsTheAllocationToTheByte found it kept).
  if (sv.o.defined() && sv.att.out.defined() && sv.o.shares_storage(sv.att.out)) sv.o = Tensor();
  sv.att = {};
  sv.lse_c = Tensor();
}

void mla_recompute_core(const MlaLayer& L, const Tensor& x, const DocLayout& layout, MlaSaved& sv, const Comm& cp) {
  const Dims d = dims(*L.cfg, x, layout, cp);
  run_core(L, L.w, sv, d, layout);
  if (!L.latent()) sv.o = sv.att.out.view({d.N, d.H, d.Dv});  // as the forward made it
}

Tensor mla_forward(const MlaLayer& L, const Tensor& x, const DocLayout& layout, MlaSaved& sv, Comm& cp) {
  const ModelConfig& cfg = *L.cfg;
  HMLA_CHECK(x.dim() == 3 && x.size(2) == cfg.hidden_size && x.is_contiguous() &&
                 (x.dtype() == DType::f32 || x.dtype() == compute_dtype(x.device())),
             ShapeError, "mla layer: hidden_states must be contiguous [b, s, ", cfg.hidden_size, "] in f32 or ",
             dtype_name(compute_dtype(x.device())), ", got ", dtype_name(x.dtype()), shape_str(x.shape()));
  HMLA_CHECK(!L.split_kv_b_proj || L.latent(), ConfigError, "layer ", L.layer, ": mqa_split_kv_b_proj needs a latent MQA mode, not ",
             mode_name(cfg.layer_modes[L.layer]));
  const Dims d = dims(cfg, x, layout, cp);
  const float eps = static_cast<float>(cfg.rms_norm_eps);
  if (!sv.in_arena)  // a forward of its own: every saved tensor new (a shared layer's given table kept)
    for (const MlaField& f : mla_fields(cfg, L.layer, d.b, d.s, d.S, compute_dtype(d.dev), false)) f.slot(sv) = Tensor();
  if (!sv.rope.cos.defined()) sv.rope = rope_cache(cfg, d.s, d.row0);
  HMLA_CHECK(sv.rope.cos.dim() == 2 && sv.rope.cos.size(0) == d.s, ShapeError, "mla layer: the RoPE tables cover ",
             sv.rope.cos.size(0), " rows, the input ", d.s);
  const RopeCache& rc = sv.rope;
  const Tensor x2 = x.view({d.N, d.hid});
  const AttnTensors& w = L.w;

  // Every saved tensor in its slot: the arena's view the caller set (mla_fields), else a new one.
  const DType cd = compute_dtype(d.dev);
  saved_slot(sv.q, {d.N, d.H, d.Dqk}, cd, d.dev);
  const Tensor q2 = sv.q.view({d.N, d.H * d.Dqk});
  if (d.Rq > 0) {
    saved_slot(sv.qa, {d.N, d.Rq}, cd, d.dev);
    saved_slot(sv.rstd_q, {d.N}, DType::f32, d.dev);
    saved_slot(sv.cq, {d.N, d.Rq}, cd, d.dev);
    linear_fwd(x2, w.q_a_proj, sv.qa);
    rmsnorm_fwd(sv.qa, w.q_a_layernorm, eps, sv.cq, sv.rstd_q);
    linear_fwd(sv.cq, w.q_b_proj, q2);
  } else {
    linear_fwd(x2, w.q_proj, q2);
  }
  rope_rows(sv.q, d, d.Dn, rc, false);

  // The shared key [c ; rope(k_pe)] of this rank's rows, then of every row: under context
  // parallelism this (Rkv + Dr)-wide latent is all that travels for the main attention.
  const int64_t Wa = d.Rkv + d.Dr;
  saved_slot(sv.kva, {d.N, Wa}, cd, d.dev);
  saved_slot(sv.rstd_kv, {d.N}, DType::f32, d.dev);
  // One rank: the key is written into its slot; several: gathered into it from this rank's rows.
  const bool one_rank = cp.size() == 1;
  if (one_rank) saved_slot(sv.ka, {d.NS, 1, Wa}, cd, d.dev);
  const Tensor ka = one_rank ? sv.ka.view({d.b, d.s, Wa}) : act(d.dev, {d.b, d.s, Wa});
  const Tensor ka2 = ka.view({d.N, Wa});
  linear_fwd(x2, w.kv_a_proj_with_mqa, sv.kva);
  rmsnorm_fwd(sv.kva.slice(1, 0, d.Rkv), w.kv_a_layernorm, eps, ka2.slice(1, 0, d.Rkv), sv.rstd_kv);
  ka2.slice(1, d.Rkv, Wa).copy_from(sv.kva.slice(1, d.Rkv, Wa));
  rope_rows(ka.view({d.N, 1, Wa}), d, d.Rkv, rc, false);
  if (!one_rank) gather_into(sv.ka, cp_all_gather_rows(cp, ka).view({d.NS, 1, Wa}));

  if (cfg.runs_indexer(L.layer)) {  // the indexer reads x and cq; the backbone reads only its selection
    indexer_forward(cfg, w.indexer, x, sv.cq, layout, rc, sv.ind, cp);
    indexer_topk(sv.ind.sc, cfg.index_topk, cfg.index_window,
                 saved_slot(sv.topk, {d.b, d.s, cfg.index_topk + cfg.index_window}, DType::i32, d.dev));
  } else if (L.mode() == LayerMode::dsa_sparse) {  // IndexShare: the source layer's table, set by the caller
    HMLA_CHECK(sv.topk.defined() && sv.topk.dim() == 3 && sv.topk.size(0) == d.b && sv.topk.size(1) == d.s &&
                   sv.topk.size(2) == cfg.index_topk + cfg.index_window,
               ShapeError, "layer ", L.layer, " is 'shared' in indexer_types: it attends over layer ",
               cfg.indexer_source(L.layer), "'s top-k table [", d.b, ", ", d.s, ", ", cfg.index_topk + cfg.index_window,
               "], which the caller must set in saved.topk");
  }
  const Tensor kaf = sv.ka.view({d.NS, Wa});  // c in the first Rkv channels, k_pe after
  if (!L.latent()) {
    // Per-head keys [k_nope_h ; k_pe] and values of every key row, expanded here through
    // kv_b_proj; v stays a strided view of kv_b_proj's output.
    saved_slot(sv.v, {d.NS, d.H * (d.Dn + d.Dv)}, cd, d.dev);
    linear_fwd(kaf.slice(1, 0, d.Rkv), w.kv_b_proj, sv.v);
    saved_slot(sv.k, {d.NS, d.H, d.Dqk}, cd, d.dev);
    sv.k.slice(2, 0, d.Dn).copy_from(sv.v.view({d.NS, d.H, d.Dn + d.Dv}).slice(2, 0, d.Dn));
    for (int64_t h = 0; h < d.H; ++h) sv.k.select(1, h).slice(1, d.Dn, d.Dqk).copy_from(kaf.slice(1, d.Rkv, Wa));
    run_core(L, w, sv, d, layout);
    sv.o = sv.att.out.view({d.N, d.H, d.Dv});  // o_proj reads the core's output as it is
  } else {
    // Absorbed: qabs_h = [q_nope_h W_kb_h ; q_pe_h] against the shared key.
    const HeadMats kb = w_kb(w, d, L.split_kv_b_proj), vb = w_vb(w, d, L.split_kv_b_proj);
    saved_slot(sv.qabs, {d.N, d.H, Wa}, cd, d.dev);
    matmul(per_head(sv.q, 0, d.Dn), Trans::no, kb.m, op(kb.transposed), per_head(sv.qabs, 0, d.Rkv));
    sv.qabs.slice(2, d.Rkv, Wa).copy_from(sv.q.slice(2, d.Dn, d.Dqk));
    run_core(L, w, sv, d, layout);
    saved_slot(sv.o, {d.N, d.H, d.Dv}, cd, d.dev);  // o_h = oa_h W_vb_h^T
    matmul(per_head(sv.att.out.view({d.N, d.H, d.Rkv}), 0, d.Rkv), Trans::no, vb.m, Trans::yes,
           per_head(sv.o, 0, d.Dv));
  }
  Tensor y = f32(d.dev, {d.b, d.s, d.hid});
  linear_fwd(sv.o.view({d.N, d.H * d.Dv}), w.o_proj, y);
  return y;
}

namespace {

// New zero gradients for the weights of w (the indexer's, or the backbone's) that g has none for.
void zeros_where_missing(AttnTensors w, AttnTensors& g, bool indexer) {
  const std::vector<Tensor*> wf = fields(w), gf = fields(g);
  const size_t first = wf.size() - kIndexerFields;
  for (size_t i = indexer ? first : 0; i < (indexer ? wf.size() : first); ++i)
    if (wf[i]->defined() && !gf[i]->defined()) *gf[i] = Tensor::zeros(wf[i]->shape(), DType::f32, wf[i]->device());
}

// dsa_warmup: the dense KL against the MHA core's detached q/k (its lse is lseC unless a sink is
// in the denominator). dsa_sparse: the sparse KL over S(t) against the latent core's detached
// qabs/ka, with lseC saved by the sparse forward.
void indexer_grads(const MlaLayer& L, const AttnTensors& w, const Tensor& x, const MlaSaved& sv, const Dims& d,
                   const MlaBackwardOptions& opt, MlaGrads& g, Comm& cp) {
  const ModelConfig& cfg = *L.cfg;
  HMLA_CHECK(opt.row_weight.defined(), ShapeError, "layer ", L.layer, " (", mode_name(L.mode()),
             "): the indexer's KL needs loss-row weights (loss_row_weights)");
  IndexerKlInputs in;
  in.sc = sv.ind.sc;
  in.scale = static_cast<float>(softmax_scale(cfg));
  in.row_weight = opt.row_weight;
  in.coeff = static_cast<float>(cfg.indexer_loss_coeff);
  in.kl_acc = opt.kl_acc;
  const bool sparse = L.mode() == LayerMode::dsa_sparse;
  if (sparse) {
    in.q = sv.qabs.view({d.b, d.s, d.H, d.Rkv + d.Dr});
    in.k = sv.ka.view({d.b, d.S, 1, d.Rkv + d.Dr});
    in.lse_c = sv.lse_c;
    in.topk = sv.topk;
    in.topk_origin = TableOrigin::own;
    in.K = cfg.index_topk;
  } else {
    in.q = sv.q.view({d.b, d.s, d.H, d.Dqk});
    in.k = sv.k.view({d.b, d.S, d.H, d.Dqk});
    if (!cfg.attention_sink) in.lse_c = sv.att.lse;
  }
  IndexerKlResult kl = sparse ? indexer_kl_sparse(in) : indexer_kl_dense(in);
  zeros_where_missing(w, g.dweights, true);
  indexer_backward(cfg, w.indexer, x, sv.cq, sv.rope, sv.ind, kl, g.dweights.indexer, cp);
  g.indexer_loss = kl.loss;
  g.indexer_kl = kl.kl_sum;
}

// The core's backward and what feeds it, per form: dq [N, H, Dqk] for this rank's rows, dka
// [b, S, Rkv + Dr] the shared key's gradient over every key row; kv_b_proj's (or
// k_b_proj/v_b_proj's) and the sink's gradients added into dw.
struct CoreGrads {
  Tensor dq, dka;
};

CoreGrads mha_core_backward(const MlaLayer& L, const MlaSaved& sv, const Dims& d, const DocLayout& layout,
                            const Tensor& dO, const AttnTensors& dw) {
  const AttnTensors& w = L.w;
  const int64_t Wa = d.Rkv + d.Dr;
  const Tensor kaf = sv.ka.view({d.NS, Wa});
  CoreGrads r;
  AttnDenseGrads ga;
  ga = attn_dense_bwd(core_inputs(L, w, sv, d, layout), sv.att, core_in(dO.view({d.b, d.s, d.H, d.Dv})),
                      dw.softmax_offset);
  ga = {f32_of(ga.dq), f32_of(ga.dk), f32_of(ga.dv), ga.dsink};
  const Tensor dk = ga.dk.view({d.NS, d.H, d.Dqk});
  Tensor dkvb = f32(d.dev, {d.NS, d.H, d.Dn + d.Dv});
  dkvb.slice(2, 0, d.Dn).copy_from(dk.slice(2, 0, d.Dn));
  dkvb.slice(2, d.Dn, d.Dn + d.Dv).copy_from(ga.dv.view({d.NS, d.H, d.Dv}));
  r.dka = Tensor::zeros({d.b, d.S, Wa}, DType::f32, d.dev);
  const Tensor dka2 = r.dka.view({d.NS, Wa}), dk_pe = dka2.slice(1, d.Rkv, Wa);
  for (int64_t h = 0; h < d.H; ++h) add(dk_pe, dk.select(1, h).slice(1, d.Dn, d.Dqk), dk_pe);  // heads in order
  r.dq = ga.dq.view({d.N, d.H, d.Dqk});
  linear_bwd(dkvb.view({d.NS, d.H * (d.Dn + d.Dv)}), kaf.slice(1, 0, d.Rkv), w.kv_b_proj,
             dw.kv_b_proj, dka2.slice(1, 0, d.Rkv));
  return r;
}

CoreGrads latent_core_backward(const MlaLayer& L, const MlaSaved& sv, const Dims& d, const DocLayout& layout,
                               const Tensor& dO, const AttnTensors& dw) {
  const AttnTensors& w = L.w;
  const int64_t Wa = d.Rkv + d.Dr;
  const bool sparse = L.mode() == LayerMode::dsa_sparse;
  CoreGrads r;
  AttnDenseGrads ga;
  const HeadMats kb = w_kb(w, d, L.split_kv_b_proj), vb = w_vb(w, d, L.split_kv_b_proj);
  const HeadMats dkb = w_kb(dw, d, L.split_kv_b_proj), dvb = w_vb(dw, d, L.split_kv_b_proj);
  const Tensor oa = sv.att.out.view({d.N, d.H, d.Rkv});
  Tensor doa = f32(d.dev, {d.N, d.H, d.Rkv});  // o_h = oa_h W_vb_h^T
  matmul(per_head(dO, 0, d.Dv), Trans::no, vb.m, Trans::no, per_head(doa, 0, d.Rkv));
  matmul(per_head(dO, 0, d.Dv), Trans::yes, per_head(oa, 0, d.Rkv), Trans::no, dvb.m, 1.f, 1.f);
  if (sparse) {  // dkv holds the key's and the value's gradient together
    AttnSparseGrads gs = attn_sparse_bwd(sparse_inputs(L, w, sv, d), {sv.att.out, sv.att.lse, sv.lse_c},
                                         core_in(doa.view({d.b, d.s, d.H, d.Rkv})), dw.softmax_offset);
    ga = {f32_of(gs.dq), f32_of(gs.dkv), Tensor(), gs.dsink};
  } else {
    ga = attn_dense_bwd(core_inputs(L, w, sv, d, layout), sv.att, core_in(doa.view({d.b, d.s, d.H, d.Rkv})),
                        dw.softmax_offset);
    ga = {f32_of(ga.dq), f32_of(ga.dk), f32_of(ga.dv), ga.dsink};
  }
  const Tensor dqa = ga.dq.view({d.N, d.H, Wa});  // qabs_h = q_nope_h W_kb_h
  r.dq = f32(d.dev, {d.N, d.H, d.Dqk});
  matmul(per_head(dqa, 0, d.Rkv), Trans::no, kb.m, op(!kb.transposed), per_head(r.dq, 0, d.Dn));
  if (dkb.transposed)  // dW^T = dqabs_h^T q_nope_h  [Rkv, Dn]
    matmul(per_head(dqa, 0, d.Rkv), Trans::yes, per_head(sv.q, 0, d.Dn), Trans::no, dkb.m, 1.f, 1.f);
  else  // dW = q_nope_h^T dqabs_h  [Dn, Rkv]
    matmul(per_head(sv.q, 0, d.Dn), Trans::yes, per_head(dqa, 0, d.Rkv), Trans::no, dkb.m, 1.f, 1.f);
  r.dq.slice(2, d.Dn, d.Dqk).copy_from(dqa.slice(2, d.Rkv, Wa));
  r.dka = ga.dk.view({d.b, d.S, Wa});
  if (ga.dv.defined()) {  // the value is the key's first Rkv channels
    const Tensor dc = r.dka.view({d.NS, Wa}).slice(1, 0, d.Rkv);
    add(dc, ga.dv.view({d.NS, d.Rkv}), dc);
  }
  return r;
}

}  // namespace

MlaGrads mla_backward(const MlaLayer& L, const Tensor& x, const DocLayout& layout, const MlaSaved& sv,
                      const Tensor& dy, const MlaBackwardOptions& opt, Comm& cp) {
  const ModelConfig& cfg = *L.cfg;
  const Dims d = dims(cfg, x, layout, cp);
  const AttnTensors& w = L.w;
  MlaGrads g;
  g.dweights = opt.grads;  // views: the gradients land in the caller's tensors
  if (cfg.runs_indexer(L.layer)) indexer_grads(L, w, x, sv, d, opt, g, cp);
  if (!opt.backbone) return g;
  HMLA_CHECK(dy.shape() == x.shape() && dy.is_contiguous() && dy.dtype() == DType::f32, ShapeError,
             "mla layer: grad_output must be contiguous f32 ", shape_str(x.shape()), ", got ",
             shape_str(dy.shape()));
  const RopeCache& rc = sv.rope;
  const Tensor x2 = x.view({d.N, d.hid});
  zeros_where_missing(w, g.dweights, false);
  const AttnTensors& dw = g.dweights;

  // o_proj
  Tensor dO = f32(d.dev, {d.N, d.H, d.Dv});
  linear_bwd(dy.view({d.N, d.hid}), sv.o.view({d.N, d.H * d.Dv}), w.o_proj, dw.o_proj,
             dO.view({d.N, d.H * d.Dv}));

  // The core's gradients: dq for this rank's rows, and dka [NS, Rkv + Dr], the shared key's
  // gradient from this rank's queries over every key row (summed across ranks below).
  const CoreGrads cg =
      L.latent() ? latent_core_backward(L, sv, d, layout, dO, dw) : mha_core_backward(L, sv, d, layout, dO, dw);
  const Tensor &dq = cg.dq, &dka = cg.dka;
  const int64_t Wa = d.Rkv + d.Dr;

  // This rank's rows of the shared key's gradient, summed over every rank's queries.
  const Tensor dka_own = cp_reduce_scatter_rows(cp, dka).view({d.N, Wa});  // dc, then dk_pe

  // RoPE backward, then the kv_a and q projections; dx accumulates in a fixed order.
  rope_rows(dq, d, d.Dn, rc, true);
  rope_rows(dka_own.view({d.N, 1, Wa}), d, d.Rkv, rc, true);
  Tensor dkva = f32(d.dev, {d.N, Wa});
  rmsnorm_bwd(dka_own.slice(1, 0, d.Rkv), sv.kva.slice(1, 0, d.Rkv), w.kv_a_layernorm, sv.rstd_kv,
              dkva.slice(1, 0, d.Rkv), dw.kv_a_layernorm);
  dkva.slice(1, d.Rkv, Wa).copy_from(dka_own.slice(1, d.Rkv, Wa));
  g.dx = f32(d.dev, {d.b, d.s, d.hid});
  const Tensor dx2 = g.dx.view({d.N, d.hid}), dq2 = dq.view({d.N, d.H * d.Dqk});
  linear_bwd(dkva, x2, w.kv_a_proj_with_mqa, dw.kv_a_proj_with_mqa, dx2);
  if (d.Rq > 0) {
    Tensor dcq = f32(d.dev, {d.N, d.Rq}), dqa = f32(d.dev, {d.N, d.Rq});
    linear_bwd(dq2, sv.cq, w.q_b_proj, dw.q_b_proj, dcq);
    rmsnorm_bwd(dcq, sv.qa, w.q_a_layernorm, sv.rstd_q, dqa, dw.q_a_layernorm);
    linear_bwd(dqa, x2, w.q_a_proj, dw.q_a_proj, dx2, 1.f);
  } else {
    linear_bwd(dq2, x2, w.q_proj, dw.q_proj, dx2, 1.f);
  }
  return g;
}

}  // namespace hmla
