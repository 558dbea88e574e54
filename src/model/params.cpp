// Parameter tables and checkpoint tensors (hmla/model/params.h): lookups by name and the checks
// of loaded weights, the checkpoint forms (fused experts split, the MTP layers kept aside, FP8
// dequantised) and the attention's tensor names.
#include "hmla/model/params.h"

#include <cctype>
#include <set>

#include "hmla/core/error.h"
#include "hmla/io/checkpoint_forms.h"

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

namespace {

// Layer n of a "model.layers.{n}." name (-1 for any other name).
int64_t layer_of(const std::string& name) {
  static const std::string pre = "model.layers.";
  if (name.compare(0, pre.size(), pre) != 0) return -1;
  size_t i = pre.size();
  int64_t n = 0;
  for (; i < name.size() && i < pre.size() + 9 && std::isdigit(static_cast<unsigned char>(name[i])); ++i)
    n = n * 10 + (name[i] - '0');
  return i > pre.size() && i < name.size() && name[i] == '.' ? n : -1;
}

// The tensors (of either map: FP8 ones and their scales included) whose names `mtp` accepts,
// moved out as stored.
template <class Pred>
io::StoredMap take_stored(io::TensorMap& tensors, io::StoredMap& fp8, Pred mtp) {
  io::StoredMap kept;
  for (auto it = tensors.begin(); it != tensors.end();)
    if (mtp(it->first)) kept[it->first] = io::stored_tensor(it->second), it = tensors.erase(it);
    else ++it;
  for (auto it = fp8.begin(); it != fp8.end();)
    if (mtp(it->first)) kept[it->first] = std::move(it->second), it = fp8.erase(it);
    else ++it;
  return kept;
}

// The MTP layers (model.layers.{num_hidden_layers + i}.*) out of the maps, as stored.
io::StoredMap take_mtp_layers(io::TensorMap& tensors, io::StoredMap& fp8, const ModelConfig& c) {
  const int64_t L0 = c.num_hidden_layers, L1 = L0 + c.form.num_nextn_predict_layers;
  auto mtp = [&](const std::string& n) { return layer_of(n) >= L0 && layer_of(n) < L1; };
  return take_stored(tensors, fp8, mtp);
}

// DeepSeek-V4: the MTP layers are mtp.{i}.* (transformers ignores "(^|\.)mtp\." on load); those of
// i < num_nextn_predict_layers out of the maps, as stored (any other is an error: nothing reads it).
io::StoredMap take_v4_mtp(io::TensorMap& tensors, io::StoredMap& fp8, const ModelConfig& c, const std::string& what) {
  auto mtp = [&](const std::string& n) {
    const size_t at = n.compare(0, 4, "mtp.") == 0 ? 0 : n.compare(0, 10, "model.mtp.") == 0 ? 6 : std::string::npos;
    if (at == std::string::npos) return false;
    size_t i = at + 4;
    int64_t k = 0;
    for (; i < n.size() && i < at + 13 && std::isdigit(static_cast<unsigned char>(n[i])); ++i) k = k * 10 + (n[i] - '0');
    HMLA_CHECK(i > at + 4 && i < n.size() && n[i] == '.' && k < c.form.num_nextn_predict_layers, IoError, what,
               ": tensor '", n, "' is no multi-token-prediction layer of the config (num_nextn_predict_layers = ",
               c.form.num_nextn_predict_layers, ": mtp.0 to mtp.", c.form.num_nextn_predict_layers - 1,
               "); an ignored tensor is an error");
    return true;
  };
  return take_stored(tensors, fp8, mtp);
}

// DeepSeek-V4's released names (no "model." prefix: embed.weight, layers.{L}.*, norm.weight,
// hc_head_{fn,base,scale}; head.weight as is) into those transformers saves and the table has,
// as transformers' conversion_mapping renames them on load. A checkpoint holds one form.
template <class Map>
void v4_release_names(Map& m, const std::string& what) {
  auto renamed = [](const std::string& n) -> std::string {
    if (n == "embed.weight") return "model.embed_tokens.weight";
    if (n == "norm.weight") return "model.norm.weight";
    for (const char* p : {"hc_head_fn", "hc_head_base", "hc_head_scale"})
      if (n == p) return "model.hc_head.hc_" + n.substr(8);
    if (n.compare(0, 7, "layers.") == 0) return "model." + n;
    return {};
  };
  std::vector<std::string> names;
  for (const auto& [n, t] : m)
    if (!renamed(n).empty()) names.push_back(n);
  for (const std::string& n : names) {
    const std::string to = renamed(n);
    HMLA_CHECK(!m.count(to), IoError, what, ": tensors '", n, "' (DeepSeek's released name) and '", to,
               "' (the name transformers saves) are both there; a checkpoint holds one form");
    auto node = m.extract(n);
    node.key() = to;
    m.insert(std::move(node));
  }
}

// The MTP layers as parameters: model.mtp.{i}.* (a form take_v4_mtp accepts) named mtp.{i}.*, as
// DeepSeek's release and the table name them.
template <class Map>
void v4_mtp_names(Map& m, const std::string& what) {
  std::vector<std::string> names;
  for (const auto& [n, t] : m)
    if (n.compare(0, 10, "model.mtp.") == 0) names.push_back(n);
  for (const std::string& n : names) {
    const std::string to = n.substr(6);
    HMLA_CHECK(!m.count(to), IoError, what, ": tensors '", n, "' and '", to, "' are both there; a checkpoint holds one form");
    auto node = m.extract(n);
    node.key() = to;
    m.insert(std::move(node));
  }
}

// Expert e's rows [r0, r1) of a fused [E, R, C] tensor, as a contiguous [r1 - r0, C] tensor.
Tensor expert_rows(const Tensor& fused, int64_t e, int64_t r0, int64_t r1) {
  return fused.slice(0, e, e + 1).slice(1, r0, r1).clone().view({r1 - r0, fused.size(2)});
}

// Layer L's fused experts (transformers' in-memory form) into experts.{e}.*, checked first.
void split_fused_experts(io::TensorMap& w, const ModelConfig& c, int64_t L, const std::string& what) {
  const std::string pre = "model.layers." + std::to_string(L) + ".mlp.experts.";
  const std::string gu = pre + "gate_up_proj", dn = pre + "down_proj";
  if (!w.count(gu) && !w.count(dn)) return;
  const int64_t E = c.moe.n_routed_experts, I = c.moe.moe_intermediate_size, H = c.hidden_size;
  for (const char* part : {"gate_proj", "up_proj", "down_proj"}) {
    const std::string one = pre + "0." + part + ".weight";
    HMLA_CHECK(!w.count(one), IoError, what, ": tensor '", w.count(gu) ? gu : dn, "' (fused experts) and '", one,
               "' (one tensor per expert) are both there; a checkpoint holds one form of the experts");
  }
  for (const auto& [name, shape] : {std::pair{gu, Shape{E, 2 * I, H}}, std::pair{dn, Shape{E, H, I}}}) {
    auto it = w.find(name);
    HMLA_CHECK(it != w.end(), IoError, what, ": tensor '", name, "' is missing (the other fused experts' tensor, '",
               name == gu ? dn : gu, "', is there)");
    HMLA_CHECK(it->second.shape() == shape, IoError, what, ": tensor '", name, "' is ", shape_str(it->second.shape()),
               ", the config needs ", shape_str(shape), " (n_routed_experts, moe_intermediate_size, hidden_size)");
  }
  const Tensor g = w.at(gu), d = w.at(dn);
  for (int64_t e = 0; e < E; ++e) {
    const std::string x = pre + std::to_string(e) + ".";
    w[x + "gate_proj.weight"] = expert_rows(g, e, 0, I);
    w[x + "up_proj.weight"] = expert_rows(g, e, I, 2 * I);
    w[x + "down_proj.weight"] = expert_rows(d, e, 0, H);
  }
  w.erase(gu);
  w.erase(dn);
}

}  // namespace

CheckpointTensors checkpoint_forms(io::TensorMap tensors, io::StoredMap fp8, const ModelConfig& c,
                                   const std::string& what) {
  CheckpointTensors out;
  if (c.is_v4()) {
    if (c.v4.mtp_params) {  // parameters (v4_mtp_params' names): dequantized with the rest, checked by the table
      v4_mtp_names(tensors, what);
      v4_mtp_names(fp8, what);
    } else {
      out.kept = take_v4_mtp(tensors, fp8, c, what);
    }
    v4_release_names(tensors, what);
    v4_release_names(fp8, what);
  } else {
    out.kept = take_mtp_layers(tensors, fp8, c);
  }
  const io::Fp8Blocks blocks{c.form.block_rows, c.form.block_cols, c.form.fp4_experts};
  io::dequantize_fp8_weights(tensors, fp8, c.form.fp8 ? &blocks : nullptr, what);
  for (int64_t L = 0; L < c.num_hidden_layers; ++L)
    if (c.is_moe_layer(L)) split_fused_experts(tensors, c, L, what);
  out.tensors = std::move(tensors);
  return out;
}

CheckpointTensors read_checkpoint(const std::string& path, const ModelConfig& c) {
  io::StoredMap fp8;
  io::TensorMap w = io::load_checkpoint_tensors(path, &fp8);
  return checkpoint_forms(std::move(w), std::move(fp8), c, path);
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
    // The router's rows number the experts; under expert parallelism another rank's are undefined.
    for (int64_t e = 0; l.moe.gate.defined() && e < l.moe.gate.size(0); ++e)
      l.moe.experts.push_back(swiglu(pre + "mlp.experts." + std::to_string(e) + "."));
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
