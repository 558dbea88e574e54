// config.json parsing and validation (DESIGN.md section 2): every field checked with its name in
// the message, DeepSeek-V3.2 and GLM-5 names, the layer modes, IndexShare's indexer_types. Writing
// it back is config_write.cpp's; the RoPE/YaRN tables are rope.cpp's.
#include "hmla/model/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include "hmla/core/error.h"
#include "hmla/core/size_check.h"
#include "hmla/io/json_strict.h"
#include "hmla/io/safetensors.h"
#include "config_fields.h"

namespace hmla {

using nlohmann::json;

const char* mode_name(LayerMode m) {
  switch (m) {
    case LayerMode::mha: return "mha";
    case LayerMode::mqa_full_causal: return "mqa_full_causal";
    case LayerMode::dsa_warmup: return "dsa_warmup";
    case LayerMode::dsa_sparse: return "dsa_sparse";
  }
  return "?";
}

LayerMode parse_mode(const std::string& s, const std::string& field) {
  for (LayerMode m : {LayerMode::mha, LayerMode::mqa_full_causal, LayerMode::dsa_warmup, LayerMode::dsa_sparse})
    if (s == mode_name(m)) return m;
  throw ConfigError(field + ": unknown mode '" + s +
                    "'; use one of mha, mqa_full_causal, dsa_warmup, dsa_sparse");
}

const char* family_name(ModelFamily f) {
  switch (f) {
    case ModelFamily::deepseek_v32: return "deepseek_v32";
    case ModelFamily::glm_moe_dsa: return "glm_moe_dsa";
    case ModelFamily::deepseek_v4: return "deepseek_v4";
  }
  return "?";
}

namespace cfg {

// Reads an optional integer field; null counts as absent.
int64_t get_int(const json& j, const char* key, int64_t def, const std::string& what) {
  if (!j.contains(key) || j[key].is_null()) return def;
  HMLA_CHECK(j[key].is_number_integer(), ConfigError, what, ": ", key, " must be an integer, got ",
             j[key].dump());
  HMLA_CHECK(!j[key].is_number_unsigned() || j[key].get<uint64_t>() <= uint64_t(INT64_MAX), ConfigError, what,
             ": ", key, " = ", j[key].dump(), " does not fit int64");
  return j[key].get<int64_t>();
}

double get_num(const json& j, const char* key, double def, const std::string& what) {
  if (!j.contains(key) || j[key].is_null()) return def;
  HMLA_CHECK(j[key].is_number(), ConfigError, what, ": ", key, " must be a number, got ", j[key].dump());
  return j[key].get<double>();
}

bool get_bool(const json& j, const char* key, bool def, const std::string& what) {
  if (!j.contains(key) || j[key].is_null()) return def;
  HMLA_CHECK(j[key].is_boolean(), ConfigError, what, ": ", key, " must be true or false, got ",
             j[key].dump());
  return j[key].get<bool>();
}

int64_t need_positive(const json& j, const char* key, const std::string& what) {
  HMLA_CHECK(j.contains(key) && !j[key].is_null(), ConfigError, what, ": ", key,
             " is required");
  int64_t v = get_int(j, key, 0, what);
  HMLA_CHECK(v > 0, ConfigError, what, ": ", key, " = ", v, ": it must be at least 1");
  return v;
}

// YaRN stretches a model trained on original_max_position_embeddings tokens by `factor`. Real
// configs use 4 to 40 (DeepSeek-V3: 40); 2^16 (a 4k-token model stretched to 256M tokens) is far
// past any context a model runs, and beyond it the interpolated frequencies 1 / (factor theta^i)
// and ln(factor) in the attention factor stop meaning anything (1e308 gave frequencies of 0).
constexpr double kMaxYarnFactor = 65536;

// The YaRN fields hold the values transformers' _compute_yarn_parameters can mean: a stretch
// (factor >= 1: < 1 would compress), a frequency ramp from beta_fast down to beta_slow rotations
// (both > 0, beta_fast >= beta_slow, or the ramp runs backwards), and magnitudes m >= 0 (the
// attention factor 0.1 m ln(factor) + 1 turns <= 0 for a negative m such as -50).
void check_yarn(const RopeConfig& r, const std::string& f) {
  HMLA_CHECK(std::isfinite(r.factor) && r.factor >= 1 && r.factor <= kMaxYarnFactor, ConfigError, f, ".factor = ",
             r.factor, ": it must be in [1, ", kMaxYarnFactor, "] (YaRN stretches the context by it)");
  HMLA_CHECK(std::isfinite(r.beta_fast) && std::isfinite(r.beta_slow) && r.beta_slow > 0, ConfigError, f,
             ": beta_fast = ", r.beta_fast, ", beta_slow = ", r.beta_slow, ": both must be finite and positive");
  HMLA_CHECK(r.beta_fast >= r.beta_slow, ConfigError, f, ": beta_fast = ", r.beta_fast, " is smaller than beta_slow = ",
             r.beta_slow, "; YaRN's ramp runs from beta_fast rotations down to beta_slow (defaults 32 and 1)");
  for (auto [key, v] : {std::pair{"mscale", r.mscale}, std::pair{"mscale_all_dim", r.mscale_all_dim}})
    HMLA_CHECK(std::isfinite(v) && v >= 0, ConfigError, f, ".", key, " = ", v,
               ": it must be finite and >= 0 (0 or absent: not set)");
  if (r.attention_factor)
    HMLA_CHECK(std::isfinite(*r.attention_factor) && *r.attention_factor > 0, ConfigError, f, ".attention_factor = ",
               *r.attention_factor, ": it must be finite and positive");
}

RopeConfig parse_rope_params(const json& p, RopeConfig r, const std::string& f) {
  HMLA_CHECK(p.is_object(), ConfigError, f, " must be an object");
  r.theta = get_num(p, "rope_theta", r.theta, f);
  std::string type = "default";
  for (const char* k : {"type", "rope_type"})
    if (p.contains(k)) {
      HMLA_CHECK(p[k].is_string(), ConfigError, f, ".", k, " must be a string, got ", p[k].dump());
      type = p[k].get<std::string>();
    }
  HMLA_CHECK(type == "default" || type == "yarn", ConfigError, f, ".rope_type = '", type,
             "': hmla supports 'default' and 'yarn'");
  r.type = type;
  r.factor = get_num(p, "factor", 1.0, f);
  r.original_max_position_embeddings = get_int(p, "original_max_position_embeddings", 0, f);
  r.beta_fast = get_num(p, "beta_fast", 32.0, f);
  r.beta_slow = get_num(p, "beta_slow", 1.0, f);
  r.mscale = get_num(p, "mscale", 0.0, f);
  r.mscale_all_dim = get_num(p, "mscale_all_dim", 0.0, f);
  if (p.contains("attention_factor") && !p["attention_factor"].is_null())
    r.attention_factor = get_num(p, "attention_factor", 1.0, f);
  r.truncate = get_bool(p, "truncate", true, f);
  if (type == "yarn") {
    const bool given = p.contains("original_max_position_embeddings") && !p["original_max_position_embeddings"].is_null();
    HMLA_CHECK(!given || r.original_max_position_embeddings >= 1, ConfigError, f,
               ".original_max_position_embeddings = ", r.original_max_position_embeddings,
               ": it must be >= 1 (omit it to use max_position_embeddings)");
    check_yarn(r, f);
  }
  return r;
}

const json* rope_object(const json& j, const char** field) {
  for (const char* k : {"rope_parameters", "rope_scaling"})
    if (j.contains(k) && !j[k].is_null()) {
      *field = k;
      return &j[k];
    }
  return nullptr;
}

namespace {
RopeConfig parse_rope(const json& j, const std::string& what) {
  RopeConfig r;
  r.theta = get_num(j, "rope_theta", 10000.0, what);
  const char* field = "";
  if (const json* p = rope_object(j, &field)) r = parse_rope_params(*p, r, what + ": " + field);
  HMLA_CHECK(std::isfinite(r.theta) && r.theta > 0, ConfigError, what, ": rope_theta = ", r.theta,
             ": it must be finite and positive");
  return r;
}
}  // namespace

// An optional string field that has one accepted value (null counts as absent).
void check_only(const json& j, const char* key, const char* value, const std::string& what, const char* why) {
  if (!j.contains(key) || j[key].is_null()) return;
  HMLA_CHECK(j[key].is_string() && j[key].get<std::string>() == value, ConfigError, what, ": ", key, " = ",
             j[key].dump(), ": hmla supports only \"", value, "\" (", why, ")");
}

}  // namespace cfg

namespace {
using namespace cfg;

// The MoE fields as transformers 5.24's DeepseekV32Config reads them: its defaults, `num_experts`
// (its backward-compatible name) overriding n_routed_experts, and `num_local_experts` (its
// attribute alias) when n_routed_experts is absent. Checked as DeepseekV32TopkRouter needs them;
// anything it would compute differently or fail on is refused here, naming the field.
MoeConfig parse_moe(const json& j, const std::string& what, ModelFamily family) {
  MoeConfig m;
  if (family == ModelFamily::glm_moe_dsa) m.n_group = m.topk_group = 1;  // GlmMoeDsaConfig's defaults
  m.n_routed_experts = get_int(j, "num_local_experts", m.n_routed_experts, what);
  m.n_routed_experts = get_int(j, "n_routed_experts", m.n_routed_experts, what);
  m.n_routed_experts = get_int(j, "num_experts", m.n_routed_experts, what);
  m.n_shared_experts = get_int(j, "n_shared_experts", m.n_shared_experts, what);
  m.moe_intermediate_size = get_int(j, "moe_intermediate_size", m.moe_intermediate_size, what);
  m.num_experts_per_tok = get_int(j, "num_experts_per_tok", m.num_experts_per_tok, what);
  m.n_group = get_int(j, "n_group", m.n_group, what);
  m.topk_group = get_int(j, "topk_group", m.topk_group, what);
  m.norm_topk_prob = get_bool(j, "norm_topk_prob", m.norm_topk_prob, what);
  m.routed_scaling_factor = get_num(j, "routed_scaling_factor", m.routed_scaling_factor, what);
  check_only(j, "scoring_func", "sigmoid", what, "DeepseekV32TopkRouter scores experts by sigmoid");
  check_only(j, "topk_method", "noaux_tc", what,
             "group-limited top-k on scores + e_score_correction_bias, as DeepseekV32TopkRouter chooses");
  for (auto [key, v] : {std::pair{"n_routed_experts", m.n_routed_experts}, std::pair{"n_group", m.n_group},
                        std::pair{"topk_group", m.topk_group}, std::pair{"num_experts_per_tok", m.num_experts_per_tok},
                        std::pair{"moe_intermediate_size", m.moe_intermediate_size}})
    HMLA_CHECK(v >= 1, ConfigError, what, ": ", key, " = ", v, ": it must be at least 1 (a MoE layer needs it)");
  HMLA_CHECK(m.n_shared_experts >= 0, ConfigError, what, ": n_shared_experts = ", m.n_shared_experts,
             ": it must be >= 0");
  HMLA_CHECK(m.n_routed_experts % m.n_group == 0, ConfigError, what, ": n_group = ", m.n_group,
             " does not divide n_routed_experts = ", m.n_routed_experts, "; the router splits the experts into n_group equal groups");
  HMLA_CHECK(m.n_routed_experts / m.n_group >= 2, ConfigError, what, ": n_group = ", m.n_group, " leaves ",
             m.n_routed_experts / m.n_group, " expert per group; a group is scored by its top 2, so use n_group <= ",
             m.n_routed_experts / 2);
  HMLA_CHECK(m.topk_group <= m.n_group, ConfigError, what, ": topk_group = ", m.topk_group, " exceeds n_group = ",
             m.n_group, "; the router keeps topk_group of the n_group groups");
  HMLA_CHECK(m.num_experts_per_tok <= m.topk_group * (m.n_routed_experts / m.n_group), ConfigError, what,
             ": num_experts_per_tok = ", m.num_experts_per_tok, " exceeds the ", m.topk_group * (m.n_routed_experts / m.n_group),
             " experts of topk_group = ", m.topk_group, " groups of ", m.n_routed_experts / m.n_group);
  HMLA_CHECK(std::isfinite(m.routed_scaling_factor) && m.routed_scaling_factor > 0, ConfigError, what,
             ": routed_scaling_factor = ", m.routed_scaling_factor, ": it must be finite and positive");
  HMLA_CHECK(m.n_routed_experts < (int64_t(1) << 31), ConfigError, what, ": n_routed_experts = ", m.n_routed_experts,
             ": hmla numbers experts in int32");
  return m;
}

}  // namespace

namespace cfg {

// quantization_config as DeepSeek-V3.2's release writes it (transformers' FineGrainedFP8Config):
// quant_method "fp8", fmt "e4m3" (absent: e4m3), weight_block_size two positive ints (absent:
// [128, 128], transformers' default), activation_scheme "dynamic" (a static scheme carries input
// scales hmla does not read). Anything else is a ConfigError naming the field.
void parse_quantization(CheckpointForm& f, const json& j, const std::string& what) {
  if (!j.contains("quantization_config") || j["quantization_config"].is_null()) return;
  const json& q = j["quantization_config"];
  const std::string w = what + ": quantization_config";
  HMLA_CHECK(q.is_object(), ConfigError, w, " must be an object");
  HMLA_CHECK(q.contains("quant_method") && q["quant_method"] == "fp8", ConfigError, w, ".quant_method = ",
             q.value("quant_method", json()).dump(), ": hmla reads \"fp8\" (e4m3 weights with block scales) only");
  check_only(q, "fmt", "e4m3", w, "the weights are F8_E4M3");
  check_only(q, "activation_scheme", "dynamic", w, "hmla dequantizes the weights and reads no activation scales");
  // DeepSeek-V4's release: power-of-two scales (F8_E8M0), and its routed experts in packed FP4
  // (expert_dtype "fp4": top level in V4's config.json, which transformers folds in here).
  const json scale_fmt = q.value("scale_fmt", json());
  HMLA_CHECK(scale_fmt.is_null() || scale_fmt == "float" || scale_fmt == "ue8m0", ConfigError, w, ".scale_fmt = ",
             scale_fmt.dump().substr(0, 60), ": hmla reads \"float\" and \"ue8m0\" (FineGrainedFP8Config's values)");
  json expert_dtype = q.value("expert_dtype", json());
  if (expert_dtype.is_null() && j.contains("expert_dtype")) expert_dtype = j["expert_dtype"];
  HMLA_CHECK(expert_dtype.is_null() || expert_dtype == "fp8" || expert_dtype == "fp4", ConfigError, what,
             ": expert_dtype = ", expert_dtype.dump().substr(0, 60), ": hmla reads \"fp8\" and \"fp4\"");
  f.fp4_experts = expert_dtype == "fp4";
  if (q.contains("weight_block_size") && !q["weight_block_size"].is_null()) {
    const json& b = q["weight_block_size"];
    HMLA_CHECK(b.is_array() && b.size() == 2 && b[0].is_number_integer() && b[1].is_number_integer() &&
                   b[0].get<int64_t>() >= 1 && b[1].get<int64_t>() >= 1,
               ConfigError, w, ".weight_block_size = ", b.dump().substr(0, 60), ": it must be two positive integers");
    f.block_rows = b[0].get<int64_t>();
    f.block_cols = b[1].get<int64_t>();
  }
  f.fp8 = true;
}

CheckpointForm parse_checkpoint_form(const json& j, const std::string& what) {
  CheckpointForm f;
  parse_quantization(f, j, what);
  f.num_nextn_predict_layers = get_int(j, "num_nextn_predict_layers", 0, what);
  HMLA_CHECK(f.num_nextn_predict_layers >= 0 && f.num_nextn_predict_layers <= kMaxLayers, ConfigError, what,
             ": num_nextn_predict_layers = ", f.num_nextn_predict_layers, ": it must be in [0, ", kMaxLayers, "]");
  return f;
}

}  // namespace cfg

namespace {

// Every weight's element count from the fields that drive it, in checked arithmetic: a config
// whose sizes overflow int64 is refused here, naming the fields, before any table or shape is
// built from them. (Whether the sizes fit in memory is the MemoryPlan's question.)
void check_sizes(const ModelConfig& c, const std::string& what) {
  const std::string f = what + ": the sizes of";
  const int64_t Dqk = checked_add(c.qk_nope_head_dim, c.qk_rope_head_dim, f + " qk_nope_head_dim + qk_rope_head_dim");
  const int64_t Dkv = checked_add(c.qk_nope_head_dim, c.v_head_dim, f + " qk_nope_head_dim + v_head_dim");
  const int64_t Wa = checked_add(c.kv_lora_rank, c.qk_rope_head_dim, f + " kv_lora_rank + qk_rope_head_dim");
  checked_add(c.index_topk, c.index_window, f + " index_topk + index_window");
  const SizeFactor H{"num_attention_heads", c.num_attention_heads}, hid{"hidden_size", c.hidden_size};
  const SizeFactor q_in = c.q_lora_rank > 0 ? SizeFactor{"q_lora_rank", c.q_lora_rank} : hid;
  checked_product({{"vocab_size", c.vocab_size}, hid}, f + " model.embed_tokens");
  checked_product({H, {"qk_nope_head_dim + qk_rope_head_dim", Dqk}, q_in}, f + " the q projection");
  checked_product({{"kv_lora_rank + qk_rope_head_dim", Wa}, hid}, f + " kv_a_proj_with_mqa");
  checked_product({H, {"qk_nope_head_dim + v_head_dim", Dkv}, {"kv_lora_rank", c.kv_lora_rank}}, f + " kv_b_proj");
  checked_product({hid, H, {"v_head_dim", c.v_head_dim}}, f + " o_proj");
  checked_product({{"intermediate_size", c.intermediate_size}, hid}, f + " the MLP");
  checked_product({{"index_n_heads", c.index_n_heads}, {"index_head_dim", c.index_head_dim}, q_in},
                  f + " indexer.wq_b");
  if (!c.has_moe_layers()) return;
  const SizeFactor I{"moe_intermediate_size", c.moe.moe_intermediate_size};
  checked_product({{"n_routed_experts", c.moe.n_routed_experts}, {"3", 3}, I, hid}, f + " the routed experts");
  checked_product({{"n_shared_experts", c.moe.n_shared_experts}, {"3", 3}, I, hid}, f + " the shared experts");
  checked_product({{"n_routed_experts", c.moe.n_routed_experts}, hid}, f + " mlp.gate");
  checked_product({{"num_experts_per_tok", c.moe.num_experts_per_tok}, I}, f + " the per-expert activations");
}

ModelFamily parse_family(const json& j, const std::string& what) {
  if (!j.contains("model_type") || j["model_type"].is_null()) return ModelFamily::deepseek_v32;
  for (ModelFamily f : {ModelFamily::deepseek_v32, ModelFamily::glm_moe_dsa, ModelFamily::deepseek_v4})
    if (j["model_type"] == family_name(f)) return f;
  throw ConfigError(what + ": model_type = " + j["model_type"].dump().substr(0, 60) +
                    ": hmla reads \"deepseek_v32\", \"glm_moe_dsa\" and \"deepseek_v4\"");
}

// glm_moe_dsa's indexer_types as GlmMoeDsaConfig reads them: the list itself; without it
// index_topk_pattern ("F"/"S" per layer, or a list of names); without that the pattern of
// index_topk_freq (default 1, below 1 read as 1) and index_skip_topk_offset (default 2): layer i
// (0-based) is full when max(i + 1 - offset, 0) % freq == 0. Megatron-LM's equivalent fields
// (dsa_indexer_topk_freq, dsa_indexer_skip_topk_offset) default to 1 and 0, and Megatron reads an
// offset of 0 as 1; transformers does not (offset 0 with freq > 1 makes layer 0 shared, an error).
std::vector<std::string> parse_indexer_types(const json& j, int64_t layers, const std::string& what) {
  const std::string f = what + ": indexer_types";
  std::vector<std::string> types;
  if (j.contains("indexer_types") && !j["indexer_types"].is_null()) {
    const json& t = j["indexer_types"];
    HMLA_CHECK(t.is_array() && std::all_of(t.begin(), t.end(), [](const json& e) { return e.is_string(); }), ConfigError,
               f, " must be a list of strings (\"full\" or \"shared\"), got ", t.dump().substr(0, 80));
    types = t.get<std::vector<std::string>>();
  } else if (j.contains("index_topk_pattern") && !j["index_topk_pattern"].is_null()) {
    const json& p = j["index_topk_pattern"];
    HMLA_CHECK(p.is_string() || p.is_array(), ConfigError, what, ": index_topk_pattern must be a string of F and S or a list, got ",
               p.dump().substr(0, 80));
    if (p.is_string()) {
      for (char ch : p.get<std::string>()) {
        HMLA_CHECK(ch == 'F' || ch == 'S', ConfigError, what, ": index_topk_pattern holds '", std::string(1, ch),
                   "'; use F (full) and S (shared)");
        types.push_back(ch == 'F' ? "full" : "shared");
      }
    } else {
      HMLA_CHECK(std::all_of(p.begin(), p.end(), [](const json& e) { return e.is_string(); }), ConfigError, what,
                 ": index_topk_pattern must be a list of strings");
      types = p.get<std::vector<std::string>>();
    }
  } else {
    const int64_t freq = std::max<int64_t>(get_int(j, "index_topk_freq", 1, what), 1);
    const int64_t offset = get_int(j, "index_skip_topk_offset", 2, what);
    HMLA_CHECK(offset >= 0 && offset <= kMaxLayers, ConfigError, what, ": index_skip_topk_offset = ", offset,
               ": it must be in [0, ", kMaxLayers, "]");
    for (int64_t i = 0; i < layers; ++i)
      types.push_back(std::max<int64_t>(i + 1 - offset, 0) % freq == 0 ? "full" : "shared");
  }
  HMLA_CHECK(int64_t(types.size()) == layers, ConfigError, f, " has ", types.size(), " entries for num_hidden_layers = ",
             layers);
  for (size_t L = 0; L < types.size(); ++L)
    HMLA_CHECK(types[L] == "full" || types[L] == "shared", ConfigError, f, "[", L, "] = '", types[L].substr(0, 40),
               "': use \"full\" or \"shared\"");
  HMLA_CHECK(types.empty() || types[0] == "full", ConfigError, f, "[0] = 'shared': a shared layer reuses the nearest earlier "
             "full layer's top-k, and layer 0 has none");
  return types;
}

// IndexShare in the layers' modes: a shared layer in dsa_sparse attends over its source's table,
// so the source must select in that forward (run dsa_sparse too).
void check_index_share(const ModelConfig& c, const std::string& what) {
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) {
    if (!c.indexer_shared(L) || c.layer_modes[L] != LayerMode::dsa_sparse) continue;
    const int64_t src = c.indexer_source(L);
    HMLA_CHECK(c.layer_modes[src] == LayerMode::dsa_sparse, ConfigError, what, ": layer ", L,
               " is 'shared' in indexer_types and runs dsa_sparse over the top-k of layer ", src, ", which runs ",
               mode_name(c.layer_modes[src]), "; run layer ", src, " in dsa_sparse too (or make layer ", L, " full)");
  }
}

void validate(const ModelConfig& c, const std::string& what) {
  check_sizes(c, what);
  HMLA_CHECK(c.qk_rope_head_dim % 2 == 0, ConfigError, what, ": qk_rope_head_dim = ",
             c.qk_rope_head_dim, " is odd; RoPE rotates pairs, so it must be even");
  HMLA_CHECK(c.q_lora_rank >= 0, ConfigError, what, ": q_lora_rank = ", c.q_lora_rank,
             ": use 0 (or null) for no q LoRA, or a positive rank");
  HMLA_CHECK(c.pad_token_id >= 0, ConfigError, what, ": pad_token_id = ", c.pad_token_id,
             " is negative");
  HMLA_CHECK(c.vocab_size == 0 || c.pad_token_id < c.vocab_size, ConfigError, what, ": pad_token_id = ",
             c.pad_token_id, " is not a token of the vocabulary [0, ", c.vocab_size, ")");
  HMLA_CHECK(std::isfinite(c.initializer_range) && c.initializer_range >= 0, ConfigError, what,
             ": initializer_range = ", c.initializer_range, ": it must be finite and >= 0 (a standard deviation)");
  HMLA_CHECK(static_cast<int64_t>(c.layer_modes.size()) == c.num_hidden_layers, ConfigError, what,
             ": hmla_layer_modes has ", c.layer_modes.size(), " entries for num_hidden_layers = ",
             c.num_hidden_layers);
  HMLA_CHECK(c.index_window >= 0, ConfigError, what, ": index_window = ", c.index_window,
             ": it must be >= 0");
  HMLA_CHECK(c.indexer_loss_coeff >= 0, ConfigError, what, ": indexer_loss_coeff must be >= 0");
  for (size_t L = 0; L < c.layer_modes.size(); ++L) {
    if (!is_dsa(c.layer_modes[L])) continue;
    const std::string m = std::string("layer ") + std::to_string(L) + " runs " + mode_name(c.layer_modes[L]);
    HMLA_CHECK(c.index_n_heads > 0 && c.index_head_dim > 0 && c.index_topk > 0, ConfigError, what,
               ": ", m, ", which needs index_n_heads, index_head_dim and index_topk (each >= 1)");
    HMLA_CHECK(c.q_lora_rank > 0, ConfigError, what, ": ", m,
               " with q_lora_rank 0; the indexer reads the q latent, so set q_lora_rank >= 1");
    HMLA_CHECK(c.index_head_dim >= c.qk_rope_head_dim, ConfigError, what, ": index_head_dim = ",
               c.index_head_dim, " is smaller than qk_rope_head_dim = ", c.qk_rope_head_dim,
               "; the indexer ropes its first qk_rope_head_dim channels");
    HMLA_CHECK(c.index_head_dim % 2 == 0, ConfigError, what, ": index_head_dim must be even");
  }
  check_index_share(c, what);
}

}  // namespace

static ModelConfig parse_fields(const json& j, const std::string& what, LayerModesFrom modes) {
  HMLA_CHECK(j.is_object(), ConfigError, what, ": a config must be a JSON object");
  if (parse_family(j, what) == ModelFamily::deepseek_v4) return cfg::parse_v4_fields(j, what, modes);
  ModelConfig c;
  c.source = j;
  c.family = parse_family(j, what);
  c.hidden_size = need_positive(j, "hidden_size", what);
  c.num_attention_heads = need_positive(j, "num_attention_heads", what);
  c.num_hidden_layers = need_positive(j, "num_hidden_layers", what);
  HMLA_CHECK(c.num_hidden_layers <= kMaxLayers, ConfigError, what, ": num_hidden_layers = ", c.num_hidden_layers,
             ": hmla builds at most ", kMaxLayers, " layers");
  c.kv_lora_rank = need_positive(j, "kv_lora_rank", what);
  c.qk_nope_head_dim = need_positive(j, "qk_nope_head_dim", what);
  c.qk_rope_head_dim = need_positive(j, "qk_rope_head_dim", what);
  c.v_head_dim = need_positive(j, "v_head_dim", what);
  c.q_lora_rank = get_int(j, "q_lora_rank", 0, what);
  c.vocab_size = get_int(j, "vocab_size", 0, what);  // 0: a layer-only config (hmla layer)
  c.intermediate_size = get_int(j, "intermediate_size", 0, what);
  HMLA_CHECK(c.vocab_size >= 0 && c.intermediate_size >= 0, ConfigError, what,
             ": vocab_size and intermediate_size must be >= 0");
  c.max_position_embeddings = get_int(j, "max_position_embeddings", 4096, what);
  c.index_n_heads = get_int(j, "index_n_heads", 0, what);
  c.index_head_dim = get_int(j, "index_head_dim", 0, what);
  c.index_topk = get_int(j, "index_topk", 0, what);
  c.index_window = get_int(j, "index_window", 0, what);
  c.pad_token_id = get_int(j, "pad_token_id", 0, what);  // null means 0, never an error
  c.first_k_dense_replace = get_int(j, "first_k_dense_replace", 3, what);
  if (j.contains("mlp_layer_types") && !j["mlp_layer_types"].is_null()) {
    const json& t = j["mlp_layer_types"];
    HMLA_CHECK(t.is_array() && std::all_of(t.begin(), t.end(), [](const json& e) { return e.is_string(); }) &&
                   int64_t(t.size()) >= c.num_hidden_layers,
               ConfigError, what, ": mlp_layer_types must be a list of num_hidden_layers = ", c.num_hidden_layers,
               " strings (\"dense\" or \"sparse\"), got ", t.dump().substr(0, 80));
    c.mlp_layer_types = t.get<std::vector<std::string>>();
  }
  if (c.has_moe_layers()) c.moe = parse_moe(j, what, c.family);
  c.form = parse_checkpoint_form(j, what);
  const bool glm = c.family == ModelFamily::glm_moe_dsa;
  c.rms_norm_eps = get_num(j, "rms_norm_eps", glm ? 1e-5 : 1e-6, what);  // each family's transformers default
  if (glm) c.indexer_types = parse_indexer_types(j, c.num_hidden_layers, what);
  c.initializer_range = get_num(j, "initializer_range", 0.02, what);
  c.tie_word_embeddings = get_bool(j, "tie_word_embeddings", false, what);
  c.indexer_loss_coeff = get_num(j, "indexer_loss_coeff", 0.01, what);
  c.attention_sink = get_bool(j, "attention_sink", false, what);
  c.rope = parse_rope(j, what);
  for (const char* k : {"index_n_heads", "index_head_dim", "index_topk"})
    HMLA_CHECK(get_int(j, k, 0, what) >= 0, ConfigError, what, ": ", k, " must be >= 0");
  if (j.contains("hmla_layer_modes") && !j["hmla_layer_modes"].is_null()) {
    HMLA_CHECK(j["hmla_layer_modes"].is_array(), ConfigError, what,
               ": hmla_layer_modes must be a list of mode names");
    size_t L = 0;
    for (const json& m : j["hmla_layer_modes"]) {
      HMLA_CHECK(m.is_string(), ConfigError, what, ": hmla_layer_modes[", L, "] must be a string");
      c.layer_modes.push_back(parse_mode(m.get<std::string>(), what + ": hmla_layer_modes[" + std::to_string(L) + "]"));
      ++L;
    }
    HMLA_CHECK(int64_t(c.layer_modes.size()) == c.num_hidden_layers, ConfigError, what, ": hmla_layer_modes has ",
               c.layer_modes.size(), " entries for num_hidden_layers = ", c.num_hidden_layers);
  } else {  // as transformers runs it: sparse when the indexer is configured
    LayerMode m = c.has_indexer_fields() ? LayerMode::dsa_sparse : LayerMode::mha;
    c.layer_modes.assign(c.num_hidden_layers, m);
  }
  // A programme's phases set every layer's mode; until the first phase the model is plain mha, so
  // neither the key nor DESIGN.md's default (dsa_sparse) may demand an indexer here.
  if (modes == LayerModesFrom::programme) c.layer_modes.assign(c.num_hidden_layers, LayerMode::mha);
  validate(c, what);
  return c;
}

ModelConfig parse_model_config(const json& j, const std::string& what, LayerModesFrom modes) {
  try {
    return parse_fields(j, what, modes);
  } catch (const json::exception& e) {  // a field of the wrong JSON type deeper down (lists, rope)
    throw ConfigError(what + ": a field has the wrong type (" + e.what() + ")");
  }
}

ModelConfig load_model_config(const std::string& path, LayerModesFrom modes) {
  return parse_model_config(io::load_json(path), path, modes);
}

void check_mla_layers(const ModelConfig& c, const std::string& what) {
  HMLA_CHECK(!c.is_v4(), ConfigError, what, ": model_type deepseek_v4: this command is about the MLA layer "
             "(deepseek_v32, glm_moe_dsa); V4 models run through hmla forward, backward, train and bench train");
}

void set_all_modes(ModelConfig& c, LayerMode m) {
  c.layer_modes.assign(c.num_hidden_layers, m);
  c.mtp_mode = m;
  if (c.is_v4()) cfg::validate_v4(c, "config");
  else validate(c, "config");
}

bool latent_mqa_enabled(const ModelConfig& c, int64_t layer) {
  HMLA_CHECK(layer >= 0 && layer < static_cast<int64_t>(c.layer_modes.size()), ConfigError,
             "layer ", layer, " out of range (num_hidden_layers = ", c.layer_modes.size(), ")");
  LayerMode m = c.layer_modes[layer];
  return m == LayerMode::mqa_full_causal || m == LayerMode::dsa_sparse;
}

}  // namespace hmla
