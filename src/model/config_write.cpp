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

namespace {

json rope_params_json(const RopeConfig& r) {
  json o = {{"rope_type", r.type}, {"rope_theta", r.theta}};
  if (r.type != "yarn") return o;
  o["factor"] = r.factor;
  o["beta_fast"] = r.beta_fast;
  o["beta_slow"] = r.beta_slow;
  if (r.original_max_position_embeddings > 0) o["original_max_position_embeddings"] = r.original_max_position_embeddings;
  if (r.mscale != 0) o["mscale"] = r.mscale;
  if (r.mscale_all_dim != 0) o["mscale_all_dim"] = r.mscale_all_dim;
  if (r.attention_factor) o["attention_factor"] = *r.attention_factor;
  if (!r.truncate) o["truncate"] = false;
  return o;
}

// A deepseek_v4 config as transformers 5.24 writes one: modern names only (the legacy ones it
// folds in are dropped), rope_parameters nested {main, compress}; with hybrid_mla layers also their
// hybrid_mla_* geometry and indexer_loss_coeff, and layer_types with the MTP layers' kinds.
json v4_config_to_json(const ModelConfig& c) {
  json j = c.source.is_object() ? c.source : json::object();
  for (const char* legacy : {"compress_ratios", "compress_rate_csa", "compress_rate_hca", "num_hash_layers",
                             "qk_rope_head_dim", "rope_scaling", "num_local_experts", "quantization_config",
                             "expert_dtype"})  // hmla writes f32 weights
    j.erase(legacy);
  const V4Config& v = c.v4;
  j["model_type"] = family_name(c.family);
  for (auto [key, val] : {std::pair{"vocab_size", c.vocab_size}, std::pair{"hidden_size", c.hidden_size},
                          std::pair{"num_hidden_layers", c.num_hidden_layers}, std::pair{"num_attention_heads", c.num_attention_heads},
                          std::pair{"num_key_value_heads", int64_t(1)}, std::pair{"head_dim", v.head_dim},
                          std::pair{"q_lora_rank", c.q_lora_rank}, std::pair{"o_groups", v.o_groups},
                          std::pair{"o_lora_rank", v.o_lora_rank}, std::pair{"sliding_window", v.sliding_window},
                          std::pair{"index_n_heads", c.index_n_heads}, std::pair{"index_head_dim", c.index_head_dim},
                          std::pair{"index_topk", c.index_topk}, std::pair{"hc_mult", v.hc_mult},
                          std::pair{"hc_sinkhorn_iters", v.hc_sinkhorn_iters},
                          std::pair{"max_position_embeddings", c.max_position_embeddings},
                          std::pair{"n_routed_experts", c.moe.n_routed_experts}, std::pair{"n_shared_experts", c.moe.n_shared_experts},
                          std::pair{"moe_intermediate_size", c.moe.moe_intermediate_size},
                          std::pair{"num_experts_per_tok", c.moe.num_experts_per_tok},
                          std::pair{"num_nextn_predict_layers", c.form.num_nextn_predict_layers},
                          std::pair{"pad_token_id", c.pad_token_id}})
    j[key] = val;
  std::vector<std::string> kinds, mlp;
  const int64_t listed = c.num_hidden_layers + (v.mtp_listed ? int64_t(v.mtp_types.size()) : 0);  // as read
  for (int64_t L = 0; L < listed; ++L) {
    kinds.push_back(v4_kind_name(v.kind(L)));
    mlp.push_back(v.hash_layer(L) ? "hash_moe" : "moe");
  }
  if (v.has_hybrid_mla()) {  // hmla's own config (transformers refuses hybrid_mla): the MTP layers' kinds kept
    const HybridMlaGeometry& h = v.hybrid;
    for (auto [key, val] : {std::pair{"hybrid_mla_q_lora_rank", h.q_lora_rank},
                            std::pair{"hybrid_mla_kv_lora_rank", h.kv_lora_rank},
                            std::pair{"hybrid_mla_qk_nope_head_dim", h.qk_nope_head_dim},
                            std::pair{"hybrid_mla_qk_rope_head_dim", h.qk_rope_head_dim},
                            std::pair{"hybrid_mla_v_head_dim", h.v_head_dim},
                            std::pair{"hybrid_mla_num_attention_heads", h.num_attention_heads},
                            std::pair{"hybrid_mla_index_topk", h.index_topk}})
      j[key] = val;
    j["indexer_loss_coeff"] = c.indexer_loss_coeff;
  }
  j["layer_types"] = kinds;
  j["mlp_layer_types"] = mlp;
  j["compress_rates"] = {{v4_kind_name(V4Kind::csa), v.csa_rate}, {v4_kind_name(V4Kind::hca), v.hca_rate}};
  j["hc_eps"] = v.hc_eps;
  j["swiglu_limit"] = v.swiglu_limit;
  j["scoring_func"] = scoring_func_name(v.scoring);
  j["norm_topk_prob"] = c.moe.norm_topk_prob;
  j["routed_scaling_factor"] = c.moe.routed_scaling_factor;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["initializer_range"] = c.initializer_range;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  const double prf = double(v.qk_rope_head_dim) / double(v.head_dim);
  j["partial_rotary_factor"] = prf;
  j["rope_theta"] = c.rope.theta;
  j["compress_rope_theta"] = v.compress_rope.theta;
  json main = rope_params_json(c.rope), comp = rope_params_json(v.compress_rope);
  main["partial_rotary_factor"] = comp["partial_rotary_factor"] = prf;
  j["rope_parameters"] = {{"main", main}, {"compress", comp}};
  std::vector<std::string> modes;
  for (LayerMode m : c.layer_modes) modes.push_back(mode_name(m));
  j["hmla_layer_modes"] = modes;
  return j;
}

}  // namespace

json model_config_to_json(const ModelConfig& c) {
  if (c.is_v4()) return v4_config_to_json(c);
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
  j["rope_parameters"] = rope_params_json(c.rope);
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
