// DeepSeek-V4's parameter table (v4_tables.h), shapes from docs/deepseek_v4_math.md: a compressor
// of rate m over width w projects to coff * w (coff 2 for CSA's two overlapped series, 1 for HCA)
// with a per-slot bias ape [m, coff * w]; the CSA indexer has its own compressor of width
// index_head_dim. A hybrid_mla layer's attention is the MLA layer's table (mla_param_table) at
// self_attn.*, with its geometry (hybrid_mla_config).
#include "hmla/model/v4_tables.h"

#include <map>
#include <string>

#include "hmla/model/mla_layer.h"
#include "hmla/model/mlp.h"
#include "hmla/model/model.h"

namespace hmla {

namespace {

void add_compressor(std::vector<ParamSpec>& t, const std::string& at, int64_t rate, int64_t coff, int64_t width,
                    int64_t hid) {
  t.push_back({at + "ape", {rate, coff * width}});
  t.push_back({at + "norm.weight", {width}});
  t.push_back({at + "wgate.weight", {coff * width, hid}});
  t.push_back({at + "wkv.weight", {coff * width, hid}});
}

void add_swiglu(std::vector<ParamSpec>& t, const std::string& at, int64_t I, int64_t hid) {
  t.push_back({at + "w1.weight", {I, hid}});
  t.push_back({at + "w2.weight", {hid, I}});
  t.push_back({at + "w3.weight", {I, hid}});
}

void add_hc(std::vector<ParamSpec>& t, const std::string& at, const ModelConfig& c) {
  const int64_t n = c.v4.hc_mult, mix = (2 + n) * n;
  t.push_back({at + "_fn", {mix, n * c.hidden_size}});
  t.push_back({at + "_base", {mix}});
  t.push_back({at + "_scale", {3}});
}

// The V4 attention's "attn.*" of layer L (every kind but hybrid_mla); its kv norm is `kv_norm`
// (transformers saves attn.norm, DeepSeek's release names it attn.kv_norm); indexer: a CSA layer's.
void add_v4_attention(std::vector<ParamSpec>& t, const ModelConfig& c, int64_t L, const std::string& at,
                      const std::string& kv_norm, bool indexer) {
  const V4Config& v = c.v4;
  const int64_t hid = c.hidden_size, H = c.num_attention_heads, d = v.head_dim, Rq = c.q_lora_rank;
  t.push_back({at + "wq_a.weight", {Rq, hid}});
  t.push_back({at + "q_norm.weight", {Rq}});
  t.push_back({at + "wq_b.weight", {H * d, Rq}});
  t.push_back({at + "wkv.weight", {d, hid}});
  t.push_back({at + kv_norm, {d}});
  t.push_back({at + "wo_a.weight", {v.o_groups * v.o_lora_rank, H * d / v.o_groups}});
  t.push_back({at + "wo_b.weight", {hid, v.o_groups * v.o_lora_rank}});
  t.push_back({at + "attn_sink", {H}});
  const V4Kind kind = v.kind(L);
  if (kind != V4Kind::sliding) add_compressor(t, at + "compressor.", v.compress_rate(L), kind == V4Kind::csa ? 2 : 1, d, hid);
  if (kind == V4Kind::csa && indexer) {
    add_compressor(t, at + "indexer.compressor.", v.csa_rate, 2, c.index_head_dim, hid);
    t.push_back({at + "indexer.weights_proj.weight", {c.index_n_heads, hid}});
    t.push_back({at + "indexer.wq_b.weight", {c.index_n_heads * c.index_head_dim, Rq}});
  }
}

// One V4 block's entries under `pre` (a layer's model.layers.{L}., an MTP layer's mtp.{i}.), for
// layer L's kind and routing: the mixers, the norms, the attention (a hybrid_mla layer's in the MLA
// names of DESIGN.md section 2, its indexer's only when it has one), the MoE.
void add_block(std::vector<ParamSpec>& t, const ModelConfig& c, int64_t L, const std::string& pre,
               const std::string& kv_norm, bool one_expert, bool indexer) {
  const V4Config& v = c.v4;
  const int64_t hid = c.hidden_size;
  add_hc(t, pre + "hc_attn", c);
  t.push_back({pre + "attn_norm.weight", {hid}});
  if (v.is_hybrid_mla(L)) {
    for (ParamSpec& p : mla_param_table(hybrid_mla_config(c, L), false, indexer))
      t.push_back({pre + "self_attn." + p.name, p.shape});
  } else {
    add_v4_attention(t, c, L, pre + "attn.", kv_norm, indexer);
  }
  add_hc(t, pre + "hc_ffn", c);
  t.push_back({pre + "ffn_norm.weight", {hid}});
  const MoeConfig& m = c.moe;
  t.push_back({pre + "ffn.gate.weight", {m.n_routed_experts, hid}});
  if (!v.hash_layer(L)) t.push_back({pre + "ffn.gate.bias", {m.n_routed_experts}});
  for (int64_t e = 0; e < (one_expert ? 1 : m.n_routed_experts); ++e)
    add_swiglu(t, pre + "ffn.experts." + std::to_string(e) + ".", m.moe_intermediate_size, hid);
  add_swiglu(t, pre + "ffn.shared_experts.", m.moe_intermediate_size, hid);
}

}  // namespace

std::vector<ParamSpec> v4_layer_params(const ModelConfig& c, int64_t L, bool one_expert, bool indexer) {
  std::vector<ParamSpec> t;
  add_block(t, c, L, layer_prefix(L), "norm.weight", one_expert, indexer);
  return t;
}

std::vector<bool> v4_indexer_layers(const ModelConfig& c) {
  std::vector<bool> h;
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) h.push_back(c.has_dsa(L));
  return h;
}

std::string mtp_prefix(int64_t i) { return "mtp." + std::to_string(i) + "."; }

bool is_mtp_tensor(const std::string& name) { return name.starts_with("mtp."); }

std::vector<ParamSpec> v4_mtp_params(const ModelConfig& c, int64_t i, bool one_expert) {
  const int64_t hid = c.hidden_size, n = c.v4.hc_mult, L = c.num_hidden_layers + i;
  const std::string pre = mtp_prefix(i);
  std::vector<ParamSpec> t{{pre + "e_proj.weight", {hid, hid}}, {pre + "enorm.weight", {hid}},
                           {pre + "h_proj.weight", {hid, hid}}, {pre + "hnorm.weight", {hid}}};
  // Its indexer always, where the kind has one: a CSA layer's as DeepSeek stores it, a hybrid_mla
  // layer's so that the MTP layer's names are the same in every phase (docs/deepseek_v4_math.md
  // section 14; a checkpoint without it gets it initialised: load_checkpoint_into_model).
  add_block(t, c, L, pre, "kv_norm.weight", one_expert, c.has_dsa(L));
  t.push_back({pre + "hc_head_fn", {n, n * hid}});
  t.push_back({pre + "hc_head_base", {n}});
  t.push_back({pre + "hc_head_scale", {1}});
  t.push_back({pre + "norm.weight", {hid}});
  return t;
}

std::vector<ParamSpec> v4_param_table(const ModelConfig& c, bool one_expert, const std::vector<bool>& has_indexer) {
  std::vector<ParamSpec> t{{"model.embed_tokens.weight", {c.vocab_size, c.hidden_size}}};
  for (int64_t L = 0; L < c.num_hidden_layers; ++L)
    for (ParamSpec& p : v4_layer_params(c, L, one_expert, v4_has_indexer(c, has_indexer, L)))
      t.push_back(std::move(p));
  const int64_t n = c.v4.hc_mult;
  t.push_back({"model.hc_head.hc_fn", {n, n * c.hidden_size}});
  t.push_back({"model.hc_head.hc_base", {n}});
  t.push_back({"model.hc_head.hc_scale", {1}});
  t.push_back({"model.norm.weight", {c.hidden_size}});
  if (!c.tie_word_embeddings) t.push_back({"head.weight", {c.vocab_size, c.hidden_size}});
  // Last, so that the stack's tensors sit where they do without them (and init_model draws them alike).
  for (int64_t i = 0; c.v4.mtp_params && i < c.form.num_nextn_predict_layers; ++i)
    for (ParamSpec& p : v4_mtp_params(c, i, one_expert)) t.push_back(std::move(p));
  return t;
}

std::vector<ParamSpec> v4_int_tables(const ModelConfig& c) {
  std::vector<ParamSpec> t;
  if (!c.is_v4()) return t;
  for (int64_t L = 0; L < c.num_hidden_layers; ++L)
    if (c.v4.hash.at(size_t(L)))
      t.push_back({layer_prefix(L) + "ffn.gate.tid2eid", {c.vocab_size, c.moe.num_experts_per_tok}});
  return t;
}

void plan_v4_activations(MemoryPlan& plan, const ModelConfig& c, const SizeFactor& rows, const SizeFactor& s,
                         DType compute) {
  // What v4_model.cpp's forward keeps per token, summed over the layers, in f32 (f) and in the
  // compute dtype (a: v4_internal.h v4_act): the streams after each block, each block's mixers,
  // norms and the sublayer's input, the attention's chain (v4_internal.h V4AttnSaved), the
  // compressors' projections, the MoE's fields; per entry the pooled rows and the entries.
  const V4Config& v = c.v4;
  const int64_t n = v.hc_mult, D = c.hidden_size, H = c.num_attention_heads, d = v.head_dim, Rq = c.q_lora_rank;
  const int64_t nI = c.index_n_heads, dI = c.index_head_dim;
  const int64_t block_f = D + 2 + (2 + n) * n + n + n * n;  // xin, rstd, z, post, comb (nx: compute)
  int64_t per_f = n * D, per_a = 0, idx = 0;  // the embedding's streams
  std::map<int64_t, std::pair<int64_t, int64_t>> per_entry;  // rate -> (f32, compute) values per entry
  auto add = [](int64_t& to, int64_t v) { to = checked_add(to, v, "the V4 activations"); };
  // The MTP layers (v4_mtp.cpp), where they train, keep a block's fields each (one at a time) and
  // their inputs and heads: the embedding, enorm's and e_proj's outputs, hnorm's and h_proj's over
  // the streams, the norms' statistics, hc_head and the final norm.
  const int64_t mtp = v.mtp_params ? c.form.num_nextn_predict_layers : 0;
  for (int64_t L = 0; L < c.num_hidden_layers + mtp; ++L) {
    add(per_f, 2 * n * D + 2 * block_f + 2 * D);  // the streams, the two blocks, the sublayers' outputs
    add(per_a, 2 * D);                            // the sublayers' inputs
    if (v.is_hybrid_mla(L)) {  // the MLA layer's saved tensors per row (one rank: S = s), an MTP layer's too
      for (const MlaField& f : mla_fields(hybrid_mla_config(c, L), L, 1, 1, 1, compute, false))
        add(f.dtype == DType::f32 ? per_f : per_a, shape_numel(f.shape));
    } else {  // rstd_qa, rstd_q, lse, rstd_kv; qa, qr, qb, q, core, kvr, kv, ya
      add(per_f, 1 + 2 * H + 1);
      add(per_a, 2 * Rq + 3 * H * d + 2 * d + v.o_groups * v.o_lora_rank);
    }
    for (const ActField& f : mlp_fields(c, L))
      add(field_dtype(f, compute) == DType::f32 ? per_f : per_a, std::max<int64_t>(f.width, 1));
    const int64_t m = v.compress_rate(L), coff = v.kind(L) == V4Kind::csa ? 2 : 1;
    if (m > 0) add(per_f, 2 * coff * d), per_entry[m].first += d + 1, per_entry[m].second += d;
    const bool runs = L < c.num_hidden_layers && c.runs_indexer(L) && v.kind(L) == V4Kind::csa;
    if (runs) {  // its indexer: compressor (kvc, gc f32), w (f32), qI; per entry pooled, rstd (f32), kI
      add(per_f, 4 * dI + nI), add(per_a, nI * dI);
      per_entry[m].first += dI + 1, per_entry[m].second += dI;
    }
    if (runs && c.layer_modes[size_t(L)] == LayerMode::dsa_sparse) idx += c.index_topk;
    if (L >= c.num_hidden_layers) add(per_f, 5 * D + n * D + 3 + 2 * n), add(per_a, D + n * D);  // en, hn: compute
  }
  const int64_t a = dtype_size(compute);
  const std::string an = dtype_name(compute);
  plan.add("the V4 layers' saved activations (f32)", {rows, s, {"values per token", per_f}}, 4);
  plan.add("the V4 layers' saved activations (" + an + ")", {rows, s, {"values per token", per_a}}, a);
  for (const auto& [m, values] : per_entry) {
    const SizeFactor entries{"s / " + std::to_string(m), s.value / m};
    plan.add("the compressed entries of rate " + std::to_string(m) + " (f32)",
             {rows, entries, {"values per entry", values.first}}, 4);
    plan.add("the compressed entries of rate " + std::to_string(m) + " (" + an + ")",
             {rows, entries, {"values per entry", values.second}}, a);
  }
  if (idx > 0) plan.add("the CSA layers' top-k tables (i32)", {rows, s, {"index_topk x CSA layers", idx}}, 4);
  plan.add("the final streams, hc_head and norm (f32)", {rows, s, {"values per token", 3 * D + 2 + n}}, 4);
}

}  // namespace hmla
