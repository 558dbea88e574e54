// MLA layer forward/backward on the CPU. Rows are N = b * s, all activations contiguous.
// Letters: H heads, Dn/Dr nope/rope widths (Dqk = Dn + Dr), Dv value width, Rq/Rkv LoRA ranks.
// The mqa path absorbs W_kb into q and de-absorbs W_vb after attention; docs/mla_layer.md has
// the derivation of its backward.
#include "hmla/model/mla_layer.h"

#include "hmla/model/indexer.h"

#include <cstring>

#include "cpu_kernels.h"
#include "hmla/dist/cp.h"
#include "hmla/ops/sparse_attention.h"
#include "cpu_kernels.h"
#include "rope_cache.h"

namespace hmla {

using cpu::sgemm;
using cpu::Trans;

namespace {

// s and N = b * s count this rank's query rows; S and NS = b * S the key rows (all of them:
// under context parallelism the query rows are the shard [row0, row0 + s) of S).
struct Dims {
  int64_t b, s, N, hid, H, Dn, Dr, Dv, Dqk, Rq, Rkv;
  int64_t S, NS, row0;
};

Dims dims(const ModelConfig& c, const Tensor& x, const DocLayout& layout, const Comm& cp) {
  const RowShard sh = row_shard(cp, layout.s);
  HMLA_CHECK(x.dim() == 3 && x.size(0) == layout.b && x.size(1) == sh.rows, ShapeError, "mla layer: hidden_states ",
             shape_str(x.shape()), " do not match the layout's b = ", layout.b, " and this rank's ", sh.rows, " of ",
             layout.s, " rows");
  return {x.size(0), x.size(1), x.size(0) * x.size(1), c.hidden_size, c.num_attention_heads,
          c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.qk_head_dim(), c.q_lora_rank,
          c.kv_lora_rank, layout.s, x.size(0) * layout.s, sh.row0};
}

const float* W(const MlaLayer& L, const char* name) { return L.weights.at(name).data<float>(); }

Tensor f32(const Shape& s) { return Tensor::empty(s, DType::f32); }

// Per-head absorption matrices. W_kb_h is [Dn, Rkv] (k half of kv_b_proj's head h); stored as
// such in kv_b_proj, transposed in k_b_proj [H, Rkv, Dn]. W_vb_h is [Dv, Rkv] in both forms.
struct HeadMat {
  float* p;
  int64_t ld;
  bool transposed;  // the buffer holds the matrix's transpose
};

HeadMat w_kb(float* kvb, float* kb, const Dims& d, int64_t h, bool split) {
  if (split) return {kb + h * d.Rkv * d.Dn, d.Dn, true};
  return {kvb + h * (d.Dn + d.Dv) * d.Rkv, d.Rkv, false};
}

HeadMat w_vb(float* kvb, float* vb, const Dims& d, int64_t h, bool split) {
  if (split) return {vb + h * d.Dv * d.Rkv, d.Rkv, false};
  return {kvb + (h * (d.Dn + d.Dv) + d.Dn) * d.Rkv, d.Rkv, false};
}

void rope(float* x, int64_t ld, int64_t hstride, int64_t heads, const Dims& d, const RopeCache& rc,
          bool transpose) {
  cpu::rope(cpu::RopeLayout::interleaved, x, ld, hstride, heads, d.N, d.s, d.Dr, rc.cos.data(), rc.sin.data(),
            transpose);
}

AttnDenseInputs core_inputs(const MlaLayer& L, const MlaSaved& sv, const Dims& d,
                            const DocLayout& layout) {
  AttnDenseInputs in;
  in.layout = &layout;
  in.scale = static_cast<float>(softmax_scale(*L.cfg));
  in.q_row0 = d.row0;
  if (L.cfg->attention_sink) in.sink = L.weights.at("softmax_offset");
  if (L.latent()) {
    in.q = sv.qabs.view({d.b, d.s, d.H, d.Rkv + d.Dr});
    in.k = sv.ka.view({d.b, d.S, 1, d.Rkv + d.Dr});
    in.v = in.k.slice(3, 0, d.Rkv);  // the value is the latent: the key's first Rkv channels
  } else {
    in.q = sv.q.view({d.b, d.s, d.H, d.Dqk});
    in.k = sv.k.view({d.b, d.S, d.H, d.Dqk});
    in.v = sv.v.view({d.b, d.S, d.H, d.Dn + d.Dv}).slice(3, d.Dn, d.Dn + d.Dv);
  }
  return in;
}

AttnSparseInputs sparse_inputs(const MlaLayer& L, const MlaSaved& sv, const Dims& d) {
  AttnSparseInputs in;
  in.q = sv.qabs.view({d.b, d.s, d.H, d.Rkv + d.Dr});
  in.kv = sv.ka.view({d.b, d.S, d.Rkv + d.Dr});
  in.Dv = d.Rkv;
  in.idx = sv.topk;
  in.K = L.cfg->index_topk;
  if (L.cfg->attention_sink) in.sink = L.weights.at("softmax_offset");
  in.scale = static_cast<float>(softmax_scale(*L.cfg));
  return in;
}

// The attention core: dense MHA, dense latent MQA, or sparse latent MQA over the selection.
void run_core(const MlaLayer& L, MlaSaved& sv, const Dims& d, const DocLayout& layout) {
  if (L.mode() == LayerMode::dsa_sparse) {  // over S(t) and the window
    AttnSparseSaved ss = attn_sparse_fwd(sparse_inputs(L, sv, d));
    sv.att = {ss.out, ss.lse};
    sv.lse_c = ss.lse_c;
  } else {
    sv.att = attn_dense_fwd(core_inputs(L, sv, d, layout));
  }
}

}  // namespace

void mla_memory_plan(MemoryPlan& plan, const ModelConfig& c, LayerMode mode, const SizeFactor& layers,
                     const SizeFactor& rows, const SizeFactor& s) {
  const std::string in = std::string(" of the ") + mode_name(mode) + " layers";
  const SizeFactor H{"num_attention_heads", c.num_attention_heads};
  const int64_t f = sizeof(float);
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
  if (!is_dsa(mode)) return;
  plan.add("the indexer's queries" + in,
           {layers, rows, s, {"index_n_heads", c.index_n_heads}, {"index_head_dim", c.index_head_dim}}, f);
  plan.add("the top-k tables" + in, {layers, rows, s, {"index_topk + index_window", c.index_topk + c.index_window}},
           sizeof(int32_t));
}

CpTraffic mla_cp_traffic(const ModelConfig& c, LayerMode mode, int64_t b, int64_t s, int64_t R, bool backbone) {
  if (R == 1) return {};
  const int64_t block = b * (s / R) * int64_t(sizeof(float)) * (R - 1);  // per channel
  const int64_t key = c.kv_lora_rank + c.qk_rope_head_dim, ikey = is_dsa(mode) ? c.index_head_dim : 0;
  return {block * (key + ikey), block * ((backbone ? key : 0) + ikey)};
}

void mla_drop_core(MlaSaved& sv) {
  sv.att = {};
  sv.lse_c = Tensor();
}

void mla_recompute_core(const MlaLayer& L, const Tensor& x, const DocLayout& layout, MlaSaved& sv, const Comm& cp) {
  run_core(L, sv, dims(*L.cfg, x, layout, cp), layout);
}

std::vector<ParamSpec> mla_param_table(const ModelConfig& c, bool split, bool indexer) {
  const int64_t H = c.num_attention_heads, hid = c.hidden_size, Dqk = c.qk_head_dim();
  const int64_t Rq = c.q_lora_rank, Rkv = c.kv_lora_rank, Dn = c.qk_nope_head_dim,
                Dr = c.qk_rope_head_dim, Dv = c.v_head_dim;
  std::vector<ParamSpec> t;
  if (Rq > 0) {
    t.push_back({"q_a_proj.weight", {Rq, hid}});
    t.push_back({"q_a_layernorm.weight", {Rq}});
    t.push_back({"q_b_proj.weight", {H * Dqk, Rq}});
  } else {
    t.push_back({"q_proj.weight", {H * Dqk, hid}});
  }
  t.push_back({"kv_a_proj_with_mqa.weight", {Rkv + Dr, hid}});
  t.push_back({"kv_a_layernorm.weight", {Rkv}});
  if (split) {
    t.push_back({"k_b_proj.weight", {H, Rkv, Dn}});
    t.push_back({"v_b_proj.weight", {H, Dv, Rkv}});
  } else {
    t.push_back({"kv_b_proj.weight", {H * (Dn + Dv), Rkv}});
  }
  t.push_back({"o_proj.weight", {hid, H * Dv}});
  if (c.attention_sink) t.push_back({"softmax_offset", {H}});
  if (indexer)
    for (ParamSpec& p : indexer_param_table(c)) t.push_back(std::move(p));
  return t;
}

void check_mla_weights(const io::TensorMap& w, const ModelConfig& c, bool split, bool indexer,
                       const std::string& what) {
  auto table = mla_param_table(c, split, indexer);
  for (const ParamSpec& p : table) {
    auto it = w.find(p.name);
    HMLA_CHECK(it != w.end(), ConfigError, what, ": tensor '", p.name, "' is missing");
    HMLA_CHECK(it->second.shape() == p.shape && it->second.dtype() == DType::f32, ConfigError, what,
               ": tensor '", p.name, "' is ", dtype_name(it->second.dtype()), shape_str(it->second.shape()),
               ", expected f32", shape_str(p.shape));
  }
  for (const auto& [name, t] : w) {
    bool known = false;
    for (const ParamSpec& p : table) known |= p.name == name;
    HMLA_CHECK(known, ConfigError, what, ": unexpected tensor '", name, "' for this config",
               name == "softmax_offset" ? " (softmax_offset needs attention_sink: true)"
               : name.rfind("indexer.", 0) == 0 ? " (indexer tensors belong to the dsa modes)" : "");
  }
}

void split_kv_b_proj(io::TensorMap& w, const ModelConfig& c) {
  const int64_t H = c.num_attention_heads, Rkv = c.kv_lora_rank, Dn = c.qk_nope_head_dim, Dv = c.v_head_dim;
  auto it = w.find("kv_b_proj.weight");
  HMLA_CHECK(it != w.end(), ConfigError, "split_kv_b_proj: kv_b_proj.weight is missing");
  const float* kvb = it->second.data<float>();
  Tensor kb = f32({H, Rkv, Dn}), vb = f32({H, Dv, Rkv});
  for (int64_t h = 0; h < H; ++h) {
    const float* rows = kvb + h * (Dn + Dv) * Rkv;
    for (int64_t i = 0; i < Dn; ++i)
      for (int64_t r = 0; r < Rkv; ++r) kb.data<float>()[(h * Rkv + r) * Dn + i] = rows[i * Rkv + r];
    std::memcpy(vb.data<float>() + h * Dv * Rkv, rows + Dn * Rkv, Dv * Rkv * sizeof(float));
  }
  w.erase(it);
  w["k_b_proj.weight"] = kb;
  w["v_b_proj.weight"] = vb;
}

void fold_kv_b_proj(io::TensorMap& w, const ModelConfig& c) {
  const int64_t H = c.num_attention_heads, Rkv = c.kv_lora_rank, Dn = c.qk_nope_head_dim, Dv = c.v_head_dim;
  HMLA_CHECK(w.count("k_b_proj.weight") && w.count("v_b_proj.weight"), ConfigError,
             "fold_kv_b_proj: k_b_proj.weight and v_b_proj.weight are required");
  const float* kb = w.at("k_b_proj.weight").data<float>();
  const float* vb = w.at("v_b_proj.weight").data<float>();
  Tensor kvb = f32({H * (Dn + Dv), Rkv});
  for (int64_t h = 0; h < H; ++h) {
    float* rows = kvb.data<float>() + h * (Dn + Dv) * Rkv;
    for (int64_t i = 0; i < Dn; ++i)
      for (int64_t r = 0; r < Rkv; ++r) rows[i * Rkv + r] = kb[(h * Rkv + r) * Dn + i];
    std::memcpy(rows + Dn * Rkv, vb + h * Dv * Rkv, Dv * Rkv * sizeof(float));
  }
  w.erase("k_b_proj.weight");
  w.erase("v_b_proj.weight");
  w["kv_b_proj.weight"] = kvb;
}

Tensor mla_forward(const MlaLayer& L, const Tensor& x, const DocLayout& layout, MlaSaved& sv, Comm& cp) {
  const ModelConfig& cfg = *L.cfg;
  HMLA_CHECK(x.dim() == 3 && x.size(2) == cfg.hidden_size && x.is_contiguous() && x.dtype() == DType::f32,
             ShapeError, "mla layer: hidden_states must be contiguous f32 [b, s, ", cfg.hidden_size,
             "], got ", shape_str(x.shape()));
  HMLA_CHECK(!L.split_kv_b_proj || L.latent(), ConfigError, "layer ", L.layer, ": mqa_split_kv_b_proj needs a latent MQA mode, not ",
             mode_name(cfg.layer_modes[L.layer]));
  const Dims d = dims(cfg, x, layout, cp);
  const float eps = static_cast<float>(cfg.rms_norm_eps);
  const float* X = x.data<float>();
  const RopeCache rc = rope_cache(cfg, d.s, d.row0);

  sv.q = f32({d.N, d.H, d.Dqk});
  if (d.Rq > 0) {
    sv.qa = f32({d.N, d.Rq});
    sv.rstd_q = f32({d.N});
    sv.cq = f32({d.N, d.Rq});
    cpu::linear_fwd(sv.qa.data<float>(), d.Rq, X, d.hid, W(L, "q_a_proj.weight"), d.N, d.hid, d.Rq);
    cpu::rmsnorm_fwd(sv.cq.data<float>(), d.Rq, sv.rstd_q.data<float>(), sv.qa.data<float>(), d.Rq,
                     W(L, "q_a_layernorm.weight"), d.N, d.Rq, eps);
    cpu::linear_fwd(sv.q.data<float>(), d.H * d.Dqk, sv.cq.data<float>(), d.Rq, W(L, "q_b_proj.weight"),
                    d.N, d.Rq, d.H * d.Dqk);
  } else {
    cpu::linear_fwd(sv.q.data<float>(), d.H * d.Dqk, X, d.hid, W(L, "q_proj.weight"), d.N, d.hid, d.H * d.Dqk);
  }
  rope(sv.q.data<float>() + d.Dn, d.H * d.Dqk, d.Dqk, d.H, d, rc, false);

  // The shared key [c ; rope(k_pe)] of this rank's rows, then of every row: under context
  // parallelism this (Rkv + Dr)-wide latent is all that travels for the main attention.
  const int64_t Wa = d.Rkv + d.Dr;
  sv.kva = f32({d.N, Wa});
  sv.rstd_kv = f32({d.N});
  Tensor ka = f32({d.b, d.s, Wa});
  float* KA = ka.data<float>();
  cpu::linear_fwd(sv.kva.data<float>(), Wa, X, d.hid, W(L, "kv_a_proj_with_mqa.weight"), d.N, d.hid, Wa);
  cpu::rmsnorm_fwd(KA, Wa, sv.rstd_kv.data<float>(), sv.kva.data<float>(), Wa, W(L, "kv_a_layernorm.weight"), d.N,
                   d.Rkv, eps);
  for (int64_t n = 0; n < d.N; ++n)
    std::memcpy(KA + n * Wa + d.Rkv, sv.kva.data<float>() + n * Wa + d.Rkv, d.Dr * sizeof(float));
  rope(KA + d.Rkv, Wa, 0, 1, d, rc, false);
  sv.ka = cp_all_gather_rows(cp, ka).view({d.NS, 1, Wa});

  if (is_dsa(L.mode())) {  // the indexer reads x and cq; the backbone reads only its selection
    indexer_forward(cfg, L.weights, x, sv.cq, layout, sv.ind, cp);
    sv.topk = indexer_topk(sv.ind.sc, cfg.index_topk, cfg.index_window);
  }
  const float* KAF = sv.ka.data<float>();  // [NS, Wa]: c in the first Rkv channels, k_pe after
  float* kvb_w = L.split_kv_b_proj ? nullptr : const_cast<float*>(W(L, "kv_b_proj.weight"));
  float* kb_w = L.split_kv_b_proj ? const_cast<float*>(W(L, "k_b_proj.weight")) : nullptr;
  float* vb_w = L.split_kv_b_proj ? const_cast<float*>(W(L, "v_b_proj.weight")) : nullptr;
  if (!L.latent()) {
    // Per-head keys [k_nope_h ; k_pe] and values of every key row, expanded here through
    // kv_b_proj; v stays a strided view of kv_b_proj's output.
    sv.v = f32({d.NS, d.H * (d.Dn + d.Dv)});
    cpu::linear_fwd(sv.v.data<float>(), d.H * (d.Dn + d.Dv), KAF, Wa, kvb_w, d.NS, d.Rkv, d.H * (d.Dn + d.Dv));
    sv.k = f32({d.NS, d.H, d.Dqk});
    for (int64_t n = 0; n < d.NS; ++n)
      for (int64_t h = 0; h < d.H; ++h) {
        float* k = sv.k.data<float>() + (n * d.H + h) * d.Dqk;
        std::memcpy(k, sv.v.data<float>() + (n * d.H + h) * (d.Dn + d.Dv), d.Dn * sizeof(float));
        std::memcpy(k + d.Dn, KAF + n * Wa + d.Rkv, d.Dr * sizeof(float));
      }
    run_core(L, sv, d, layout);
    sv.o = sv.att.out.view({d.N, d.H, d.Dv});  // o_proj reads the core's output as it is
  } else {
    // Absorbed: qabs_h = [q_nope_h W_kb_h ; q_pe_h] against the shared key.
    sv.qabs = f32({d.N, d.H, Wa});
    for (int64_t h = 0; h < d.H; ++h) {
      HeadMat m = w_kb(kvb_w, kb_w, d, h, L.split_kv_b_proj);
      sgemm(Trans::no, m.transposed ? Trans::yes : Trans::no, d.N, d.Rkv, d.Dn, 1.f,
            sv.q.data<float>() + h * d.Dqk, d.H * d.Dqk, m.p, m.ld, 0.f, sv.qabs.data<float>() + h * Wa, d.H * Wa);
    }
    for (int64_t n = 0; n < d.N; ++n)
      for (int64_t h = 0; h < d.H; ++h)
        std::memcpy(sv.qabs.data<float>() + (n * d.H + h) * Wa + d.Rkv,
                    sv.q.data<float>() + (n * d.H + h) * d.Dqk + d.Dn, d.Dr * sizeof(float));
    run_core(L, sv, d, layout);
    sv.o = f32({d.N, d.H, d.Dv});
    for (int64_t h = 0; h < d.H; ++h) {  // o_h = oa_h W_vb_h^T
      HeadMat m = w_vb(kvb_w, vb_w, d, h, L.split_kv_b_proj);
      sgemm(Trans::no, Trans::yes, d.N, d.Dv, d.Rkv, 1.f, sv.att.out.data<float>() + h * d.Rkv, d.H * d.Rkv,
            m.p, m.ld, 0.f, sv.o.data<float>() + h * d.Dv, d.H * d.Dv);
    }
  }
  Tensor y = f32({d.b, d.s, d.hid});
  cpu::linear_fwd(y.data<float>(), d.hid, sv.o.data<float>(), d.H * d.Dv, W(L, "o_proj.weight"), d.N,
                  d.H * d.Dv, d.hid);
  return y;
}

namespace {

// dsa_warmup: the dense KL against the MHA core's detached q/k (its lse is lseC unless a sink is
// in the denominator). dsa_sparse: the sparse KL over S(t) against the latent core's detached
// qabs/ka, with lseC saved by the sparse forward.
void indexer_grads(const MlaLayer& L, const Tensor& x, const MlaSaved& sv, const Dims& d,
                   const MlaBackwardOptions& opt, MlaGrads& g, Comm& cp) {
  const ModelConfig& cfg = *L.cfg;
  HMLA_CHECK(opt.row_weight.defined(), ShapeError, "layer ", L.layer, " (", mode_name(L.mode()),
             "): the indexer's KL needs loss-row weights (loss_row_weights)");
  IndexerKlInputs in;
  in.sc = sv.ind.sc;
  in.scale = static_cast<float>(softmax_scale(cfg));
  in.row_weight = opt.row_weight;
  in.coeff = static_cast<float>(cfg.indexer_loss_coeff);
  const bool sparse = L.mode() == LayerMode::dsa_sparse;
  if (sparse) {
    in.q = sv.qabs.view({d.b, d.s, d.H, d.Rkv + d.Dr});
    in.k = sv.ka.view({d.b, d.S, 1, d.Rkv + d.Dr});
    in.lse_c = sv.lse_c;
    in.topk = sv.topk;
    in.K = cfg.index_topk;
  } else {
    in.q = sv.q.view({d.b, d.s, d.H, d.Dqk});
    in.k = sv.k.view({d.b, d.S, d.H, d.Dqk});
    if (!cfg.attention_sink) in.lse_c = sv.att.lse;
  }
  IndexerKlResult kl = sparse ? indexer_kl_sparse(in) : indexer_kl_dense(in);
  indexer_backward(cfg, L.weights, x, sv.cq, sv.ind, kl, g.dweights, cp);
  g.indexer_loss = kl.loss;
  g.indexer_kl = kl.kl_sum;
}

}  // namespace

MlaGrads mla_backward(const MlaLayer& L, const Tensor& x, const DocLayout& layout, const MlaSaved& sv,
                      const Tensor& dy, const MlaBackwardOptions& opt, Comm& cp) {
  const ModelConfig& cfg = *L.cfg;
  const Dims d = dims(cfg, x, layout, cp);
  MlaGrads g;
  if (is_dsa(L.mode())) indexer_grads(L, x, sv, d, opt, g, cp);
  if (!opt.backbone) return g;
  HMLA_CHECK(dy.shape() == x.shape() && dy.is_contiguous() && dy.dtype() == DType::f32, ShapeError,
             "mla layer: grad_output must be contiguous f32 ", shape_str(x.shape()), ", got ",
             shape_str(dy.shape()));
  const RopeCache rc = rope_cache(cfg, d.s, d.row0);
  const float* X = x.data<float>();
  for (const ParamSpec& p : mla_param_table(cfg, L.split_kv_b_proj)) g.dweights[p.name] = f32(p.shape);
  auto dW = [&](const char* name) { return g.dweights.at(name).data<float>(); };

  // o_proj
  Tensor dO = f32({d.N, d.H, d.Dv});
  cpu::linear_bwd(dO.data<float>(), d.H * d.Dv, 0.f, dW("o_proj.weight"), dy.data<float>(), d.hid,
                  sv.o.data<float>(), d.H * d.Dv, W(L, "o_proj.weight"), d.N, d.H * d.Dv, d.hid);

  // The core's gradients: dq for this rank's rows, and dka [NS, Rkv + Dr], the shared key's
  // gradient from this rank's queries over every key row (summed across ranks below).
  const int64_t Wa = d.Rkv + d.Dr;
  Tensor dq = f32({d.N, d.H, d.Dqk});
  Tensor dka = f32({d.b, d.S, Wa});
  const bool sparse = L.mode() == LayerMode::dsa_sparse;
  AttnDenseInputs in = core_inputs(L, sv, d, layout);
  float* kvb_w = L.split_kv_b_proj ? nullptr : const_cast<float*>(W(L, "kv_b_proj.weight"));
  float* kb_w = L.split_kv_b_proj ? const_cast<float*>(W(L, "k_b_proj.weight")) : nullptr;
  float* vb_w = L.split_kv_b_proj ? const_cast<float*>(W(L, "v_b_proj.weight")) : nullptr;
  float* dkvb_w = L.split_kv_b_proj ? nullptr : dW("kv_b_proj.weight");
  float* dkb_w = L.split_kv_b_proj ? dW("k_b_proj.weight") : nullptr;
  float* dvb_w = L.split_kv_b_proj ? dW("v_b_proj.weight") : nullptr;
  float* DKA = dka.data<float>();
  AttnDenseGrads ga;
  if (!L.latent()) {
    ga = attn_dense_bwd(in, sv.att, dO.view({d.b, d.s, d.H, d.Dv}));
    Tensor dkvb = f32({d.NS, d.H * (d.Dn + d.Dv)});
    for (int64_t n = 0; n < d.NS; ++n) {
      float* kp = DKA + n * Wa + d.Rkv;
      std::fill(kp, kp + d.Dr, 0.f);
      for (int64_t h = 0; h < d.H; ++h) {
        const float* dk = ga.dk.data<float>() + (n * d.H + h) * d.Dqk;
        float* row = dkvb.data<float>() + (n * d.H + h) * (d.Dn + d.Dv);
        std::memcpy(row, dk, d.Dn * sizeof(float));
        std::memcpy(row + d.Dn, ga.dv.data<float>() + (n * d.H + h) * d.Dv, d.Dv * sizeof(float));
        for (int64_t i = 0; i < d.Dr; ++i) kp[i] += dk[d.Dn + i];
      }
    }
    std::memcpy(dq.data<float>(), ga.dq.data<float>(), dq.nbytes());
    cpu::linear_bwd(DKA, Wa, 0.f, dkvb_w, dkvb.data<float>(), d.H * (d.Dn + d.Dv), sv.ka.data<float>(), Wa, kvb_w,
                    d.NS, d.Rkv, d.H * (d.Dn + d.Dv));
  } else {
    Tensor doa = f32({d.N, d.H, d.Rkv});
    for (int64_t h = 0; h < d.H; ++h) {  // o_h = oa_h W_vb_h^T
      HeadMat m = w_vb(kvb_w, vb_w, d, h, L.split_kv_b_proj);
      HeadMat dm = w_vb(dkvb_w, dvb_w, d, h, L.split_kv_b_proj);
      const float* do_h = dO.data<float>() + h * d.Dv;
      sgemm(Trans::no, Trans::no, d.N, d.Rkv, d.Dv, 1.f, do_h, d.H * d.Dv, m.p, m.ld, 0.f,
            doa.data<float>() + h * d.Rkv, d.H * d.Rkv);
      sgemm(Trans::yes, Trans::no, d.Dv, d.Rkv, d.N, 1.f, do_h, d.H * d.Dv, sv.att.out.data<float>() + h * d.Rkv,
            d.H * d.Rkv, 0.f, dm.p, dm.ld);
    }
    if (sparse) {  // dkv holds the key's and the value's gradient together
      AttnSparseGrads gs = attn_sparse_bwd(sparse_inputs(L, sv, d), {sv.att.out, sv.att.lse, sv.lse_c},
                                           doa.view({d.b, d.s, d.H, d.Rkv}));
      ga = {gs.dq, gs.dkv, Tensor(), gs.dsink};
    } else {
      ga = attn_dense_bwd(in, sv.att, doa.view({d.b, d.s, d.H, d.Rkv}));
    }
    const float* dqa = ga.dq.data<float>();
    for (int64_t h = 0; h < d.H; ++h) {  // qabs_h = q_nope_h W_kb_h
      HeadMat m = w_kb(kvb_w, kb_w, d, h, L.split_kv_b_proj);
      HeadMat dm = w_kb(dkvb_w, dkb_w, d, h, L.split_kv_b_proj);
      const float* dqa_h = dqa + h * Wa;
      const float* qn_h = sv.q.data<float>() + h * d.Dqk;
      sgemm(Trans::no, m.transposed ? Trans::no : Trans::yes, d.N, d.Dn, d.Rkv, 1.f, dqa_h, d.H * Wa, m.p,
            m.ld, 0.f, dq.data<float>() + h * d.Dqk, d.H * d.Dqk);
      if (dm.transposed)  // dW^T = dqabs_h^T q_nope_h  [Rkv, Dn]
        sgemm(Trans::yes, Trans::no, d.Rkv, d.Dn, d.N, 1.f, dqa_h, d.H * Wa, qn_h, d.H * d.Dqk, 0.f, dm.p, dm.ld);
      else  // dW = q_nope_h^T dqabs_h  [Dn, Rkv]
        sgemm(Trans::yes, Trans::no, d.Dn, d.Rkv, d.N, 1.f, qn_h, d.H * d.Dqk, dqa_h, d.H * Wa, 0.f, dm.p, dm.ld);
    }
    for (int64_t n = 0; n < d.N; ++n)
      for (int64_t h = 0; h < d.H; ++h)
        std::memcpy(dq.data<float>() + (n * d.H + h) * d.Dqk + d.Dn, dqa + (n * d.H + h) * Wa + d.Rkv,
                    d.Dr * sizeof(float));
    std::memcpy(DKA, ga.dk.data<float>(), dka.nbytes());
    if (ga.dv.defined())  // the value is the key's first Rkv channels
      for (int64_t n = 0; n < d.NS; ++n) {
        const float* dva = ga.dv.data<float>() + n * d.Rkv;
        for (int64_t r = 0; r < d.Rkv; ++r) DKA[n * Wa + r] += dva[r];
      }
  }
  if (cfg.attention_sink) std::memcpy(dW("softmax_offset"), ga.dsink.data<float>(), d.H * sizeof(float));

  // This rank's rows of the shared key's gradient, summed over every rank's queries.
  const Tensor dka_own = cp_reduce_scatter_rows(cp, dka);
  float* DK = dka_own.data<float>();  // [N, Wa]: dc, then dk_pe

  // RoPE backward, then the kv_a and q projections; dx accumulates in a fixed order.
  rope(dq.data<float>() + d.Dn, d.H * d.Dqk, d.Dqk, d.H, d, rc, true);
  rope(DK + d.Rkv, Wa, 0, 1, d, rc, true);
  Tensor dkva = f32({d.N, Wa});
  cpu::rmsnorm_bwd(dkva.data<float>(), Wa, dW("kv_a_layernorm.weight"), DK, Wa, sv.kva.data<float>(), Wa,
                   W(L, "kv_a_layernorm.weight"), sv.rstd_kv.data<float>(), d.N, d.Rkv);
  for (int64_t n = 0; n < d.N; ++n)
    std::memcpy(dkva.data<float>() + n * Wa + d.Rkv, DK + n * Wa + d.Rkv, d.Dr * sizeof(float));
  g.dx = f32({d.b, d.s, d.hid});
  cpu::linear_bwd(g.dx.data<float>(), d.hid, 0.f, dW("kv_a_proj_with_mqa.weight"), dkva.data<float>(), Wa, X,
                  d.hid, W(L, "kv_a_proj_with_mqa.weight"), d.N, d.hid, Wa);
  if (d.Rq > 0) {
    Tensor dcq = f32({d.N, d.Rq}), dqa = f32({d.N, d.Rq});
    cpu::linear_bwd(dcq.data<float>(), d.Rq, 0.f, dW("q_b_proj.weight"), dq.data<float>(), d.H * d.Dqk,
                    sv.cq.data<float>(), d.Rq, W(L, "q_b_proj.weight"), d.N, d.Rq, d.H * d.Dqk);
    cpu::rmsnorm_bwd(dqa.data<float>(), d.Rq, dW("q_a_layernorm.weight"), dcq.data<float>(), d.Rq,
                     sv.qa.data<float>(), d.Rq, W(L, "q_a_layernorm.weight"), sv.rstd_q.data<float>(), d.N, d.Rq);
    cpu::linear_bwd(g.dx.data<float>(), d.hid, 1.f, dW("q_a_proj.weight"), dqa.data<float>(), d.Rq, X, d.hid,
                    W(L, "q_a_proj.weight"), d.N, d.hid, d.Rq);
  } else {
    cpu::linear_bwd(g.dx.data<float>(), d.hid, 1.f, dW("q_proj.weight"), dq.data<float>(), d.H * d.Dqk, X, d.hid,
                    W(L, "q_proj.weight"), d.N, d.hid, d.H * d.Dqk);
  }
  return g;
}

}  // namespace hmla
