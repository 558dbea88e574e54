// Model configuration: a Hugging Face DeepSeek-V3.2 config.json plus hmla's own keys (DESIGN.md
// section 2), validated when loaded. Fields transformers writes that hmla does not use (token ids,
// ...) are kept verbatim and written back.
#pragma once
#include "hmla/core/tensor.h"
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace hmla {

enum class LayerMode { mha, mqa_full_causal, dsa_warmup, dsa_sparse };
const char* mode_name(LayerMode m);
// Throws ConfigError naming `field` for an unknown mode.
LayerMode parse_mode(const std::string& s, const std::string& field);
inline bool is_dsa(LayerMode m) { return m == LayerMode::dsa_warmup || m == LayerMode::dsa_sparse; }

struct RopeConfig {
  double theta = 10000.0;
  std::string type = "default";  // "default" or "yarn"
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;  // 0: max_position_embeddings
  double beta_fast = 32.0, beta_slow = 1.0;
  double mscale = 0.0, mscale_all_dim = 0.0;  // 0: not set
  std::optional<double> attention_factor;      // explicit value wins over mscale rules
  bool truncate = true;
};

// The most layers a config may have. The largest published models have fewer than 200; the
// bound keeps what a config holds per layer (modes, MLP types) and every per-layer table built
// before the memory plan small (2^31 layers ended in "out of memory" while the config loaded).
// Whether the layers' weights fit is the memory plan's question (plan_parameters).
inline constexpr int64_t kMaxLayers = int64_t(1) << 16;

// DeepSeekMoE's fields (DESIGN.md section 9, docs/moe.md) with transformers 5.24's
// DeepseekV32Config defaults; read only when some layer is MoE. scoring_func (sigmoid) and
// topk_method (noaux_tc) are not kept: they have one accepted value each, which transformers
// computes whatever the file says.
struct MoeConfig {
  int64_t n_routed_experts = 256, n_shared_experts = 1, moe_intermediate_size = 2048;
  int64_t num_experts_per_tok = 8, n_group = 8, topk_group = 4;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 2.5;
  int64_t shared_intermediate() const { return n_shared_experts * moe_intermediate_size; }
};

// A published checkpoint's form (docs/moe.md, "Real checkpoints"): quantization_config's FP8
// block scales, which hmla dequantizes at read time and does not write back (it writes f32), and
// num_nextn_predict_layers, the multi-token-prediction layers model.layers.{num_hidden_layers + i}.*
// (DeepSeek-V4: mtp.{i}.*) that hmla carries as read and writes back (the field itself rides along in `source`).
struct CheckpointForm {
  bool fp8 = false;                      // quantization_config {"quant_method": "fp8", ...}
  int64_t block_rows = 128, block_cols = 128;  // its weight_block_size
  bool fp4_experts = false;              // expert_dtype "fp4" (DeepSeek-V4): I8 weights are packed e2m1
  int64_t num_nextn_predict_layers = 0;
};

// The model families (DESIGN.md sections 2 and 10): config.json's model_type. The two MLA families
// differ in the indexer's RoPE layout (DeepSeek-V3.2 rotate-half, GLM-5 interleaved pairs), in
// IndexShare (glm_moe_dsa's indexer_types) and in some of transformers' defaults (docs/config.md);
// deepseek_v4 is the DeepSeek-V4 stack (V4Config below, docs/deepseek_v4.md).
enum class ModelFamily { deepseek_v32, glm_moe_dsa, deepseek_v4 };
const char* family_name(ModelFamily f);

// DeepSeek-V4's per-layer attention kinds (DESIGN.md section 10), as transformers 5.24's
// layer_types names them, and hmla's hybrid_mla (PaddleFleet's compress ratio -2: the MLA layer of
// sections 1-6 inside the V4 block; transformers refuses the value); `compress_rate` is 0 for the
// sliding window and hybrid_mla.
enum class V4Kind { sliding, csa, hca, hybrid_mla };
const char* v4_kind_name(V4Kind k);
// The router's score function (scoring_func): sqrt(softplus(u)) or sigmoid(u). (DeepSeek's own
// code also has softmax; transformers 5.24's DeepseekV4 cannot build it: no such activation.)
enum class ScoringFunc { sqrtsoftplus, sigmoid };
const char* scoring_func_name(ScoringFunc f);

// What a deepseek_v4 config adds (transformers 5.24's DeepseekV4Config, its defaults; read by
// config_v4.cpp). The main RoPE (sliding layers) is ModelConfig::rope, the compress RoPE (layers
// with a compressor: their q, window keys, entries and indexer) is compress_rope; both rotate the
// last qk_rope_head_dim channels of head_dim as interleaved pairs. Every layer's MLP is MoE
// (ModelConfig::moe, one group, one shared expert of moe_intermediate_size); `hash` marks the
// hash_moe layers, which route by the frozen tid2eid[input_id].
// A hybrid_mla layer's own MLA geometry (PaddleFleet's hybrid_mla_* keys; docs/deepseek_v4.md);
// its indexer's heads and width are the model-wide index_n_heads / index_head_dim.
struct HybridMlaGeometry {
  int64_t q_lora_rank = 0, kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  int64_t num_attention_heads = 0, index_topk = 2048;
};

struct V4Config {
  int64_t head_dim = 512, qk_rope_head_dim = 64;
  int64_t o_groups = 8, o_lora_rank = 1024, sliding_window = 128;
  int64_t csa_rate = 4, hca_rate = 128;  // compress_rates
  std::vector<V4Kind> layer_types;       // one per layer
  HybridMlaGeometry hybrid;              // read when some layer (the MTP layers' too) is hybrid_mla
  std::vector<bool> hash;                // one per layer: mlp_layer_types == "hash_moe"
  // The multi-token-prediction layers (num_nextn_predict_layers; docs/deepseek_v4_math.md section
  // 14), computing as layers num_hidden_layers + i: their kinds and routing from the lists' last
  // entries where the config has them (mtp_listed; DeepSeek's releases do), else sliding_attention
  // and learned routing (DeepSeek-V4-Flash's released config gives its MTP layer compress ratio 0).
  std::vector<V4Kind> mtp_types;
  std::vector<bool> mtp_hash;
  bool mtp_listed = false;
  // Whether the MTP layers are parameters (mtp.{i}.* in the table, trained by mtp_loss_coeff) or
  // kept as stored (CheckpointForm). No config.json field: the trainer sets it for a programme
  // that trains them (docs/programme.md).
  bool mtp_params = false;
  int64_t hc_mult = 4, hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  ScoringFunc scoring = ScoringFunc::sqrtsoftplus;
  double swiglu_limit = 10.0;
  RopeConfig compress_rope;
  // Layer L's kind and routing, L < num_hidden_layers + num_nextn_predict_layers (the MTP layers
  // after the stack's).
  V4Kind kind(int64_t L) const {
    const size_t n = layer_types.size();
    return size_t(L) < n ? layer_types.at(size_t(L)) : mtp_types.at(size_t(L) - n);
  }
  bool hash_layer(int64_t L) const {
    const size_t n = hash.size();
    return size_t(L) < n ? hash.at(size_t(L)) : mtp_hash.at(size_t(L) - n);
  }
  int64_t compress_rate(int64_t L) const {
    const V4Kind k = kind(L);
    return k == V4Kind::csa ? csa_rate : k == V4Kind::hca ? hca_rate : 0;
  }
  bool is_hybrid_mla(int64_t L) const { return kind(L) == V4Kind::hybrid_mla; }
  bool has_hybrid_mla() const;  // some layer or MTP layer is hybrid_mla
};

struct ModelConfig {
  ModelFamily family = ModelFamily::deepseek_v32;
  int64_t hidden_size = 0, num_attention_heads = 0, num_hidden_layers = 0;
  int64_t vocab_size = 0, intermediate_size = 0, max_position_embeddings = 0;
  int64_t q_lora_rank = 0;  // 0: q_proj, no q LoRA
  int64_t kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  int64_t index_n_heads = 0, index_head_dim = 0, index_topk = 0, index_window = 0;
  int64_t pad_token_id = 0;
  int64_t first_k_dense_replace = 0;
  std::vector<std::string> mlp_layer_types;  // empty: derived from first_k_dense_replace
  MoeConfig moe;                             // the MoE layers' routing and sizes
  CheckpointForm form;                       // FP8 weights, MTP layers
  double rms_norm_eps = 1e-6, initializer_range = 0.02;
  bool tie_word_embeddings = false;
  RopeConfig rope;
  std::vector<LayerMode> layer_modes;  // hmla_layer_modes, one per layer
  // A V4 stack's MTP layers' mode (they compute as layers num_hidden_layers + i): the phase's in a
  // programme (set_modes), else the last stack layer with DSA machinery's (dsa_sparse without
  // hmla_layer_modes, as transformers runs CSA).
  LayerMode mtp_mode = LayerMode::mha;
  // IndexShare (DESIGN.md section 9): per layer "full" (its own indexer) or "shared" (no indexer;
  // dsa_sparse attends over the nearest earlier full layer's table). Empty: every layer full
  // (deepseek_v32, which has no such field).
  std::vector<std::string> indexer_types;
  double indexer_loss_coeff = 0.01;
  bool attention_sink = false;
  V4Config v4;            // family deepseek_v4 only
  nlohmann::json source;  // the file as read: unknown fields ride along on write

  bool is_v4() const { return family == ModelFamily::deepseek_v4; }
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  bool has_indexer_fields() const { return index_n_heads > 0 && index_head_dim > 0 && index_topk > 0; }
  // Layer L's MLP is MoE exactly when transformers builds DeepseekV32MoE there:
  // mlp_layer_types[L] == "sparse", or without that field L >= first_k_dense_replace (default 3).
  bool is_moe_layer(int64_t L) const {
    if (family == ModelFamily::deepseek_v4) return true;
    return mlp_layer_types.empty() ? L >= first_k_dense_replace : mlp_layer_types.at(size_t(L)) == "sparse";
  }
  bool indexer_shared(int64_t L) const { return !indexer_types.empty() && indexer_types.at(size_t(L)) == "shared"; }
  // The layer whose indexer's table layer L attends over: L itself when full, else the nearest
  // earlier full layer (validated to exist).
  int64_t indexer_source(int64_t L) const {
    while (indexer_shared(L)) --L;
    return L;
  }
  // Layer L has DSA machinery that a phase's mode drives (DESIGN.md sections 1 and 10): every layer
  // of an MLA model (hybrid_layers picks which follow the phase); in a V4 stack the CSA and
  // hybrid_mla layers, the MTP layers' (L >= num_hidden_layers: their kinds) too.
  bool has_dsa(int64_t L) const { return !is_v4() || v4.kind(L) == V4Kind::csa || v4.kind(L) == V4Kind::hybrid_mla; }
  // Layer L's mode (a V4 MTP layer's past the stack: mtp_mode).
  LayerMode mode(int64_t L) const {
    return is_v4() && L >= num_hidden_layers ? mtp_mode : layer_modes.at(size_t(L));
  }
  // Layer L computes an indexer (scores, selection, KL) in its current mode.
  bool runs_indexer(int64_t L) const { return has_dsa(L) && is_dsa(mode(L)) && !indexer_shared(L); }
  // GLM-5's indexer rotates interleaved pairs, DeepSeek-V3.2's rotate-half (DESIGN.md section 4).
  bool indexer_rope_interleaved() const { return family == ModelFamily::glm_moe_dsa; }
  bool has_moe_layers() const {
    for (int64_t L = 0; L < num_hidden_layers; ++L)
      if (is_moe_layer(L)) return true;
    return false;
  }
};

// Where the layers' modes come from: the file (hmla_layer_modes; without it DESIGN.md section 2's
// default, dsa_sparse everywhere when the index_* fields are set, else mha), or a programme,
// whose phases set them: the file's key is still checked, then every layer starts as mha.
enum class LayerModesFrom { config, programme };

// Parses and validates (ConfigError with the field's name on any problem); `what` names the
// source in messages.
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& what,
                               LayerModesFrom modes = LayerModesFrom::config);
ModelConfig load_model_config(const std::string& path, LayerModesFrom modes = LayerModesFrom::config);
// The HF config.json hmla writes: DeepSeek-V3.2 names, the MLP layout it read (a model without
// MoE layers: all dense), pad_token_id explicit.
nlohmann::json model_config_to_json(const ModelConfig& c);
void save_model_config(const std::string& path, const ModelConfig& c);

// The config DeepSeek-V4 layer L (a hybrid_mla layer) runs its MLA attention with (DESIGN.md
// section 10): c with the MLA geometry replaced by the hybrid_mla_* keys' (heads, ranks, head
// widths, index_topk), index_window = sliding_window (the forced window), attention_sink on (every
// V4 layer has a sink; it stays out of the KL target), indexer_loss_coeff and the main RoPE as c has
// them, and the layer's mode c.mode(L): MlaLayer runs on it unchanged. L may be an MTP layer's
// (num_hidden_layers + i, its kind mtp_types[i], its mode c.mtp_mode, which the derived config's
// layer_modes also holds at L). `source` is left empty.
ModelConfig hybrid_mla_config(const ModelConfig& c, int64_t L);

// ConfigError for a deepseek_v4 config in a command about the MLA layer itself (hmla layer, the
// context-parallel traffic bench): `what` names the config.
void check_mla_layers(const ModelConfig& c, const std::string& what);

// Sets every layer's mode (as `hmla layer --mode` does) and validates again. A deepseek_v4 config
// takes mha only: its layers run as transformers computes them (the CSA indexer's top-k, no KL);
// the DSA programme's modes on V4 stacks are DESIGN.md section 10's next step.
void set_all_modes(ModelConfig& c, LayerMode m);

// The one dispatch predicate (DESIGN.md section 1): does `layer` build the latent MQA backend?
bool latent_mqa_enabled(const ModelConfig& c, int64_t layer);

// RoPE for MLA and the indexer alike: inverse frequencies [Dr / 2] and the factor cos/sin are
// multiplied by (YaRN's attention factor, 1 otherwise); `softmax_scale` = m^2 / sqrt(Dn + Dr).
struct RopeTables {
  std::vector<double> inv_freq;
  double attention_factor = 1.0;
};
RopeTables rope_tables(const ModelConfig& c);
// The same for any RoPE of `dim` rotated channels (DeepSeek-V4's main and compress RoPEs);
// max_position_embeddings stands in for YaRN's original_max_position_embeddings when unset.
RopeTables rope_tables(const RopeConfig& r, int64_t dim, int64_t max_position_embeddings);

// cos/sin tables [s, Dr / 2] for positions pos0 .. pos0 + s - 1 (the token's index in its packed
// row; pos0 > 0 for a context-parallel shard), with the attention factor folded in: what the rope
// op takes, shared by the MLA layer and the indexer and computed once per forward.
struct RopeCache {
  Tensor cos, sin;  // f32 [s, Dr / 2]
};
RopeCache rope_cache(const ModelConfig& c, int64_t s, int64_t pos0 = 0);
RopeCache rope_cache(const RopeTables& t, int64_t s, int64_t pos0 = 0);
double softmax_scale(const ModelConfig& c);

}  // namespace hmla
