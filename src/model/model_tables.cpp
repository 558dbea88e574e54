// The model's tables and memory plans (model.h): its parameters in Hugging Face names, the
// activation arena's table (from the decoder layers' field lists), views of an arena, and the
// plans that check a model and a step fit before anything is allocated.
#include <algorithm>
#include <cctype>
#include <map>
#include <tuple>

#include "hmla/model/decoder_layer.h"
#include "hmla/model/indexer.h"
#include "hmla/model/model.h"
#include "hmla/model/rank_plan.h"
#include "hmla/model/v4_tables.h"
#include "model_internal.h"

namespace hmla {

std::string layer_prefix(int64_t layer) { return "model.layers." + std::to_string(layer) + "."; }

namespace {

// Layer L's entries of the parameter table, in table order; one_expert: a MoE layer's expert 0
// only (the memory plan counts it n_routed_experts times, without a table of them all).
void add_layer_params(std::vector<ParamSpec>& t, const ModelConfig& c, int64_t L, bool indexer, bool one_expert = false) {
  const int64_t hid = c.hidden_size, I = c.intermediate_size;
  const std::string pre = layer_prefix(L);
  t.push_back({pre + "input_layernorm.weight", {hid}});
  for (ParamSpec& p : mla_param_table(c, false, indexer)) t.push_back({pre + "self_attn." + p.name, p.shape});
  t.push_back({pre + "post_attention_layernorm.weight", {hid}});
  auto swiglu = [&](const std::string& at, int64_t width) {
    t.push_back({at + "gate_proj.weight", {width, hid}});
    t.push_back({at + "up_proj.weight", {width, hid}});
    t.push_back({at + "down_proj.weight", {hid, width}});
  };
  if (!c.is_moe_layer(L)) return swiglu(pre + "mlp.", I);
  // A MoE layer's mlp (DESIGN.md section 9) in transformers' names; its router in f32.
  const MoeConfig& m = c.moe;
  t.push_back({pre + "mlp.gate.weight", {m.n_routed_experts, hid}});
  t.push_back({pre + "mlp.gate.e_score_correction_bias", {m.n_routed_experts}});
  for (int64_t e = 0; e < (one_expert ? 1 : m.n_routed_experts); ++e)
    swiglu(pre + "mlp.experts." + std::to_string(e) + ".", m.moe_intermediate_size);
  if (m.n_shared_experts > 0) swiglu(pre + "mlp.shared_experts.", m.shared_intermediate());
}

std::vector<ParamSpec> head_params(const ModelConfig& c) {
  std::vector<ParamSpec> t{{"model.norm.weight", {c.hidden_size}}};
  if (!c.tie_word_embeddings) t.push_back({"lm_head.weight", {c.vocab_size, c.hidden_size}});
  return t;
}

}  // namespace

bool own_indexer(const ModelConfig& c, const std::vector<bool>& has_indexer, int64_t L) {
  return has_indexer.at(size_t(L)) && !c.indexer_shared(L);
}

std::vector<ParamSpec> model_param_table(const ModelConfig& c, const std::vector<bool>& has_indexer) {
  if (c.is_v4()) return v4_param_table(c, false, has_indexer);
  std::vector<ParamSpec> t{{"model.embed_tokens.weight", {c.vocab_size, c.hidden_size}}};
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) add_layer_params(t, c, L, own_indexer(c, has_indexer, L));
  for (ParamSpec& p : head_params(c)) t.push_back(p);
  return t;
}

int64_t routed_expert_of(const std::string& name) {
  const size_t at = name.find(".experts.");
  if (at == std::string::npos) return -1;
  int64_t e = 0;
  size_t i = at + 9;
  for (; i < name.size() && i < at + 18 && std::isdigit(static_cast<unsigned char>(name[i])); ++i) e = e * 10 + (name[i] - '0');
  return i > at + 9 && i < name.size() && name[i] == '.' ? e : -1;
}

std::vector<ParamSpec> expert_shard_table(const std::vector<ParamSpec>& table, int64_t E, int ranks, int rank) {
  if (ranks <= 1) return table;
  HMLA_CHECK(E > 0 && E % ranks == 0, ConfigError, "expert parallelism over ", ranks, " ranks needs n_routed_experts (",
             E, ") to be a multiple of it: each rank holds a contiguous block of the experts");
  const int64_t per = E / ranks, e0 = int64_t(rank) * per;
  std::vector<ParamSpec> t, mine;
  for (const ParamSpec& p : table) {
    const int64_t e = routed_expert_of(p.name);
    if (e < 0) t.push_back(p);
    else if (e >= e0 && e < e0 + per) mine.push_back(p);
  }
  t.insert(t.end(), mine.begin(), mine.end());
  return t;
}

// The activations outside the layers: the embedding's output (the residual stream's start), then,
// after the layers, the final norm's output (the head's input) and its statistics.
ActField embed_field(int64_t hidden) { return {"embed", hidden, true}; }
std::vector<ActField> head_fields(int64_t hidden) { return {{"norm.out", hidden}, {"norm.rstd", 0}}; }

ActSpec act_spec(const ActField& f, int64_t N, DType compute) {
  return {f.name, f.width ? Shape{N, f.width} : Shape{N}, field_dtype(f, compute)};
}

std::vector<ActSpec> activation_table(const ModelConfig& c, const ActRows& r, DType compute) {
  const int64_t hid = c.hidden_size, N = r.b * r.s;
  std::vector<ActSpec> t{act_spec(embed_field(hid), N, compute)};
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) append_layer_table(t, c, L, r, compute);
  for (const ActField& f : head_fields(hid)) t.push_back(act_spec(f, N, compute));
  return t;
}

int64_t table_numel(const std::vector<ParamSpec>& table) {
  int64_t n = 0;
  for (const ParamSpec& p : table) n += shape_numel(p.shape);
  return n;
}

io::TensorMap arena_views(const std::vector<ParamSpec>& table, const Tensor& arena) {
  HMLA_CHECK(arena.numel() == table_numel(table) && arena.is_contiguous(), ShapeError,
             "arena of ", arena.numel(), " values for a table of ", table_numel(table));
  io::TensorMap views;
  int64_t off = 0;
  const Tensor flat = arena.view({arena.numel()});
  for (const ParamSpec& p : table) {
    const int64_t n = shape_numel(p.shape);
    views[p.name] = flat.slice(0, off, off + n).view(p.shape);
    off += n;
  }
  return views;
}

namespace {

// The fields behind the model-level tensors, which are the ones vocab_size and intermediate_size
// blow up (the attention's tensors read their fields off the name and shape).
std::string param_fields(const std::string& name) {
  if (name == "model.embed_tokens.weight" || name == "lm_head.weight" || name == "head.weight")
    return " = vocab_size x hidden_size";
  if (name.find(".ffn.experts.") != std::string::npos) return " = moe_intermediate_size x hidden_size";
  if (name.find(".mlp.gate.") != std::string::npos) return " = n_routed_experts x hidden_size";
  if (name.find(".mlp.experts.") != std::string::npos) return " = moe_intermediate_size x hidden_size";
  if (name.find(".mlp.shared_experts.") != std::string::npos)
    return " = n_shared_experts x moe_intermediate_size x hidden_size";
  if (name.find(".mlp.") != std::string::npos) return " = intermediate_size x hidden_size";
  return "";
}

}  // namespace

// Counted per kind of layer (with or without an indexer, dense or MoE MLP), from one layer of
// each kind: the whole table holds num_hidden_layers x ~15 named entries (a MoE layer's 3 per
// expert more), itself per-layer memory that may be built only once the plan has passed.
namespace {

// The parameter table's entries in its order, each with how many layers repeat it: the embedding,
// the first layer of each kind (its later layers repeat it; a routed expert's entries n_routed_experts
// times more), the final entries.
struct RepeatedEntry {
  ParamSpec p;
  int64_t repeats;
  bool expert;  // a routed expert's (expert parallelism splits these: DESIGN.md section 8)
};
using RepeatedEntries = std::vector<RepeatedEntry>;
template <class Key, class LayerParams>
void add_layer_kinds(RepeatedEntries& entries, const ModelConfig& c, Key key_of, LayerParams params_of,
                     const std::string& expert_infix) {
  std::map<decltype(key_of(int64_t(0))), std::pair<int64_t, int64_t>> kinds;  // kind -> (first, count)
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) ++kinds.try_emplace(key_of(L), L, 0).first->second.second;
  std::vector<std::pair<int64_t, int64_t>> firsts;
  for (const auto& [kind, fc] : kinds) firsts.push_back(fc);
  std::sort(firsts.begin(), firsts.end());
  for (const auto& [L, count] : firsts)
    for (ParamSpec& p : params_of(L)) {
      const bool expert = p.name.find(expert_infix) != std::string::npos;
      entries.push_back({p,
                         expert ? checked_product({{"layers", count}, {"n_routed_experts", c.moe.n_routed_experts}},
                                                  "the parameter count")
                                : count,
                         expert});
    }
}

RepeatedEntries param_entries(const ModelConfig& c, const std::vector<bool>& has_indexer) {
  RepeatedEntries entries{{{"model.embed_tokens.weight", {c.vocab_size, c.hidden_size}}, 1, false}};
  if (c.is_v4()) {
    add_layer_kinds(
        entries, c,
        [&](int64_t L) {
          return std::tuple{c.v4.layer_types[size_t(L)], bool(c.v4.hash[size_t(L)]), v4_has_indexer(c, has_indexer, L)};
        },
        [&](int64_t L) { return v4_layer_params(c, L, true, v4_has_indexer(c, has_indexer, L)); }, ".ffn.experts.0.");
    const std::vector<ParamSpec> all = v4_param_table(c, true);  // its entries after the last layer's
    size_t tail = all.size();
    while (tail > 0 && !all[tail - 1].name.starts_with("model.layers.")) --tail;
    for (size_t i = tail; i < all.size(); ++i) {  // the MTP layers' (where they train) each once, expert 0 E times
      const bool expert = all[i].name.find(".ffn.experts.0.") != std::string::npos;
      entries.push_back({all[i], expert ? c.moe.n_routed_experts : 1, expert});
    }
    return entries;
  }
  add_layer_kinds(
      entries, c, [&](int64_t L) { return std::pair{own_indexer(c, has_indexer, L), c.is_moe_layer(L)}; },
      [&](int64_t L) {
        std::vector<ParamSpec> layer;
        add_layer_params(layer, c, L, own_indexer(c, has_indexer, L), true);
        return layer;
      },
      ".mlp.experts.0.");
  for (ParamSpec& p : head_params(c)) entries.push_back({p, 1, false});
  return entries;
}

}  // namespace

ParamCounts count_parameters(const ModelConfig& c, const std::vector<bool>& has_indexer) {
  HMLA_CHECK(int64_t(has_indexer.size()) == c.num_hidden_layers, ConfigError, "has_indexer needs one entry per layer");
  ParamCounts n;
  for (const auto& [p, repeats, expert] : param_entries(c, has_indexer)) {
    int64_t& to = expert ? n.routed_experts : n.replicated;
    to = checked_add(to, checked_product({{"layers", repeats}, {"values", shape_numel(p.shape)}}, "the parameter count"),
                     "the parameter count");
  }
  return n;
}

namespace {

// V4's hash routing tables (i32, replicated on every rank) and, on a device whose compute dtype is
// not f32, the weights' compute copy (Model::compute_arena) of `params` values.
void plan_int_tables_and_copy(MemoryPlan& plan, const ModelConfig& c, int64_t params, DType compute) {
  int64_t ints = 0;
  for (const ParamSpec& p : v4_int_tables(c)) ints = checked_add(ints, shape_numel(p.shape), "the tid2eid tables");
  if (ints > 0)
    plan.add_bytes("the hash layers' tid2eid tables", checked_product({{"values", ints}, {"bytes", 4}}, "tid2eid"),
                   std::to_string(ints) + " values of 4 bytes (i32, no gradient)");
  if (compute != DType::f32)
    plan.add_bytes(std::string("the weights' ") + dtype_name(compute) + " compute copy",
                   checked_product({{"parameters", params}, {"bytes", int64_t(dtype_size(compute))}}, "the parameters"),
                   std::to_string(params) + " values of " + std::to_string(dtype_size(compute)) + " bytes");
}

}  // namespace

// Counted per kind of layer (MLA: with or without an indexer, dense or MoE MLP; V4: its attention
// kind, hash or learned routing, and a hybrid_mla layer's indexer), from one layer of each kind:
// the whole table holds num_hidden_layers x ~15 named entries (a MoE layer's 3 per expert more),
// itself per-layer memory that may be built only once the plan has passed.
void plan_parameters(MemoryPlan& plan, const ModelConfig& c, const std::vector<bool>& has_indexer, bool training,
                     DType compute, int64_t ep) {
  const ParamCounts n = count_parameters(c, has_indexer);
  const int64_t total = n.replicated + n.routed_experts / std::max<int64_t>(ep, 1);  // ep divides every layer's experts
  const RepeatedEntries entries = param_entries(c, has_indexer);
  const ParamSpec* big = nullptr;
  for (const RepeatedEntry& e : entries)
    if (!big || shape_numel(e.p.shape) > shape_numel(big->shape)) big = &e.p;
  const std::string largest = big ? "; the largest: " + big->name + " " + shape_str(big->shape) + param_fields(big->name)
                                  : "";
  const int64_t copies = training ? 3 : 1;
  plan.add_bytes(training ? "the parameters, their gradients and the optimizer's moments" : "the parameters",
                 checked_product({{"parameters", total}, {"copies", copies}, {"bytes", 4}}, "the parameters"),
                 std::to_string(total) + " values" + (ep > 1 ? " (this rank's 1/" + std::to_string(ep) + " of the routed experts)" : "") +
                     (training ? " x 3 copies" : "") + " of 4 bytes" + largest);
  plan_int_tables_and_copy(plan, c, total, compute);
}

void plan_rank_parameters(MemoryPlan& plan, const ModelConfig& c, const std::vector<bool>& has_indexer,
                          const RankShare& r, DType compute) {
  HMLA_CHECK(r.ep >= 1 && r.copies >= 1 && r.copies % r.ep == 0, ConfigError, "expert parallel size ", r.ep,
             " must divide the ", r.copies, " ranks holding each replicated tensor");
  const MoeConfig& m = c.moe;
  HMLA_CHECK(r.ep == 1 || c.has_moe_layers(), ConfigError, "--ep ", r.ep, ": the model has no MoE layers (use --ep 1)");
  HMLA_CHECK(r.ep == 1 || m.n_routed_experts % r.ep == 0, ConfigError, "--ep ", r.ep, " does not divide n_routed_experts = ",
             m.n_routed_experts, ": each EP rank holds a contiguous block of n_routed_experts / ep experts per MoE layer");
  const ParamCounts n = count_parameters(c, has_indexer);
  const int64_t experts = n.routed_experts / r.ep;  // exact: ep divides every MoE layer's expert count
  const int64_t held = checked_add(n.replicated, experts, "the rank's parameters");
  const std::string split = std::to_string(n.replicated) + " replicated + " + std::to_string(experts) +
                            " of the routed experts' " + std::to_string(n.routed_experts) +
                            (r.ep > 1 ? " (n_routed_experts / ep = " + std::to_string(m.n_routed_experts / r.ep) +
                                            " experts per MoE layer)"
                                      : "");
  const int64_t held_bytes = checked_product({{"values", held}, {"bytes", 4}}, "the rank's parameters");
  plan.add_bytes("the parameters (f32)", held_bytes, split + " values of 4 bytes");
  plan.add_bytes("their gradients (f32)", held_bytes, split + " values of 4 bytes");
  // ZeRO-1: the replicated part over the ranks holding it, each expert over the copies / ep ranks
  // that hold it; a rank keeps at least the rounded-up share of each (whole tensors: up to one more).
  const int64_t rep_share = r.shard_optimizer ? (n.replicated + r.copies - 1) / r.copies : n.replicated;
  const int64_t replicas = r.copies / r.ep;
  const int64_t exp_share = r.shard_optimizer ? (experts + replicas - 1) / replicas : experts;
  const int64_t moments = checked_add(rep_share, exp_share, "the optimizer's state");
  plan.add_bytes("the optimizer's moments (f32, 2 per parameter)",
                 checked_product({{"values", moments}, {"moments", 2}, {"bytes", 4}}, "the optimizer's state"),
                 r.shard_optimizer ? "sharded over cp x dp = " + std::to_string(r.copies) + ": " + std::to_string(rep_share) +
                                         " replicated + " + std::to_string(exp_share) + " expert values (over cp x dp / ep = " +
                                         std::to_string(replicas) + " replicas) x 2 of 4 bytes"
                                   : std::to_string(moments) + " values x 2 of 4 bytes");
  plan_int_tables_and_copy(plan, c, held, compute);
}

void plan_activation_table(MemoryPlan& plan, const ModelConfig& c, const SizeFactor& rows, const SizeFactor& s,
                           DType compute, bool recompute) {
  // Counted from the layers' fields (layer_fields, the one list of them), grouped by kind (the
  // dense layers' fields, then a MoE layer's routing buffers, per-expert and shared-expert
  // activations), width and dtype.
  enum Kind { kLayer, kRouting, kExperts, kShared };
  auto kind_of = [](const ActField& a) {
    const std::string n = a.name;
    return n.starts_with("router.") ? kRouting : n.starts_with("experts.") ? kExperts : n.starts_with("shared.") ? kShared
                                                                                                                  : kLayer;
  };
  std::map<std::tuple<int, int64_t, DType>, int64_t> fields_of;
  for (int64_t L = 0; L < c.num_hidden_layers; ++L)
    for (const ActField& a : layer_fields(c, L)) ++fields_of[{kind_of(a), a.width, field_dtype(a, compute)}];
  const int64_t k = c.moe.num_experts_per_tok;
  for (const auto& [key, n] : fields_of) {
    const auto [kind, width, dt] = key;
    const int64_t bytes = int64_t(dtype_size(dt));
    const SizeFactor count{std::to_string(n) + " fields of the layers", n};
    const std::string in_dt = std::string(" (") + dtype_name(dt) + ")";
    if (kind == kRouting) {
      plan.add("the MoE layers' routing buffers" + in_dt, {count, rows, s, {"num_experts_per_tok", k}}, bytes);
    } else if (kind == kExperts) {
      plan.add("the MoE layers' per-expert activations" + in_dt,
               {count, rows, s, {"num_experts_per_tok", k}, {"moe_intermediate_size", width / k}}, bytes);
    } else if (kind == kShared) {
      plan.add("the MoE layers' shared-expert activations" + in_dt,
               {count, rows, s, {"n_shared_experts x moe_intermediate_size", width}}, bytes);
    } else if (width == 0) {
      plan.add("the layers' RMSNorm statistics", {count, rows, s}, bytes);
    } else {
      const std::string name = width == c.hidden_size         ? "hidden_size"
                               : width == c.intermediate_size ? "intermediate_size"
                                                              : std::to_string(width);
      plan.add(std::string(width == c.hidden_size ? "the layers' hidden states" : "the layers' MLP activations") +
                   in_dt,
               {count, rows, s, {name, width}}, bytes);
    }
  }
  // The attention's saved tensors (mla_fields, the one list of them): each a multiple of the
  // query rows (one rank: S = s), its per-row size read off the table of a single row, grouped by
  // field and dtype over the layers that keep it.
  std::map<std::pair<std::string, DType>, std::pair<int64_t, int64_t>> attn;  // -> (layers, values per row)
  for (int64_t L = 0; L < c.num_hidden_layers; ++L)
    for (const MlaField& f : mla_fields(c, L, 1, 1, 1, compute, recompute)) {
      auto& [n, per_row] = attn[{f.name, f.dtype}];
      ++n, per_row = shape_numel(f.shape);  // the same in every layer that keeps the field
    }
  for (const auto& [key, v] : attn) {
    const auto [name, dt] = key;
    plan.add("the attention's " + name + " (" + dtype_name(dt) + ")",
             {{std::to_string(v.first) + " layers", v.first}, rows, s, {"values per row", v.second}}, int64_t(dtype_size(dt)));
  }
  const SizeFactor hid{"hidden_size", c.hidden_size};
  plan.add("the embedding's output", {rows, s, hid}, int64_t(dtype_size(field_dtype(embed_field(c.hidden_size), compute))));
  for (const ActField& f : head_fields(c.hidden_size))
    plan.add(f.width ? "the final norm's output" : "the final norm's statistics",
             f.width ? std::vector<SizeFactor>{rows, s, hid} : std::vector<SizeFactor>{rows, s},
             int64_t(dtype_size(field_dtype(f, compute))));
}

void plan_activations(MemoryPlan& plan, const ModelConfig& c, const SizeFactor& rows, const SizeFactor& s,
                      bool training, DType compute, bool recompute) {
  const int64_t f = sizeof(float);
  const SizeFactor V{"vocab_size", c.vocab_size};
  if (training) {  // the LM head runs over chunks of rows (lm_head_loss), the gradient over the logits
    const int64_t n = std::min(checked_product({rows, s}, "the rows"), head_chunk_rows(c.vocab_size));
    plan.add("the logits (then their gradient) of a chunk of rows",
             {{"min(rows, " + std::to_string(head_chunk_rows(c.vocab_size)) + ")", n}, V}, f);
  } else {
    plan.add("the logits", {rows, s, V}, f);
  }
  if (c.is_v4()) plan_v4_activations(plan, c, rows, s, compute);
  else plan_activation_table(plan, c, rows, s, compute, recompute);
  if (c.has_moe_layers()) {  // one MoE layer's f32 workspace at a time (MoeMlp in mlp.cpp)
    const MoeConfig& m = c.moe;
    const SizeFactor k{"num_experts_per_tok", m.num_experts_per_tok};
    // forward: the router's logits [E], the experts' input and output rows [k, hidden] per token;
    // backward: the input rows, dy's and dx's rows [k, hidden], actw, dz, dact, dg, du [k, I],
    // dlogits [E] per token.
    const SizeFactor width{training ? "3 x hidden_size + 5 x moe_intermediate_size" : "2 x hidden_size",
                           training ? checked_add(3 * c.hidden_size, 5 * m.moe_intermediate_size, "a MoE width")
                                    : 2 * c.hidden_size};
    plan.add("a MoE layer's expert rows (workspace)", {rows, s, k, width}, f);
    plan.add("a MoE layer's router logits (workspace)", {rows, s, {"n_routed_experts", m.n_routed_experts}}, f);
  }
}

void plan_ep_buffers(MemoryPlan& plan, const ModelConfig& c, const SizeFactor& rows, const SizeFactor& s, int64_t ep,
                     DType compute) {
  if (ep <= 1 || !c.has_moe_layers()) return;
  plan.add("the EP dispatch and combine buffers (balanced routing: N k rows received)",
           {rows, s, {"num_experts_per_tok", c.moe.num_experts_per_tok}, {"send and receive x dispatch and combine", 4},
            {"hidden_size", c.hidden_size}},
           int64_t(dtype_size(compute)));
}

}  // namespace hmla
