#include "hmla/model/params.h"

#include <set>

#include "hmla/core/error.h"

namespace hmla {

namespace {
Tensor get(const io::TensorMap& w, const std::string& name) {
  auto it = w.find(name);
  return it == w.end() ? Tensor() : it->second;
}
}  // namespace

void check_finite_weight(const Tensor& t, const std::string& what, const std::string& name) {
  const int64_t bad = first_non_finite(t);
  HMLA_CHECK(bad < 0, IoError, what, ": tensor '", name, "' holds a non-finite value (", t.data<float>()[bad],
             " at flat index ", bad, "); weights must be finite");
}

std::vector<std::string> unexpected_tensors(const std::vector<ParamSpec>& table, const io::TensorMap& w) {
  std::set<std::string> known;
  for (const ParamSpec& p : table) known.insert(p.name);
  std::vector<std::string> extra;
  for (const auto& [name, t] : w)
    if (!known.count(name)) extra.push_back(name);
  return extra;
}

// The names of fields(a)'s tensors, in the same order.
const std::vector<std::string>& attn_names() {
  static const std::vector<std::string> names{
      "q_a_proj.weight",         "q_a_layernorm.weight",  "q_b_proj.weight",      "q_proj.weight",
      "kv_a_proj_with_mqa.weight", "kv_a_layernorm.weight", "kv_b_proj.weight",     "k_b_proj.weight",
      "v_b_proj.weight",         "o_proj.weight",         "softmax_offset",       "indexer.wq_b.weight",
      "indexer.wk.weight",       "indexer.k_norm.weight", "indexer.k_norm.bias",  "indexer.weights_proj.weight"};
  return names;
}

std::vector<Tensor*> fields(AttnTensors& a) {
  return {&a.q_a_proj, &a.q_a_layernorm, &a.q_b_proj, &a.q_proj, &a.kv_a_proj_with_mqa, &a.kv_a_layernorm,
          &a.kv_b_proj, &a.k_b_proj, &a.v_b_proj, &a.o_proj, &a.softmax_offset, &a.indexer.wq_b, &a.indexer.wk,
          &a.indexer.k_norm_weight, &a.indexer.k_norm_bias, &a.indexer.weights_proj};
}

AttnTensors attn_tensors(const io::TensorMap& w) {
  AttnTensors a;
  const std::vector<Tensor*> f = fields(a);
  for (size_t i = 0; i < f.size(); ++i) *f[i] = get(w, attn_names()[i]);
  return a;
}

io::TensorMap attn_tensor_map(AttnTensors a) {
  io::TensorMap w;
  const std::vector<Tensor*> f = fields(a);
  for (size_t i = 0; i < f.size(); ++i)
    if (f[i]->defined()) w[attn_names()[i]] = *f[i];
  return w;
}

ModelTensors model_tensors(const io::TensorMap& w, int64_t layers, bool tied) {
  ModelTensors m;
  m.embed_tokens = get(w, "model.embed_tokens.weight");
  m.norm = get(w, "model.norm.weight");
  m.lm_head = tied ? m.embed_tokens : get(w, "lm_head.weight");
  for (int64_t L = 0; L < layers; ++L) {
    const std::string pre = "model.layers." + std::to_string(L) + ".";
    LayerTensors l;
    l.input_layernorm = get(w, pre + "input_layernorm.weight");
    l.post_attention_layernorm = get(w, pre + "post_attention_layernorm.weight");
    l.gate_proj = get(w, pre + "mlp.gate_proj.weight");
    l.up_proj = get(w, pre + "mlp.up_proj.weight");
    l.down_proj = get(w, pre + "mlp.down_proj.weight");
    auto swiglu = [&](const std::string& at) {
      return SwigluTensors{get(w, at + "gate_proj.weight"), get(w, at + "up_proj.weight"), get(w, at + "down_proj.weight")};
    };
    l.moe.gate = get(w, pre + "mlp.gate.weight");
    l.moe.e_score_correction_bias = get(w, pre + "mlp.gate.e_score_correction_bias");
    for (int64_t e = 0; l.moe.gate.defined(); ++e) {  // the experts are numbered from 0, without gaps
      SwigluTensors x = swiglu(pre + "mlp.experts." + std::to_string(e) + ".");
      if (!x.gate_proj.defined()) break;
      l.moe.experts.push_back(x);
    }
    l.moe.shared = swiglu(pre + "mlp.shared_experts.");
    io::TensorMap attn;
    const std::string ap = pre + "self_attn.";
    for (auto it = w.lower_bound(ap); it != w.end() && it->first.compare(0, ap.size(), ap) == 0; ++it)
      attn[it->first.substr(ap.size())] = it->second;
    l.attn = attn_tensors(attn);
    m.layers.push_back(l);
  }
  return m;
}

}  // namespace hmla
