// The model's tables and memory plans (model.h): its parameters in Hugging Face names, the
// activation arena's table (from the decoder layers' field lists), views of an arena, and the
// plans that check a model and a step fit before anything is allocated.
#include <map>

#include "hmla/model/decoder_layer.h"
#include "hmla/model/indexer.h"
#include "hmla/model/model.h"
#include "model_internal.h"

namespace hmla {

std::string layer_prefix(int64_t layer) { return "model.layers." + std::to_string(layer) + "."; }

namespace {

// Layer L's entries of the parameter table, in table order.
void add_layer_params(std::vector<ParamSpec>& t, const ModelConfig& c, int64_t L, bool indexer) {
  const int64_t hid = c.hidden_size, I = c.intermediate_size;
  const std::string pre = layer_prefix(L);
  t.push_back({pre + "input_layernorm.weight", {hid}});
  for (ParamSpec& p : mla_param_table(c, false, indexer)) t.push_back({pre + "self_attn." + p.name, p.shape});
  t.push_back({pre + "post_attention_layernorm.weight", {hid}});
  t.push_back({pre + "mlp.gate_proj.weight", {I, hid}});
  t.push_back({pre + "mlp.up_proj.weight", {I, hid}});
  t.push_back({pre + "mlp.down_proj.weight", {hid, I}});
}

std::vector<ParamSpec> head_params(const ModelConfig& c) {
  std::vector<ParamSpec> t{{"model.norm.weight", {c.hidden_size}}};
  if (!c.tie_word_embeddings) t.push_back({"lm_head.weight", {c.vocab_size, c.hidden_size}});
  return t;
}

}  // namespace

std::vector<ParamSpec> model_param_table(const ModelConfig& c, const std::vector<bool>& has_indexer) {
  std::vector<ParamSpec> t{{"model.embed_tokens.weight", {c.vocab_size, c.hidden_size}}};
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) add_layer_params(t, c, L, has_indexer.at(L));
  for (ParamSpec& p : head_params(c)) t.push_back(p);
  return t;
}

// The activations outside the layers: the embedding's output (the residual stream's start), then,
// after the layers, the final norm's output (the head's input) and its statistics.
ActField embed_field(int64_t hidden) { return {"embed", hidden, true}; }
std::vector<ActField> head_fields(int64_t hidden) { return {{"norm.out", hidden}, {"norm.rstd", 0}}; }

ActSpec act_spec(const ActField& f, int64_t N, DType compute) {
  return {f.name, f.width ? Shape{N, f.width} : Shape{N}, field_dtype(f, compute)};
}

std::vector<ActSpec> activation_table(const ModelConfig& c, int64_t N, DType compute) {
  const int64_t hid = c.hidden_size;
  std::vector<ActSpec> t{act_spec(embed_field(hid), N, compute)};
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) append_layer_table(t, layer_fields(c, L), L, N, compute);
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
  if (name == "model.embed_tokens.weight" || name == "lm_head.weight") return " = vocab_size x hidden_size";
  if (name.find(".mlp.") != std::string::npos) return " = intermediate_size x hidden_size";
  return "";
}

}  // namespace

// Counted per kind of layer (with and without an indexer), from one layer of each kind: the whole
// table holds num_hidden_layers x ~15 named entries, itself per-layer memory that may be built
// only once the plan has passed.
void plan_parameters(MemoryPlan& plan, const ModelConfig& c, const std::vector<bool>& has_indexer, bool training,
                     DType compute) {
  HMLA_CHECK(int64_t(has_indexer.size()) == c.num_hidden_layers, ConfigError, "has_indexer needs one entry per layer");
  // The table's entries in its order, each with how many layers repeat it: the embedding, the
  // first layer of each kind (its later layers repeat it), the final norm and the head.
  std::vector<std::pair<ParamSpec, int64_t>> entries{{{"model.embed_tokens.weight", {c.vocab_size, c.hidden_size}}, 1}};
  const int64_t with = std::count(has_indexer.begin(), has_indexer.end(), true), without = c.num_hidden_layers - with;
  const int64_t first_with = std::find(has_indexer.begin(), has_indexer.end(), true) - has_indexer.begin();
  const int64_t first_without = std::find(has_indexer.begin(), has_indexer.end(), false) - has_indexer.begin();
  for (int64_t L : {std::min(first_with, first_without), std::max(first_with, first_without)}) {
    if (L >= c.num_hidden_layers) continue;
    std::vector<ParamSpec> layer;
    add_layer_params(layer, c, L, has_indexer[L]);
    for (ParamSpec& p : layer) entries.push_back({p, has_indexer[L] ? with : without});
  }
  for (ParamSpec& p : head_params(c)) entries.push_back({p, 1});
  int64_t total = 0;
  const ParamSpec* big = nullptr;
  for (const auto& [p, repeats] : entries) {
    total = checked_add(total, checked_product({{"layers", repeats}, {"values", shape_numel(p.shape)}}, "the parameter count"),
                        "the parameter count");
    if (!big || shape_numel(p.shape) > shape_numel(big->shape)) big = &p;
  }
  const std::string largest = big ? "; the largest: " + big->name + " " + shape_str(big->shape) + param_fields(big->name)
                                  : "";
  const int64_t copies = training ? 3 : 1;
  plan.add_bytes(training ? "the parameters, their gradients and the optimizer's moments" : "the parameters",
                 checked_product({{"parameters", total}, {"copies", copies}, {"bytes", 4}}, "the parameters"),
                 std::to_string(total) + " values" + (training ? " x 3 copies" : "") + " of 4 bytes" + largest);
  if (compute != DType::f32)  // Model::compute_arena: every parameter, in the compute dtype
    plan.add_bytes(std::string("the weights' ") + dtype_name(compute) + " compute copy",
                   checked_product({{"parameters", total}, {"bytes", int64_t(dtype_size(compute))}}, "the parameters"),
                   std::to_string(total) + " values of " + std::to_string(dtype_size(compute)) + " bytes");
}

void plan_activation_table(MemoryPlan& plan, const ModelConfig& c, const SizeFactor& rows, const SizeFactor& s,
                           DType compute) {
  // Counted from the layers' fields (layer_fields, the one list of them), grouped by width and
  // dtype.
  std::map<std::pair<int64_t, DType>, int64_t> fields_of;
  for (int64_t L = 0; L < c.num_hidden_layers; ++L)
    for (const ActField& a : layer_fields(c, L)) ++fields_of[{a.width, field_dtype(a, compute)}];
  for (const auto& [key, n] : fields_of) {
    const auto [width, dt] = key;
    const int64_t bytes = int64_t(dtype_size(dt));
    const SizeFactor count{std::to_string(n) + " fields of the layers", n};
    if (width == 0) {
      plan.add("the layers' RMSNorm statistics", {count, rows, s}, bytes);
    } else {
      const std::string name = width == c.hidden_size         ? "hidden_size"
                               : width == c.intermediate_size ? "intermediate_size"
                                                              : std::to_string(width);
      plan.add(std::string(width == c.hidden_size ? "the layers' hidden states" : "the layers' MLP activations") +
                   " (" + dtype_name(dt) + ")",
               {count, rows, s, {name, width}}, bytes);
    }
  }
  const SizeFactor hid{"hidden_size", c.hidden_size};
  plan.add("the embedding's output", {rows, s, hid}, int64_t(dtype_size(field_dtype(embed_field(c.hidden_size), compute))));
  for (const ActField& f : head_fields(c.hidden_size))
    plan.add(f.width ? "the final norm's output" : "the final norm's statistics",
             f.width ? std::vector<SizeFactor>{rows, s, hid} : std::vector<SizeFactor>{rows, s},
             int64_t(dtype_size(field_dtype(f, compute))));
}

void plan_activations(MemoryPlan& plan, const ModelConfig& c, const SizeFactor& rows, const SizeFactor& s,
                      bool training, DType compute) {
  const int64_t f = sizeof(float);
  const SizeFactor layers{"num_hidden_layers", c.num_hidden_layers};
  const SizeFactor V{"vocab_size", c.vocab_size};
  if (training) {  // the LM head runs over chunks of rows (lm_head_loss)
    const int64_t n = std::min(checked_product({rows, s}, "the rows"), head_chunk_rows(c.vocab_size));
    plan.add("the logits and their gradient of a chunk of rows",
             {{"2", 2}, {"min(rows, " + std::to_string(head_chunk_rows(c.vocab_size)) + ")", n}, V}, f);
  } else {
    plan.add("the logits", {rows, s, V}, f);
  }
  plan_activation_table(plan, c, rows, s, compute);
  std::map<LayerMode, int64_t> count;
  for (LayerMode m : c.layer_modes) ++count[m];
  for (const auto& [mode, n] : count) {
    const SizeFactor in_mode{n == c.num_hidden_layers ? "num_hidden_layers" : std::string("layers in ") + mode_name(mode),
                             n};
    mla_memory_plan(plan, c, mode, in_mode, rows, s, compute);
  }
}

}  // namespace hmla
