// config.json as hmla writes it (config.h, model_config_to_json): the source config's fields kept,
// hmla's values over them in DeepSeek-V3.2 names, the MLP layout per layer, the RoPE parameters in
// transformers' form, the layer modes; written atomically.
#include <string>
#include <vector>

#include "hmla/io/json_strict.h"
#include "hmla/io/safetensors.h"
#include "hmla/model/config.h"

namespace hmla {

using nlohmann::json;

json model_config_to_json(const ModelConfig& c) {
  json j = c.source.is_object() ? c.source : json::object();
  j["model_type"] = family_name(c.family);
  if (!c.indexer_types.empty()) j["indexer_types"] = c.indexer_types;  // as transformers writes it
  j["hidden_size"] = c.hidden_size;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_hidden_layers"] = c.num_hidden_layers;
  if (c.vocab_size > 0) j["vocab_size"] = c.vocab_size;
  if (c.intermediate_size > 0) j["intermediate_size"] = c.intermediate_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["q_lora_rank"] = c.q_lora_rank > 0 ? json(c.q_lora_rank) : json();
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["qk_nope_head_dim"] = c.qk_nope_head_dim;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["v_head_dim"] = c.v_head_dim;
  if (c.has_indexer_fields()) {
    j["index_n_heads"] = c.index_n_heads;
    j["index_head_dim"] = c.index_head_dim;
    j["index_topk"] = c.index_topk;
  }
  j["pad_token_id"] = c.pad_token_id;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["initializer_range"] = c.initializer_range;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (!c.has_moe_layers()) {  // as hmla wrote dense models before MoE layers
    j["first_k_dense_replace"] = c.num_hidden_layers;
    j["mlp_layer_types"] = std::vector<std::string>(c.num_hidden_layers, "dense");
  } else {  // the layout read, per layer, as transformers writes it
    std::vector<std::string> types;
    for (int64_t L = 0; L < c.num_hidden_layers; ++L) types.push_back(c.is_moe_layer(L) ? "sparse" : "dense");
    j["first_k_dense_replace"] = c.first_k_dense_replace;
    j["mlp_layer_types"] = types;
    j.erase("num_experts");  // transformers' old name; n_routed_experts below says it
    j.erase("num_local_experts");
    j["n_routed_experts"] = c.moe.n_routed_experts;
    j["n_shared_experts"] = c.moe.n_shared_experts;
    j["moe_intermediate_size"] = c.moe.moe_intermediate_size;
    j["num_experts_per_tok"] = c.moe.num_experts_per_tok;
    j["n_group"] = c.moe.n_group;
    j["topk_group"] = c.moe.topk_group;
    j["norm_topk_prob"] = c.moe.norm_topk_prob;
    j["routed_scaling_factor"] = c.moe.routed_scaling_factor;
  }
  j["rope_theta"] = c.rope.theta;
  if (c.rope.type == "yarn") {
    json r = {{"rope_type", "yarn"}, {"rope_theta", c.rope.theta}, {"factor", c.rope.factor},
              {"beta_fast", c.rope.beta_fast}, {"beta_slow", c.rope.beta_slow}};
    if (c.rope.original_max_position_embeddings > 0)
      r["original_max_position_embeddings"] = c.rope.original_max_position_embeddings;
    if (c.rope.mscale != 0) r["mscale"] = c.rope.mscale;
    if (c.rope.mscale_all_dim != 0) r["mscale_all_dim"] = c.rope.mscale_all_dim;
    if (c.rope.attention_factor) r["attention_factor"] = *c.rope.attention_factor;
    if (!c.rope.truncate) r["truncate"] = false;
    j["rope_parameters"] = r;
  } else {
    j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", c.rope.theta}};
  }
  j.erase("rope_scaling");
  j.erase("quantization_config");  // hmla writes the dequantized weights (f32): README
  std::vector<std::string> modes;
  for (LayerMode m : c.layer_modes) modes.push_back(mode_name(m));
  j["hmla_layer_modes"] = modes;
  j["indexer_loss_coeff"] = c.indexer_loss_coeff;
  j["index_window"] = c.index_window;
  j["attention_sink"] = c.attention_sink;
  return j;
}

void save_model_config(const std::string& path, const ModelConfig& c) {
  io::write_file_atomic(path, model_config_to_json(c).dump(2) + "\n");
}

}  // namespace hmla
