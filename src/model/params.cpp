#include "hmla/model/params.h"

namespace hmla {

namespace {
Tensor get(const io::TensorMap& w, const std::string& name) {
  auto it = w.find(name);
  return it == w.end() ? Tensor() : it->second;
}
}  // namespace

AttnTensors attn_tensors(const io::TensorMap& w) {
  AttnTensors a;
  a.q_a_proj = get(w, "q_a_proj.weight");
  a.q_a_layernorm = get(w, "q_a_layernorm.weight");
  a.q_b_proj = get(w, "q_b_proj.weight");
  a.q_proj = get(w, "q_proj.weight");
  a.kv_a_proj_with_mqa = get(w, "kv_a_proj_with_mqa.weight");
  a.kv_a_layernorm = get(w, "kv_a_layernorm.weight");
  a.kv_b_proj = get(w, "kv_b_proj.weight");
  a.k_b_proj = get(w, "k_b_proj.weight");
  a.v_b_proj = get(w, "v_b_proj.weight");
  a.o_proj = get(w, "o_proj.weight");
  a.softmax_offset = get(w, "softmax_offset");
  a.indexer.wq_b = get(w, "indexer.wq_b.weight");
  a.indexer.wk = get(w, "indexer.wk.weight");
  a.indexer.k_norm_weight = get(w, "indexer.k_norm.weight");
  a.indexer.k_norm_bias = get(w, "indexer.k_norm.bias");
  a.indexer.weights_proj = get(w, "indexer.weights_proj.weight");
  return a;
}

std::vector<Tensor*> fields(AttnTensors& a) {
  return {&a.q_a_proj, &a.q_a_layernorm, &a.q_b_proj, &a.q_proj, &a.kv_a_proj_with_mqa, &a.kv_a_layernorm,
          &a.kv_b_proj, &a.k_b_proj, &a.v_b_proj, &a.o_proj, &a.softmax_offset, &a.indexer.wq_b, &a.indexer.wk,
          &a.indexer.k_norm_weight, &a.indexer.k_norm_bias, &a.indexer.weights_proj};
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
