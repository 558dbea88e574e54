// The MLA layer's tensors (mla_layer.h): their table in Hugging Face names, the check of a weight
// file against it, and the split of kv_b_proj into k_b_proj/v_b_proj (mqa_split_kv_b_proj) and
// its fold back, bit-exact.
#include "hmla/model/mla_layer.h"

#include "hmla/core/error.h"
#include "hmla/model/indexer.h"

namespace hmla {

namespace {

// A tensor like `of` (its dtype and device: the f32 weights or gradients, or the bf16 compute copy).
Tensor like(const Tensor& of, const Shape& s) { return Tensor::empty(s, of.dtype(), of.device()); }

}  // namespace

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
    check_finite_weight(it->second, what, p.name);  // as every checkpoint loader does
  }
  for (const auto& [name, t] : w) {
    bool known = false;
    for (const ParamSpec& p : table) known |= p.name == name;
    HMLA_CHECK(known, ConfigError, what, ": unexpected tensor '", name, "' for this config",
               name == "softmax_offset" ? " (softmax_offset needs attention_sink: true)"
               : name.rfind("indexer.", 0) == 0 ? " (indexer tensors belong to the dsa modes)" : "");
  }
}

// kv_b_proj [H (Dn + Dv), Rkv] viewed per head: rows [0, Dn) are W_kb_h, rows [Dn, Dn + Dv) W_vb_h.
void split_kv_b_proj(AttnTensors& w, const ModelConfig& c) {
  const int64_t H = c.num_attention_heads, Rkv = c.kv_lora_rank, Dn = c.qk_nope_head_dim, Dv = c.v_head_dim;
  HMLA_CHECK(w.kv_b_proj.defined(), ConfigError, "split_kv_b_proj: kv_b_proj.weight is missing");
  const Tensor heads = w.kv_b_proj.view({H, Dn + Dv, Rkv});
  w.k_b_proj = like(w.kv_b_proj, {H, Rkv, Dn});
  w.v_b_proj = like(w.kv_b_proj, {H, Dv, Rkv});
  w.k_b_proj.copy_from(heads.slice(1, 0, Dn).transpose(1, 2));
  w.v_b_proj.copy_from(heads.slice(1, Dn, Dn + Dv));
  w.kv_b_proj = Tensor();
}

void fold_kv_b_proj(AttnTensors& w, const ModelConfig& c) {
  const int64_t H = c.num_attention_heads, Rkv = c.kv_lora_rank, Dn = c.qk_nope_head_dim, Dv = c.v_head_dim;
  HMLA_CHECK(w.k_b_proj.defined() && w.v_b_proj.defined(), ConfigError,
             "fold_kv_b_proj: k_b_proj.weight and v_b_proj.weight are required");
  w.kv_b_proj = like(w.k_b_proj, {H * (Dn + Dv), Rkv});
  const Tensor heads = w.kv_b_proj.view({H, Dn + Dv, Rkv});
  heads.slice(1, 0, Dn).copy_from(w.k_b_proj.transpose(1, 2));
  heads.slice(1, Dn, Dn + Dv).copy_from(w.v_b_proj);
  w.k_b_proj = w.v_b_proj = Tensor();
}

}  // namespace hmla
