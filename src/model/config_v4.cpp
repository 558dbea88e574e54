// A deepseek_v4 config.json (DESIGN.md section 10) read as transformers 5.24's DeepseekV4Config
// reads it: its defaults, its legacy names folded in (compress_ratios, compress_rate_csa/_hca,
// num_hash_layers, qk_rope_head_dim), the nested main/compress rope_parameters; hmla's hybrid_mla
// layers (layer_types "hybrid_mla", compress ratio -2) with their hybrid_mla_* geometry; then
// validated, every error naming its field. Writing it back is config_write.cpp's.
#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>

#include "config_fields.h"
#include "hmla/core/error.h"
#include "hmla/core/size_check.h"

namespace hmla {

using nlohmann::json;

const char* v4_kind_name(V4Kind k) {
  switch (k) {
    case V4Kind::sliding: return "sliding_attention";
    case V4Kind::csa: return "compressed_sparse_attention";
    case V4Kind::hca: return "heavily_compressed_attention";
    case V4Kind::hybrid_mla: return "hybrid_mla";
  }
  return "?";
}

const char* scoring_func_name(ScoringFunc f) {
  switch (f) {
    case ScoringFunc::sqrtsoftplus: return "sqrtsoftplus";
    case ScoringFunc::sigmoid: return "sigmoid";
  }
  return "?";
}

namespace cfg {
namespace {

bool has(const json& j, const char* key) { return j.contains(key) && !j[key].is_null(); }

// A per-layer list (layer_types, mlp_layer_types, compress_ratios): num_hidden_layers entries, or
// that many plus the MTP layers' (DeepSeek's release lists those too; transformers keeps the first
// num_hidden_layers).
const json& layer_list(const json& j, const char* key, int64_t layers, int64_t mtp, const std::string& what) {
  const json& t = j[key];
  HMLA_CHECK(t.is_array(), ConfigError, what, ": ", key, " must be a list, got ", t.dump().substr(0, 80));
  HMLA_CHECK(int64_t(t.size()) == layers || int64_t(t.size()) == layers + mtp, ConfigError, what, ": ", key, " has ",
             t.size(), " entries for num_hidden_layers = ", layers,
             mtp > 0 ? " (or that plus num_nextn_predict_layers = " + std::to_string(mtp) + ")" : std::string());
  return t;
}

V4Kind kind_from_name(const json& e, const std::string& f) {
  for (V4Kind k : {V4Kind::sliding, V4Kind::csa, V4Kind::hca, V4Kind::hybrid_mla})
    if (e.is_string() && e.get<std::string>() == v4_kind_name(k)) return k;
  throw ConfigError(f + " = " + e.dump().substr(0, 60) +
                    ": use sliding_attention, compressed_sparse_attention, heavily_compressed_attention or hybrid_mla");
}

// layer_types > legacy compress_ratios (0 sliding, 4 CSA, 128 HCA: transformers' fixed map; -2
// hybrid_mla: PaddleFleet's) > transformers' default (two HCA layers, then HCA and CSA alternating
// from HCA: CSA on odd i). The entries past num_hidden_layers (DeepSeek lists the MTP layers' too;
// transformers ignores them) go to `mtp` (PaddleFleet puts a hybrid_mla layer there).
std::vector<V4Kind> parse_layer_types(const json& j, int64_t n, int64_t mtp, std::vector<V4Kind>& mtp_kinds,
                                      const std::string& what) {
  std::vector<V4Kind> kinds;
  if (has(j, "layer_types")) {
    const json& t = layer_list(j, "layer_types", n, mtp, what);
    for (int64_t L = 0; L < int64_t(t.size()); ++L)
      (L < n ? kinds : mtp_kinds).push_back(kind_from_name(t[L], what + ": layer_types[" + std::to_string(L) + "]"));
  } else if (has(j, "compress_ratios")) {
    const json& t = layer_list(j, "compress_ratios", n, mtp, what);
    const std::map<int64_t, V4Kind> by_ratio = {
        {0, V4Kind::sliding}, {4, V4Kind::csa}, {128, V4Kind::hca}, {-2, V4Kind::hybrid_mla}};
    for (int64_t L = 0; L < int64_t(t.size()); ++L) {
      const auto it = t[L].is_number_integer() ? by_ratio.find(t[L].get<int64_t>()) : by_ratio.end();
      HMLA_CHECK(it != by_ratio.end(), ConfigError, what, ": compress_ratios[", L, "] = ", t[L].dump().substr(0, 40),
                 ": use 0 (sliding), 4 (CSA), 128 (HCA) or -2 (hmla's hybrid_mla)");
      (L < n ? kinds : mtp_kinds).push_back(it->second);
    }
  } else {
    for (int64_t L = 0; L < n; ++L) kinds.push_back(L < 2 || (L - 2) % 2 == 0 ? V4Kind::hca : V4Kind::csa);
  }
  return kinds;
}

// mlp_layer_types ("hash_moe" / "moe") > the first num_hash_layers (default 3) hash_moe.
std::vector<bool> parse_hash_layers(const json& j, int64_t n, int64_t mtp, const std::string& what) {
  std::vector<bool> hash;
  if (has(j, "mlp_layer_types")) {
    const json& t = layer_list(j, "mlp_layer_types", n, mtp, what);
    for (int64_t L = 0; L < int64_t(t.size()); ++L) {
      HMLA_CHECK(t[L] == "hash_moe" || t[L] == "moe", ConfigError, what, ": mlp_layer_types[", L, "] = ",
                 t[L].dump().substr(0, 40), ": use \"hash_moe\" or \"moe\" (every DeepSeek-V4 layer is MoE)");
      hash.push_back(t[L] == "hash_moe");
    }
  } else {
    const int64_t k = get_int(j, "num_hash_layers", 3, what);
    HMLA_CHECK(k >= 0, ConfigError, what, ": num_hash_layers = ", k, ": it must be >= 0");
    for (int64_t L = 0; L < n + mtp; ++L) hash.push_back(L < k);  // DeepSeek's Gate: layer_id < n_hash_layers
  }
  return hash;
}

void parse_compress_rates(const json& j, V4Config& v, const std::string& what) {
  if (has(j, "compress_rates")) {
    const json& r = j["compress_rates"];
    HMLA_CHECK(r.is_object(), ConfigError, what, ": compress_rates must be an object {layer type: rate}");
    for (const auto& [key, val] : r.items()) {
      HMLA_CHECK(key == v4_kind_name(V4Kind::csa) || key == v4_kind_name(V4Kind::hca), ConfigError, what,
                 ": compress_rates has '", key.substr(0, 40),
                 "'; only compressed_sparse_attention and heavily_compressed_attention compress");
    }
    // transformers takes the object as given (no defaults merged in): a kind it lacks has no rate
    for (V4Kind k : {V4Kind::csa, V4Kind::hca})
      if (!has(r, v4_kind_name(k)))
        for (size_t L = 0; L < v.layer_types.size() + v.mtp_types.size(); ++L)
          HMLA_CHECK(v.kind(int64_t(L)) != k, ConfigError, what, ": compress_rates has no ", v4_kind_name(k),
                     " rate, and layer ", L, " is one");
    v.csa_rate = get_int(r, v4_kind_name(V4Kind::csa), v.csa_rate, what + ": compress_rates");
    v.hca_rate = get_int(r, v4_kind_name(V4Kind::hca), v.hca_rate, what + ": compress_rates");
  }
  v.csa_rate = get_int(j, "compress_rate_csa", v.csa_rate, what);
  v.hca_rate = get_int(j, "compress_rate_hca", v.hca_rate, what);
  for (auto [name, rate] : {std::pair{"compressed_sparse_attention", v.csa_rate}, std::pair{"heavily_compressed_attention", v.hca_rate}})
    HMLA_CHECK(rate >= 2 && rate <= (int64_t(1) << 30), ConfigError, what, ": compress_rates.", name, " = ", rate,
               ": it must be in [2, 2^30] (an entry pools that many tokens)");
}

// The main RoPE (sliding layers) and the compress RoPE (layers with a compressor), as
// DeepseekV4Config.__post_init__ builds them: a nested {main, compress} object is taken as it is;
// otherwise the flat rope_parameters (or legacy rope_scaling) are the compress RoPE's at
// compress_rope_theta, YaRN with attention_factor 1 unless given, and main is plain RoPE at
// rope_theta. transformers' YaRN reads `truncate` from the top-level dict, which V4 nests: it
// always truncates.
void parse_v4_rope(const json& j, ModelConfig& c, double prf, const std::string& what) {
  RopeConfig main, comp;
  main.theta = get_num(j, "rope_theta", 10000.0, what);
  comp.theta = get_num(j, "compress_rope_theta", 160000.0, what);
  const char* field = "";
  const json* p = rope_object(j, &field);
  const std::string f = what + ": " + field;
  if (p && p->is_object() && p->contains("main") && p->contains("compress") && (*p)["main"].is_object() &&
      (*p)["compress"].is_object()) {
    main = parse_rope_params((*p)["main"], main, f + ".main");
    comp = parse_rope_params((*p)["compress"], comp, f + ".compress");
    for (const char* k : {"main", "compress"})
      if ((*p)[k].contains("partial_rotary_factor"))
        HMLA_CHECK(get_num((*p)[k], "partial_rotary_factor", prf, f) == prf, ConfigError, f, ".", k,
                   ".partial_rotary_factor differs from partial_rotary_factor = ", prf,
                   "; both RoPEs rotate the same qk_rope_head_dim channels");
  } else if (p) {
    HMLA_CHECK(p->is_object(), ConfigError, f, " must be an object");
    json flat = *p;
    flat.erase("main");
    flat.erase("compress");
    flat["rope_theta"] = comp.theta;
    comp = parse_rope_params(flat, comp, f);
    if (comp.type == "yarn" && !comp.attention_factor) comp.attention_factor = 1.0;
  }
  main.truncate = comp.truncate = true;
  for (auto [name, r] : {std::pair{"rope_theta", &main}, std::pair{"compress_rope_theta", &comp}})
    HMLA_CHECK(std::isfinite(r->theta) && r->theta > 0, ConfigError, what, ": ", name, " = ", r->theta,
               ": it must be finite and positive");
  c.rope = main;
  c.v4.compress_rope = comp;
}

// DeepseekV4's MoE: one group (plain top-k on scores + bias), one shared expert of
// moe_intermediate_size whatever n_shared_experts says (transformers builds exactly one: refused
// otherwise), always normalised gating weights.
void parse_v4_moe(const json& j, ModelConfig& c, const std::string& what) {
  MoeConfig& m = c.moe;
  m.n_group = m.topk_group = 1;
  m.n_routed_experts = get_int(j, "num_local_experts", 256, what);
  m.n_routed_experts = get_int(j, "n_routed_experts", m.n_routed_experts, what);
  m.n_shared_experts = get_int(j, "n_shared_experts", 1, what);
  m.moe_intermediate_size = get_int(j, "moe_intermediate_size", 2048, what);
  m.num_experts_per_tok = get_int(j, "num_experts_per_tok", 6, what);
  m.routed_scaling_factor = get_num(j, "routed_scaling_factor", 1.5, what);
  m.norm_topk_prob = get_bool(j, "norm_topk_prob", true, what);
  HMLA_CHECK(m.norm_topk_prob, ConfigError, what,
             ": norm_topk_prob = false: DeepSeek-V4's routers always normalise the chosen scores");
  HMLA_CHECK(m.n_shared_experts == 1, ConfigError, what, ": n_shared_experts = ", m.n_shared_experts,
             ": DeepSeek-V4 has exactly one shared expert (of moe_intermediate_size)");
  for (auto [key, v] : {std::pair{"n_routed_experts", m.n_routed_experts}, std::pair{"num_experts_per_tok", m.num_experts_per_tok},
                        std::pair{"moe_intermediate_size", m.moe_intermediate_size}})
    HMLA_CHECK(v >= 1, ConfigError, what, ": ", key, " = ", v, ": it must be at least 1");
  HMLA_CHECK(m.n_routed_experts < (int64_t(1) << 31), ConfigError, what, ": n_routed_experts = ", m.n_routed_experts,
             ": hmla numbers experts in int32");
  HMLA_CHECK(m.num_experts_per_tok <= m.n_routed_experts, ConfigError, what, ": num_experts_per_tok = ",
             m.num_experts_per_tok, " exceeds n_routed_experts = ", m.n_routed_experts);
  HMLA_CHECK(std::isfinite(m.routed_scaling_factor) && m.routed_scaling_factor > 0, ConfigError, what,
             ": routed_scaling_factor = ", m.routed_scaling_factor, ": it must be finite and positive");
  const std::string sf = has(j, "scoring_func") && j["scoring_func"].is_string() ? j["scoring_func"].get<std::string>()
                         : has(j, "scoring_func")                               ? j["scoring_func"].dump()
                                                                                : "sqrtsoftplus";
  bool known = false;
  for (ScoringFunc f : {ScoringFunc::sqrtsoftplus, ScoringFunc::sigmoid})
    if (sf == scoring_func_name(f)) c.v4.scoring = f, known = true;
  HMLA_CHECK(known, ConfigError, what, ": scoring_func = ", sf.substr(0, 40),
             ": use sqrtsoftplus or sigmoid (transformers 5.24's DeepSeek-V4 builds no other router activation)");
  c.v4.swiglu_limit = get_num(j, "swiglu_limit", 10.0, what);
  HMLA_CHECK(std::isfinite(c.v4.swiglu_limit) && c.v4.swiglu_limit > 0, ConfigError, what, ": swiglu_limit = ",
             c.v4.swiglu_limit, ": it must be finite and positive (the SwiGLU clamps gate <= limit, |up| <= limit)");
}

void check_v4_sizes(const ModelConfig& c, const std::string& what) {
  const std::string f = what + ": the sizes of";
  const V4Config& v = c.v4;
  const SizeFactor H{"num_attention_heads", c.num_attention_heads}, hid{"hidden_size", c.hidden_size},
      hd{"head_dim", v.head_dim}, hc{"hc_mult", v.hc_mult};
  checked_product({{"vocab_size", c.vocab_size}, hid}, f + " embed");
  checked_product({H, hd, {"q_lora_rank", c.q_lora_rank}}, f + " attn.wq_b");
  checked_product({{"o_groups", v.o_groups}, {"o_lora_rank", v.o_lora_rank}, hid}, f + " attn.wo_b");
  checked_product({H, hd, {"o_lora_rank", v.o_lora_rank}}, f + " attn.wo_a");
  checked_product({{"2 + hc_mult", checked_add(2, v.hc_mult, f + " hc_mult")}, hc, hc, hid}, f + " hc_attn_fn");
  checked_product({{"index_n_heads", c.index_n_heads}, {"index_head_dim", c.index_head_dim}, {"q_lora_rank", c.q_lora_rank}},
                  f + " attn.indexer.wq_b");
  checked_product({{"n_routed_experts", c.moe.n_routed_experts}, {"3", 3}, {"moe_intermediate_size", c.moe.moe_intermediate_size}, hid},
                  f + " the routed experts");
  checked_product({{"vocab_size", c.vocab_size}, {"num_experts_per_tok", c.moe.num_experts_per_tok}}, f + " ffn.gate.tid2eid");
}

// The hybrid_mla_* keys (DESIGN.md section 10), read when some layer (or MTP layer) is hybrid_mla:
// every geometry key is required then, but hybrid_mla_index_topk (default 2048).
constexpr const char* kHybridKeys[] = {"hybrid_mla_q_lora_rank",     "hybrid_mla_kv_lora_rank",
                                       "hybrid_mla_qk_nope_head_dim", "hybrid_mla_qk_rope_head_dim",
                                       "hybrid_mla_v_head_dim",      "hybrid_mla_num_attention_heads"};

void parse_hybrid_mla(const json& j, ModelConfig& c, const std::string& what) {
  if (!c.v4.has_hybrid_mla()) return;
  HybridMlaGeometry& h = c.v4.hybrid;
  int64_t* dst[] = {&h.q_lora_rank, &h.kv_lora_rank, &h.qk_nope_head_dim, &h.qk_rope_head_dim, &h.v_head_dim,
                    &h.num_attention_heads};
  for (size_t i = 0; i < std::size(kHybridKeys); ++i) {
    HMLA_CHECK(has(j, kHybridKeys[i]), ConfigError, what, ": ", kHybridKeys[i],
               " is required: a layer is hybrid_mla, and its MLA geometry has no default");
    *dst[i] = get_int(j, kHybridKeys[i], 0, what);
  }
  h.index_topk = get_int(j, "hybrid_mla_index_topk", 2048, what);
  c.indexer_loss_coeff = get_num(j, "indexer_loss_coeff", 0.01, what);
  // The MLA family's window and sink keys do not apply: the hybrid layer's are fixed.
  HMLA_CHECK(!has(j, "index_window") || get_int(j, "index_window", 0, what) == c.v4.sliding_window, ConfigError, what,
             ": index_window = ", j["index_window"].dump().substr(0, 40), ": a hybrid_mla layer's forced window is "
             "sliding_window = ", c.v4.sliding_window, " (DESIGN.md section 10); remove the key");
  HMLA_CHECK(get_bool(j, "attention_sink", true, what), ConfigError, what,
             ": attention_sink = false: a hybrid_mla layer has its sink (self_attn.softmax_offset) like every V4 "
             "layer; remove the key");
}

void validate_hybrid_mla(const ModelConfig& c, const std::string& what) {
  if (!c.v4.has_hybrid_mla()) return;
  const HybridMlaGeometry& h = c.v4.hybrid;
  for (auto [key, v] : {std::pair{"hybrid_mla_q_lora_rank", h.q_lora_rank},
                        std::pair{"hybrid_mla_kv_lora_rank", h.kv_lora_rank},
                        std::pair{"hybrid_mla_qk_nope_head_dim", h.qk_nope_head_dim},
                        std::pair{"hybrid_mla_qk_rope_head_dim", h.qk_rope_head_dim},
                        std::pair{"hybrid_mla_v_head_dim", h.v_head_dim},
                        std::pair{"hybrid_mla_num_attention_heads", h.num_attention_heads},
                        std::pair{"hybrid_mla_index_topk", h.index_topk}})
    HMLA_CHECK(v >= 1, ConfigError, what, ": ", key, " = ", v, ": it must be at least 1",
               std::string(key) == "hybrid_mla_q_lora_rank" ? " (the hybrid layer's indexer reads the q latent)" : "");
  HMLA_CHECK(h.qk_rope_head_dim % 2 == 0, ConfigError, what, ": hybrid_mla_qk_rope_head_dim = ", h.qk_rope_head_dim,
             " is odd; RoPE rotates pairs, so it must be even");
  HMLA_CHECK(c.index_head_dim >= h.qk_rope_head_dim && c.index_head_dim % 2 == 0, ConfigError, what,
             ": index_head_dim = ", c.index_head_dim,
             ": a hybrid_mla layer's indexer ropes hybrid_mla_qk_rope_head_dim = ", h.qk_rope_head_dim,
             " of its channels, so it must be even and at least that");
  HMLA_CHECK(std::isfinite(c.indexer_loss_coeff) && c.indexer_loss_coeff >= 0, ConfigError, what,
             ": indexer_loss_coeff = ", c.indexer_loss_coeff, ": it must be finite and >= 0");
  const std::string f = what + ": the sizes of the hybrid_mla layers'";
  const SizeFactor H{"hybrid_mla_num_attention_heads", h.num_attention_heads}, hid{"hidden_size", c.hidden_size};
  const SizeFactor Rq{"hybrid_mla_q_lora_rank", h.q_lora_rank}, Rkv{"hybrid_mla_kv_lora_rank", h.kv_lora_rank};
  const int64_t qk = checked_add(h.qk_nope_head_dim, h.qk_rope_head_dim, f + " head width");
  checked_product({H, {"qk head width", qk}, Rq}, f + " q_b_proj");
  checked_product({H, {"nope + v head width", checked_add(h.qk_nope_head_dim, h.v_head_dim, f + " kv_b_proj")}, Rkv},
                  f + " kv_b_proj");
  checked_product({hid, H, {"hybrid_mla_v_head_dim", h.v_head_dim}}, f + " o_proj");
  const int64_t kv_width = checked_add(h.kv_lora_rank, h.qk_rope_head_dim, f + " kv_a_proj");
  checked_product({{"kv width", kv_width}, hid}, f + " kv_a_proj");
  checked_product({Rq, hid}, f + " q_a_proj");
  checked_product({{"index_n_heads", c.index_n_heads}, {"index_head_dim", c.index_head_dim}, Rq}, f + " indexer.wq_b");
  checked_add(h.index_topk, c.v4.sliding_window, f + " top-k tables (hybrid_mla_index_topk + sliding_window)");
}

}  // namespace

void validate_v4(const ModelConfig& c, const std::string& what) {
  const V4Config& v = c.v4;
  check_v4_sizes(c, what);
  HMLA_CHECK(c.num_attention_heads % v.o_groups == 0, ConfigError, what, ": o_groups = ", v.o_groups,
             " does not divide num_attention_heads = ", c.num_attention_heads,
             "; the grouped output projection gives each group num_attention_heads / o_groups heads (transformers "
             "splits head channels, but every published V4 groups whole heads)");
  HMLA_CHECK(v.qk_rope_head_dim >= 2 && v.qk_rope_head_dim <= v.head_dim && v.qk_rope_head_dim % 2 == 0, ConfigError,
             what, ": qk_rope_head_dim = int(head_dim * partial_rotary_factor) = ", v.qk_rope_head_dim,
             ": it must be even and in [2, head_dim = ", v.head_dim, "] (RoPE rotates pairs)");
  HMLA_CHECK(std::isfinite(v.hc_eps) && v.hc_eps >= 0, ConfigError, what, ": hc_eps = ", v.hc_eps,
             ": it must be finite and >= 0");
  HMLA_CHECK(c.vocab_size >= 1, ConfigError, what, ": vocab_size = ", c.vocab_size, ": it must be at least 1");
  HMLA_CHECK(c.pad_token_id >= 0 && c.pad_token_id < c.vocab_size, ConfigError, what, ": pad_token_id = ",
             c.pad_token_id, " is not a token of the vocabulary [0, ", c.vocab_size, ")");
  HMLA_CHECK(std::isfinite(c.initializer_range) && c.initializer_range >= 0, ConfigError, what,
             ": initializer_range = ", c.initializer_range, ": it must be finite and >= 0 (a standard deviation)");
  HMLA_CHECK(std::isfinite(c.rms_norm_eps) && c.rms_norm_eps >= 0, ConfigError, what, ": rms_norm_eps = ",
             c.rms_norm_eps, ": it must be finite and >= 0");
  const bool csa = std::count(v.layer_types.begin(), v.layer_types.end(), V4Kind::csa) +
                       std::count(v.mtp_types.begin(), v.mtp_types.end(), V4Kind::csa) > 0;
  if (csa)
    HMLA_CHECK(c.index_head_dim >= v.qk_rope_head_dim && c.index_head_dim % 2 == 0, ConfigError, what,
               ": index_head_dim = ", c.index_head_dim, ": a CSA layer's indexer ropes qk_rope_head_dim = ",
               v.qk_rope_head_dim, " of its channels, so it must be even and at least that");
  // Any mode on any layer: the phase's mode drives the layers with DSA machinery (ModelConfig::has_dsa,
  // DESIGN.md section 10's table); sliding and HCA layers compute the same in every mode.
  HMLA_CHECK(int64_t(c.layer_modes.size()) == c.num_hidden_layers, ConfigError, what, ": hmla_layer_modes has ",
             c.layer_modes.size(), " entries for num_hidden_layers = ", c.num_hidden_layers);
  validate_hybrid_mla(c, what);
}

namespace {

// Fields whose only value transformers' DeepseekV4 honours.
void check_v4_fixed(const json& j, const std::string& what) {
  HMLA_CHECK(get_int(j, "num_key_value_heads", 1, what) == 1, ConfigError, what,
             ": num_key_value_heads must be 1 (DeepSeek-V4 attends with one shared K = V head)");
  HMLA_CHECK(!get_bool(j, "attention_bias", false, what) && !get_bool(j, "mlp_bias", false, what), ConfigError, what,
             ": attention_bias and mlp_bias must be false (DeepSeek-V4 has no biases)");
  check_only(j, "hidden_act", "silu", what, "DeepSeek-V4's SwiGLU");
}

}  // namespace

ModelConfig parse_v4_fields(const json& j, const std::string& what, LayerModesFrom modes) {
  ModelConfig c;
  c.source = j;
  c.family = ModelFamily::deepseek_v4;
  V4Config& v = c.v4;
  c.form = parse_checkpoint_form(j, what);  // FP8 weights as for V3.2; the MTP layers kept as stored
  if (!has(j, "num_nextn_predict_layers")) c.form.num_nextn_predict_layers = 1;  // DeepseekV4Config's default
  for (auto [key, def, dst] : {std::tuple{"vocab_size", 129280L, &c.vocab_size}, std::tuple{"hidden_size", 4096L, &c.hidden_size},
                               std::tuple{"num_hidden_layers", 43L, &c.num_hidden_layers},
                               std::tuple{"num_attention_heads", 64L, &c.num_attention_heads},
                               std::tuple{"q_lora_rank", 1024L, &c.q_lora_rank},
                               std::tuple{"max_position_embeddings", 1048576L, &c.max_position_embeddings},
                               std::tuple{"index_n_heads", 64L, &c.index_n_heads}, std::tuple{"index_head_dim", 128L, &c.index_head_dim},
                               std::tuple{"index_topk", 512L, &c.index_topk}, std::tuple{"head_dim", 512L, &v.head_dim},
                               std::tuple{"o_groups", 8L, &v.o_groups}, std::tuple{"o_lora_rank", 1024L, &v.o_lora_rank},
                               std::tuple{"sliding_window", 128L, &v.sliding_window}, std::tuple{"hc_mult", 4L, &v.hc_mult},
                               std::tuple{"hc_sinkhorn_iters", 20L, &v.hc_sinkhorn_iters}}) {
    *dst = get_int(j, key, def, what);
    HMLA_CHECK(*dst >= 1, ConfigError, what, ": ", key, " = ", *dst, ": it must be at least 1");
  }
  HMLA_CHECK(c.num_hidden_layers <= kMaxLayers, ConfigError, what, ": num_hidden_layers = ", c.num_hidden_layers,
             ": hmla builds at most ", kMaxLayers, " layers");
  check_v4_fixed(j, what);
  const int64_t n = c.num_hidden_layers, mtp = c.form.num_nextn_predict_layers;
  v.layer_types = parse_layer_types(j, n, mtp, v.mtp_types, what);
  v.hash = parse_hash_layers(j, n, mtp, what);
  v.mtp_listed = !v.mtp_types.empty();  // the MTP layers' kinds, else sliding (V4Config)
  if (!v.mtp_listed) v.mtp_types.assign(size_t(mtp), V4Kind::sliding);
  v.mtp_hash.assign(size_t(mtp), false);
  for (int64_t i = 0; i < mtp && int64_t(v.hash.size()) > n; ++i) v.mtp_hash[size_t(i)] = v.hash[size_t(n + i)];
  v.layer_types.resize(size_t(n));
  v.hash.resize(size_t(n));
  parse_compress_rates(j, v, what);
  v.hc_eps = get_num(j, "hc_eps", 1e-6, what);
  double prf = get_num(j, "partial_rotary_factor", 0.0, what);
  if (!has(j, "partial_rotary_factor"))
    prf = has(j, "qk_rope_head_dim") ? double(get_int(j, "qk_rope_head_dim", 0, what)) / double(v.head_dim) : 64.0 / 512.0;
  HMLA_CHECK(std::isfinite(prf) && prf > 0 && prf <= 1, ConfigError, what, ": partial_rotary_factor = ", prf,
             ": it must be in (0, 1] (the fraction of head_dim that RoPE rotates)");
  v.qk_rope_head_dim = int64_t(double(v.head_dim) * prf);
  c.qk_rope_head_dim = v.qk_rope_head_dim;  // the main RoPE's tables (rope_cache) rotate this many
  parse_v4_rope(j, c, prf, what);
  parse_v4_moe(j, c, what);
  parse_hybrid_mla(j, c, what);
  c.pad_token_id = get_int(j, "pad_token_id", 0, what);  // null means 0, as for the other families
  c.rms_norm_eps = get_num(j, "rms_norm_eps", 1e-6, what);
  c.initializer_range = get_num(j, "initializer_range", 0.02, what);
  c.tie_word_embeddings = get_bool(j, "tie_word_embeddings", false, what);
  // Without hmla_layer_modes, as transformers runs it: the CSA layers attend over the indexer's
  // top-k (dsa_sparse); a programme starts every layer in mha (its phases set the modes).
  for (int64_t L = 0; L < n; ++L)
    c.layer_modes.push_back(c.has_dsa(L) ? LayerMode::dsa_sparse : LayerMode::mha);
  if (has(j, "hmla_layer_modes")) {
    const json& t = layer_list(j, "hmla_layer_modes", n, 0, what);
    for (int64_t L = 0; L < n; ++L) {
      HMLA_CHECK(t[L].is_string(), ConfigError, what, ": hmla_layer_modes[", L, "] must be a string");
      c.layer_modes[L] = parse_mode(t[L].get<std::string>(), what + ": hmla_layer_modes[" + std::to_string(L) + "]");
    }
  }
  c.mtp_mode = LayerMode::mha;
  for (int64_t L = 0; L < n; ++L)
    if (c.has_dsa(L)) c.mtp_mode = c.layer_modes[size_t(L)];
  if (modes == LayerModesFrom::programme) c.layer_modes.assign(size_t(n), LayerMode::mha), c.mtp_mode = LayerMode::mha;
  validate_v4(c, what);
  return c;
}

}  // namespace cfg

bool V4Config::has_hybrid_mla() const {
  for (const std::vector<V4Kind>* kinds : {&layer_types, &mtp_types})
    if (std::count(kinds->begin(), kinds->end(), V4Kind::hybrid_mla) > 0) return true;
  return false;
}

ModelConfig hybrid_mla_config(const ModelConfig& c, int64_t L) {
  HMLA_CHECK(c.is_v4() && L >= 0 && L < c.num_hidden_layers + c.form.num_nextn_predict_layers && c.v4.is_hybrid_mla(L),
             ConfigError, "layer ", L, " is no hybrid_mla layer of a deepseek_v4 config");
  ModelConfig h;  // field by field: `source` (the whole file) stays empty
  h.family = c.family;
  h.hidden_size = c.hidden_size;
  h.num_hidden_layers = c.num_hidden_layers;
  h.vocab_size = c.vocab_size;
  h.max_position_embeddings = c.max_position_embeddings;
  const HybridMlaGeometry& g = c.v4.hybrid;
  h.num_attention_heads = g.num_attention_heads;
  h.q_lora_rank = g.q_lora_rank;
  h.kv_lora_rank = g.kv_lora_rank;
  h.qk_nope_head_dim = g.qk_nope_head_dim;
  h.qk_rope_head_dim = g.qk_rope_head_dim;
  h.v_head_dim = g.v_head_dim;
  h.index_n_heads = c.index_n_heads;
  h.index_head_dim = c.index_head_dim;
  h.index_topk = g.index_topk;
  h.index_window = c.v4.sliding_window;  // the seed's forced window, never an indexer candidate
  h.attention_sink = true;              // as every V4 layer's; out of the KL target (section 6)
  h.pad_token_id = c.pad_token_id;
  h.rms_norm_eps = c.rms_norm_eps;
  h.initializer_range = c.initializer_range;
  h.rope = c.rope;  // the main RoPE (rope_theta), section 4's layouts
  h.layer_modes = c.layer_modes;
  h.mtp_mode = c.mtp_mode;  // ModelConfig::mode of an MTP layer (L >= num_hidden_layers)
  // An MTP layer's mode at its own index as well: MlaLayer reads layer_modes[L] (so the derived
  // config's list runs past num_hidden_layers, up to L, with c.mtp_mode).
  for (int64_t i = c.num_hidden_layers; i <= L; ++i) h.layer_modes.push_back(c.mtp_mode);
  h.v4.layer_types = c.v4.layer_types;  // ModelConfig::has_dsa, runs_indexer read the kinds
  h.v4.mtp_types = c.v4.mtp_types;
  h.indexer_loss_coeff = c.indexer_loss_coeff;
  return h;
}

}  // namespace hmla
