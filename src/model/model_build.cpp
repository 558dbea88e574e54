// A model's arenas (model.h): build_model allocates the parameter arena planned from the table
// (and, where the device computes in bf16, the weights' compute copy), init_model draws its
// initial values on the host from one seed, Model::rope keeps the RoPE tables per shape.
#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "hmla/model/model.h"
#include "hmla/model/v4_tables.h"
#include "hmla/ops/backend.h"
#include "hmla/ops/nn.h"

namespace hmla {

namespace {

// Model::wc: the matrices from a compute copy of the arena where the compute dtype is not f32.
ModelTensors compute_tensors(Model& m) {
  const DType dt = compute_dtype(m.device());
  if (dt == DType::f32) return m.w;
  m.compute_arena = Tensor::empty({m.arena.numel()}, dt, m.device());
  const io::TensorMap copy = arena_views(m.table, m.compute_arena);
  io::TensorMap views = copy;
  for (auto& [name, t] : views)
    if (t.dim() < 2 || name == "model.embed_tokens.weight" || name.ends_with(".mlp.gate.weight"))
      t = m.params.at(name);  // read as f32 (the MoE router's gate too: its logits are f32)
  ModelTensors wc = model_tensors(views, m.cfg.num_hidden_layers, m.cfg.tie_word_embeddings);
  if (m.cfg.tie_word_embeddings) wc.lm_head = copy.at("model.embed_tokens.weight");  // a product reads it
  return wc;
}

// The hash layers' tid2eid (DeepSeek-V4): transformers leaves it 0 ("real values come from the
// checkpoint"), which routes every token to one expert twice; hmla draws each token's
// num_experts_per_tok distinct experts uniformly (a partial Fisher-Yates shuffle), after the
// weights from the same generator, so a seed makes the same model.
void init_int_tables(Model& m, std::mt19937_64& rng) {
  const int64_t E = m.cfg.moe.n_routed_experts;
  for (auto& [name, t] : m.ints) {
    const int64_t rows = t.size(0), k = t.size(1);
    std::vector<int32_t> v(static_cast<size_t>(t.numel())), perm(static_cast<size_t>(E));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t e = 0; e < E; ++e) perm[size_t(e)] = int32_t(e);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t pick = j + int64_t(rng() % uint64_t(E - j));
        std::swap(perm[size_t(j)], perm[size_t(pick)]);
        v[size_t(r * k + j)] = perm[size_t(j)];
      }
    }
    t.copy_from(Tensor::from_vector<int32_t>(t.shape(), v));
  }
}

}  // namespace

const RopeCache& Model::rope(int64_t s, int64_t pos0) const {
  auto it = rope_.find({s, pos0});
  if (it == rope_.end()) {
    const RopeCache h = rope_cache(cfg, s, pos0);
    it = rope_.emplace(std::pair{s, pos0}, RopeCache{h.cos.on(device()), h.sin.on(device())}).first;
  }
  return it->second;
}

const Tensor& Model::constant(const std::string& key, const std::function<Tensor()>& make) const {
  auto it = constants_.find(key);
  if (it == constants_.end()) it = constants_.emplace(key, make().on(device())).first;
  return it->second;
}

namespace {

// The model's table (this rank's under expert parallelism), planned, then its zero arena and views.
void set_table(Model& m, Device device, Comm* ep) {
  const int ranks = ep ? ep->size() : 1;
  HMLA_CHECK(ranks == 1 || m.cfg.has_moe_layers(), ConfigError, "expert parallelism over ", ranks,
             " ranks: the model has no MoE layers");
  MemoryPlan plan;
  plan_parameters(plan, m.cfg, m.has_indexer, false, compute_dtype(device), ranks);
  plan.check("the model", device);
  m.table = expert_shard_table(model_param_table(m.cfg, m.has_indexer), m.cfg.moe.n_routed_experts, ranks,
                               ep ? ep->rank() : 0);
  m.ep = ranks > 1 ? ep : nullptr;
  m.first_expert = m.table.size();
  if (m.ep)
    while (m.first_expert > 0 && routed_expert_of(m.table[m.first_expert - 1].name) >= 0) --m.first_expert;
  m.arena = Tensor::zeros({table_numel(m.table)}, DType::f32, device);
  m.params = arena_views(m.table, m.arena);
}

// A V4 model's compute views (Model::compute_params) where the compute dtype is not f32.
void v4_compute_params(Model& m) {
  const DType dt = compute_dtype(m.device());
  if (dt == DType::f32) return;
  m.compute_arena = Tensor::empty({m.arena.numel()}, dt, m.device());
  m.compute_params = arena_views(m.table, m.compute_arena);
  for (auto& [name, t] : m.compute_params)
    if (t.dim() < 2 || name == "model.embed_tokens.weight" || name.ends_with(".ffn.gate.weight") ||
        name.ends_with("_fn") || name.ends_with(".ape"))
      t = m.params.at(name);
  refresh_compute_weights(m);
}

// A DeepSeek-V4 model (v4_model.h): its table's arena, named views only (the typed views are
// v4_tensors, made per step), and its integer tables (zeros until loaded or initialised). The
// layers with DSA machinery (ModelConfig::has_dsa: CSA, hybrid_mla) have their indexers where
// has_indexer says (one entry per layer), and must where their mode runs one.
Model build_v4_model(const ModelConfig& c, const std::vector<bool>& has_indexer, Device device, Comm* ep) {
  HMLA_CHECK(int64_t(has_indexer.size()) == c.num_hidden_layers, ConfigError, "has_indexer needs one entry per layer");
  Model m;
  m.cfg = c;
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) {
    m.has_indexer.push_back(has_indexer[size_t(L)] && c.has_dsa(L));
    HMLA_CHECK(!c.runs_indexer(L) || m.has_indexer.back(), ConfigError, "layer ", L, " runs ",
               mode_name(c.layer_modes[size_t(L)]), " without an indexer");
  }
  set_table(m, device, ep);
  for (const ParamSpec& p : v4_int_tables(c)) m.ints[p.name] = Tensor::zeros(p.shape, DType::i32);  // host
  v4_compute_params(m);
  return m;
}

}  // namespace

Model build_model(const ModelConfig& c, const std::vector<bool>& has_indexer, Device device, Comm* ep) {
  if (c.is_v4()) return build_v4_model(c, has_indexer, device, ep);
  bool dense_mlp = false;
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) dense_mlp |= !c.is_moe_layer(L);
  HMLA_CHECK(c.vocab_size > 0 && (c.intermediate_size > 0 || !dense_mlp), ConfigError,
             "a model needs vocab_size and intermediate_size (>= 1; intermediate_size sizes the dense MLPs)");
  HMLA_CHECK(static_cast<int64_t>(has_indexer.size()) == c.num_hidden_layers, ConfigError,
             "has_indexer needs one entry per layer");
  std::vector<bool> own(has_indexer.size());  // shared layers (IndexShare) have none
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) {
    own[L] = own_indexer(c, has_indexer, L);
    HMLA_CHECK(!c.runs_indexer(L) || own[L], ConfigError, "layer ", L, " runs ",
               mode_name(c.layer_modes[L]), " without an indexer");
  }
  Model m;
  m.cfg = c;
  m.has_indexer = own;
  set_table(m, device, ep);
  m.w = model_tensors(m.params, c.num_hidden_layers, c.tie_word_embeddings);
  m.wc = compute_tensors(m);
  return m;
}

void refresh_compute_weights(Model& m) {
  if (m.compute_arena.defined()) convert(m.arena, m.compute_arena);  // one launch for every weight
}

namespace {

// init_model's rule for one tensor: n values, 1 for norm weights, 0 for biases and the sink, else
// N(0, initializer_range). DeepSeek-V4 as transformers' _init_weights: the mixers' base 0 and scale
// 1, sinks and the compressors' position biases (ape) 0.
// (One distribution object for a whole pass: it keeps the second value of each pair it draws.)
void init_values(const ModelConfig& c, const std::string& name, int64_t n, std::mt19937_64& rng,
                 std::normal_distribution<float>& nd, float* v) {
  const bool v4 = c.is_v4();
  const bool ones = name.find("norm.weight") != std::string::npos || name.find("layernorm") != std::string::npos ||
                    (v4 && name.ends_with("_scale"));
  const bool zeros = name.find(".bias") != std::string::npos || name.find("softmax_offset") != std::string::npos ||
                     name.ends_with(".e_score_correction_bias") ||
                     (v4 && (name.ends_with("_base") || name.ends_with("attn_sink") || name.ends_with(".ape")));
  for (int64_t i = 0; i < n; ++i) v[i] = ones ? 1.f : zeros ? 0.f : nd(rng);
}

}  // namespace

std::vector<ParamSpec> full_param_table(const Model& m) {
  return m.ep ? model_param_table(m.cfg, m.has_indexer) : m.table;
}

void init_model(Model& m, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, static_cast<float>(m.cfg.initializer_range));
  const Tensor host = Tensor::empty({m.arena.numel()}, DType::f32);  // drawn on the host, then copied
  const io::TensorMap at = arena_views(m.table, host);
  std::vector<float> other;  // another expert-parallel rank's expert: drawn (the stream is the whole table's), dropped
  for (const ParamSpec& p : full_param_table(m)) {
    const int64_t n = shape_numel(p.shape);
    auto it = at.find(p.name);
    if (it == at.end()) other.resize(size_t(n));
    init_values(m.cfg, p.name, n, rng, nd, it != at.end() ? it->second.data<float>() : other.data());
  }
  m.arena.copy_from(host);
  init_int_tables(m, rng);
  refresh_compute_weights(m);
}

int init_missing_tensors(Model& m, const io::TensorMap& have, uint64_t seed) {
  int created = 0;
  for (const ParamSpec& p : m.table) {
    if (have.count(p.name)) continue;
    uint64_t h = 14695981039346656037ull;  // FNV-1a of the name: the same stream on every platform
    for (unsigned char ch : p.name) h = (h ^ ch) * 1099511628211ull;
    std::mt19937_64 rng(seed * 1000003ull ^ h);
    std::normal_distribution<float> nd(0.f, static_cast<float>(m.cfg.initializer_range));
    Tensor t = Tensor::empty(p.shape, DType::f32);
    init_values(m.cfg, p.name, t.numel(), rng, nd, t.data<float>());
    m.params.at(p.name).copy_from(t);
    ++created;
  }
  refresh_compute_weights(m);
  return created;
}

void init_tensors(Model& m, const std::vector<std::string>& names, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, static_cast<float>(m.cfg.initializer_range));
  for (const ParamSpec& p : full_param_table(m)) {  // the whole table's stream, as init_model
    if (std::find(names.begin(), names.end(), p.name) == names.end()) continue;
    const Tensor host = Tensor::empty(p.shape, DType::f32);
    init_values(m.cfg, p.name, host.numel(), rng, nd, host.data<float>());
    if (m.params.count(p.name)) m.params.at(p.name).copy_from(host);
  }
  refresh_compute_weights(m);
}

}  // namespace hmla
