// The decoder-only model in Hugging Face DeepSeek-V3.2 structure and names: embed_tokens, layers
// of (input_layernorm, MLA self_attn [+ indexer], post_attention_layernorm, SwiGLU mlp), norm,
// lm_head (or tied). Parameters live in one arena planned from one table; gradients and optimizer
// state use arenas of the same table. Forward and backward are explicit (no tape).
#pragma once
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "hmla/core/layout.h"
#include "hmla/data/batch.h"
#include "hmla/dist/comm.h"
#include "hmla/io/safetensors.h"
#include "hmla/model/config.h"
#include "hmla/model/mla_layer.h"
#include "hmla/model/mlp.h"

namespace hmla {

std::string layer_prefix(int64_t layer);  // "model.layers.{L}."

// The one table of the model's tensors, in arena order. Layers with has_indexer[L] carry the
// five indexer tensors, but for a "shared" layer of indexer_types (IndexShare: it never has any).
bool own_indexer(const ModelConfig& c, const std::vector<bool>& has_indexer, int64_t L);
std::vector<ParamSpec> model_param_table(const ModelConfig& c, const std::vector<bool>& has_indexer);

// Expert parallelism's storage (DESIGN.md section 8, docs/scale_out.md "Expert parallel"): the
// routed expert a table name belongs to ("...experts.{e}.*": e; -1 for any other tensor, the shared
// experts' included), and rank `rank` of `ranks`'s table: the entries every rank holds first, in
// `table`'s order, then its block [rank E / ranks, (rank + 1) E / ranks) of every MoE layer's
// routed experts (E = n_routed_experts; hash and MTP layers' included), in `table`'s order. So a
// rank's expert gradients are one contiguous slice of its arenas, summed over other ranks than the
// rest. One rank: `table` as it is.
int64_t routed_expert_of(const std::string& name);
std::vector<ParamSpec> expert_shard_table(const std::vector<ParamSpec>& table, int64_t E, int ranks, int rank);

// Views of a table-ordered f32 arena, by name.
io::TensorMap arena_views(const std::vector<ParamSpec>& table, const Tensor& arena);
int64_t table_numel(const std::vector<ParamSpec>& table);

// The activations a forward keeps, over b x s tokens of S key rows (ActRows), in arena order:
// "embed" (the embedding's output); per layer "layers.{L}.<field>" for each of layer_fields
// (decoder_layer.h: a, h_mid, mn, out, rstd1, rstd2, then the MLP's fields, for the dense MLP
// g, u, act), then "layers.{L}.attn.<field>" for each of the attention's saved tensors
// (mla_layer.h's mla_fields: by mode; the core's output and statistics unless r.recompute);
// then "norm.out", "norm.rstd". A forward takes its views from one arena of this table in the
// same order (take_layer_views reads the same field lists), and plan_activation_table counts the
// same fields: the order is written once. Each entry in its dtype for the device's compute dtype
// `compute` (Backend::compute_dtype: f32 on the CPU, bf16 on CUDA).
std::vector<ActSpec> activation_table(const ModelConfig& c, const ActRows& r, DType compute);

// Memory plans (size_check.h): the parameters of this config (training: with their gradients and
// the optimizer's moments), and what a forward over rows x s tokens keeps (logits, the activation
// table: each layer's hidden states, MLP activations and the attention's saved tensors; training:
// the logits' gradient; recompute: without the attention cores). Lower bounds, each named by the
// fields that drive it, for a device whose compute dtype is `compute` (the activations' element
// sizes; a compute dtype other than f32 adds the weights' compute copy).
// With ep > 1: one expert-parallel rank's (its block of the routed experts).
void plan_parameters(MemoryPlan& plan, const ModelConfig& c, const std::vector<bool>& has_indexer, bool training,
                     DType compute, int64_t ep = 1);
void plan_activations(MemoryPlan& plan, const ModelConfig& c, const SizeFactor& rows, const SizeFactor& s,
                      bool training, DType compute, bool recompute = false);
// The part of it that is activation_table, to the byte for one rank (S = s; overflow-checked: it
// runs before anything is allocated).
void plan_activation_table(MemoryPlan& plan, const ModelConfig& c, const SizeFactor& rows, const SizeFactor& s,
                           DType compute, bool recompute = false);

struct Model {
  ModelConfig cfg;
  // Expert parallelism's group (build_model's `ep`; Mlp::ep): this rank holds and computes only its
  // block of the routed experts (expert_shard_table), and every forward's MoE layers exchange rows
  // over the group, so every rank of it runs each forward. Null: every expert on this rank.
  Comm* ep = nullptr;
  std::vector<bool> has_indexer;  // per layer
  std::vector<ParamSpec> table;   // this rank's (expert_shard_table of model_param_table)
  size_t first_expert = 0;        // under ep: the table's first routed expert (the rest are too); else table.size()
  Tensor arena;          // every parameter, f32, table order: the master weights
  io::TensorMap params;  // full name -> view into arena (the checkpoint boundary)
  ModelTensors w;        // the same views, typed (what the optimizer and the norms read)
  // What the products read (DESIGN.md section 4): on a device whose compute dtype is not f32
  // (CUDA: bf16), the weight matrices are views of compute_arena, a copy of the arena in that
  // dtype, and the vectors (norm weights, biases, the sink) and the embedding table (read by
  // rows, never by a product; its tied lm_head is) are w's; on the CPU, w itself. Whatever
  // writes the arena refreshes the copy (refresh_compute_weights): init_model, load_into_model
  // and the optimizer's step do, once each.
  Tensor compute_arena;  // undefined where the compute dtype is f32
  ModelTensors wc;
  // mqa_split_kv_b_proj (DESIGN.md section 1) on the latent layers: each computes with k_b_proj /
  // v_b_proj split from its kv_b_proj when it runs, and its gradient is folded back (both
  // bit-exact copies), so the arena, the gradients, the optimizer and checkpoints keep kv_b_proj.
  bool split_kv_b_proj = false;
  // Who computes the dense attention on CUDA (hmla/ops/attention.h): the programme's
  // attention_backend, handed to every layer's attention call (no process-wide switch).
  AttnBackend attn_backend = AttnBackend::auto_;
  // Tensors the model carries without computing with them, as the checkpoint stored them, written
  // back on every save: the multi-token-prediction layers (CheckpointTensors::kept).
  io::StoredMap kept;
  // Integer tables the model computes with but never trains (DeepSeek-V4's hash layers'
  // ffn.gate.tid2eid, v4_int_tables): i32 on the host whatever the device (a micro-batch's experts
  // are looked up there and uploaded with it: model_internal.h's DeviceBatch), stored as the
  // checkpoint's I64.
  io::TensorMap ints;
  // DeepSeek-V4 (v4_model.h): the names' views the V4 layers compute with, by Model::wc's rule
  // (the compute copy's matrices where a product reads them; f32 views for the rest, and for the
  // embedding, the routers' gates, the mHC projections and the compressors' position biases, which
  // their ops read in f32). Empty where the compute dtype is f32: params is what they read.
  io::TensorMap compute_params;
  Device device() const { return arena.device(); }  // where it computes (every tensor of a step)
  // The RoPE tables (rope_cache) of s rows from position pos0, on the model's device: made and
  // uploaded once per shape, so a step uploads none. They depend on the config's RoPE fields
  // only, which no phase changes.
  const RopeCache& rope(int64_t s, int64_t pos0) const;
  // A constant the steps read (a RoPE table of DeepSeek-V4's, a vector of ones), made by `make` on
  // the host and uploaded the first time `key` is asked for, then kept: a step uploads none.
  const Tensor& constant(const std::string& key, const std::function<Tensor()>& make) const;

 private:
  mutable std::map<std::pair<int64_t, int64_t>, RopeCache> rope_;
  mutable std::map<std::string, Tensor> constants_;
};

// Allocates the arena (zeros, on `device`) for this config, MoE layers included. With an expert-
// parallel group `ep` of more than one rank, the arena holds this rank's table only (Model::ep;
// ConfigError where ep does not divide n_routed_experts). Throws ConfigError for a dense MLP
// without intermediate_size / a model without vocab_size.
Model build_model(const ModelConfig& c, const std::vector<bool>& has_indexer, Device device = Device::cpu,
                  Comm* ep = nullptr);
// The whole model's table (every expert), whatever this rank holds.
std::vector<ParamSpec> full_param_table(const Model& m);
// The compute copy of the weights from the arena (one conversion on the device; nothing where
// the compute dtype is f32). Call it after writing m.arena or m.params directly.
void refresh_compute_weights(Model& m);

// N(0, initializer_range) for matrices and embeddings, 1 for norm weights, 0 for biases and the
// sink; indexer tensors per indexer_init_missing's rule. Drawn over the whole table, so that an
// expert-parallel rank's block holds what one rank's would.
void init_model(Model& m, uint64_t seed);
// The table's tensors absent from `have`, each initialised by init_model's rule from its own
// stream (seeded by `seed` and its name); returns how many. The phases' new indexers on V4 stacks.
int init_missing_tensors(Model& m, const io::TensorMap& have, uint64_t seed);
// The same rule for the named tensors only (in table order, from their own generator of `seed`):
// a checkpoint's missing MTP layers or MTP indexers (load_checkpoint_into_model's `initialised`).
void init_tensors(Model& m, const std::vector<std::string>& names, uint64_t seed);
// Copies checkpoint tensors in (names and shapes must match the table; bf16 is widened; under
// expert parallelism the other ranks' experts are checked by name and skipped).
// Tensors in `skip_missing` may be absent from the checkpoint (they keep their current values).
void load_into_model(Model& m, const io::TensorMap& tensors, const std::string& what,
                     const std::vector<std::string>& may_be_missing = {});

// The layers whose indexer tensors `w` (a checkpoint's) holds: an MLA layer's self_attn.indexer.*,
// a V4 CSA layer's attn.indexer.*; the has_indexer to build a model for them.
std::vector<bool> checkpoint_indexers(const ModelConfig& c, const io::TensorMap& w);

// An expert table (DeepSeek-V4's tid2eid: I64 or I32 of shape `need`, each row distinct experts in
// [0, E)) as i32 values; IoError "<what>: tensor 'name' ..." naming the first bad entry.
std::vector<int32_t> expert_table(const Tensor& t, const Shape& need, int64_t E, const std::string& what,
                                  const std::string& name);

// A model's weights as its checkpoint stores them (model_save.cpp): every parameter f32 in the
// table's names (host views of the arena: `host_params`, or made here), the integer tables as I64
// (transformers' dtype for tid2eid), and m.kept as read; checked first (finite weights, valid expert
// tables: IoError naming the tensor, nothing written). In `dir`: model.safetensors, or with
// max_shard_bytes > 0 shards model-0000i-of-0000n.safetensors of at most that many bytes (a bigger
// tensor alone in its shard) and model.safetensors.index.json, transformers' sharded form; each file
// written atomically (the index last), and the other form's stale file removed so that a reader
// never picks it.
void save_model_weights(const std::string& dir, const Model& m, const io::TensorMap& host_params,
                        int64_t max_shard_bytes = 0);
// The same from host_params(m): under expert parallelism every rank of the group calls it, and the
// group's rank 0 writes (the others write nothing).
void save_model_weights(const std::string& dir, const Model& m, int64_t max_shard_bytes = 0);
// The whole model's parameters as host tensors by name (one copy of the arena off a device). Under
// expert parallelism (Model::ep) a collective of the EP group: every rank calls it; the group's
// rank 0 gets every rank's experts (each rank's arena tail, gathered), the others their own table.
io::TensorMap host_params(const Model& m);

// load_into_model of ck.tensors, then ck.kept into m.kept (counted first, as host memory, by a
// memory plan: IoError/MemoryError before it is moved in). Where the model trains its MTP layers
// (V4Config::mtp_params), an MTP layer of which the checkpoint holds no tensor at all (transformers
// saves none) is initialised from `seed` (init_tensors), and so is a hybrid_mla MTP layer's indexer
// (self_attn.indexer.*) that a checkpoint holding the layer lacks; their names are returned. A layer
// the checkpoint holds in part otherwise is an IoError naming the missing tensor.
std::vector<std::string> load_checkpoint_into_model(Model& m, CheckpointTensors ck, const std::string& what,
                                                    uint64_t seed = 0);

// Loss rows of the step (DESIGN.md section 3). LM targets: t -> t + 1 inside t's document, with
// input_ids[t + 1] != pad; with `ahead` = k + 1, the multi-token-prediction depth k's targets t -> t
// + k + 1 by the same rules (docs/deepseek_v4_math.md section 14).
int64_t count_lm_targets(const Batch& batch, int64_t pad_token_id, int64_t ahead = 1);

struct StepOptions {
  bool backbone = true;        // false: only the indexers' backward runs (train_indexer_only)
  int64_t lm_targets = 0;      // the step's global LM target count (0: this batch's)
  int64_t valid_rows = 0;      // the step's global valid_rows for the indexer KL (0: this batch's)
  bool recompute_attention = false;  // drop each core's output after the forward, rebuild it in the backward
  // Optional: the step's f64 [kStatCount] stats buffer on the model's device (hmla/ops/optim.h).
  // Given, the micro-batch's LM loss and KL are ADDED into its kStatLm and kStatKl slots on the
  // device (nothing is read back) and StepStats' are NaN; else they are read back into StepStats.
  Tensor stats;
  // MoE load balancing (docs/moe.md "Load balancing"), over the MoE layers in layer order:
  // expert_load (f64 [n_moe, E]) gets each layer's expert counts over this micro-batch's loss rows
  // ADDED (undefined: nothing is counted); moe_aux_coeff > 0 (alpha, with the backbone) adds the
  // sequence-wise balance loss over aux_sequences (B, the step's global count of sequences with a
  // loss row: loss_sequence_count) to the backward, each layer's value ADDED into aux_loss (f64
  // [n_moe]). Under CP the rows' counts are summed over the group first.
  Tensor expert_load;
  double moe_aux_coeff = 0;
  int64_t aux_sequences = 0;
  Tensor aux_loss;
  // Multi-token prediction (DeepSeek-V4 stacks whose MTP layers are parameters, V4Config::mtp_params;
  // docs/deepseek_v4_math.md section 14): mtp_coeff > 0 adds mtp_coeff / D sum_k CE_k to what the
  // backward differentiates (D = num_nextn_predict_layers, CE_k depth k's mean over its targets);
  // mtp_targets[k] is depth k's global target count over the step (count_lm_targets with ahead =
  // k + 2; empty: this batch's own); with stats, the micro-batch's (1 / D) sum_k CE_k is ADDED into
  // its kStatMtp slot, without the coefficient. 0: the step is today's, bit for bit.
  double mtp_coeff = 0;
  std::vector<int64_t> mtp_targets;
  // DeepSeek-V4 stacks' attention mass (docs/v4_attention.md "Attention mass"), computed only when
  // given (the trainer's logging steps): f64 [3, 4] on the model's device, a row per kind in
  // V4Kind's order (sliding, CSA, HCA); each V4 attention layer of the stack ADDS into its kind's
  // row the probability its softmax puts on the window keys, the compressed entries and the sink,
  // summed over this micro-batch's loss rows (row weight > 0) and heads, and the count of those
  // (row, head) pairs: [window, entries, sink, count]. The extra forward only reads: the step is
  // today's, bit for bit.
  Tensor attn_mass;
};

// The MoE layers of c, in layer order (the rows of StepOptions::expert_load).
std::vector<int64_t> moe_layers(const ModelConfig& c);
// MoE layer L's router correction bias, which the balancing rule updates (docs/moe.md): DeepSeek-V3.2
// and GLM-5's mlp.gate.e_score_correction_bias, DeepSeek-V4's ffn.gate.bias; "" for a V4 hash layer
// (it routes by tid2eid and has none).
std::string moe_bias_name(const ModelConfig& c, int64_t L);
// A tensor the optimizer leaves alone: a router correction bias (no gradient; moe_bias_name's).
bool is_router_bias(const std::string& name);

struct StepStats {
  double lm_loss = 0;      // sum over targets of CE / lm_targets
  double indexer_kl = 0;   // mean over the layers that run an indexer (dsa modes, not "shared") of sum rw kl, without coeff
  // A DeepSeek-V4 stack's: the same means over its CSA layers and over its hybrid_mla layers (NaN
  // where the kind runs none, and with StepOptions::stats: then kStatKlCsa has the CSA one).
  double indexer_kl_csa = NAN, indexer_kl_hybrid = NAN;
  double mtp_loss = 0;     // with mtp_coeff > 0: (1 / D) sum_k CE_k, without coeff (NaN with StepOptions::stats: kStatMtp has it)
  int64_t tokens = 0;
};

// Context parallelism: with a group `cp` of R ranks, every rank holds the whole batch (ids and
// layout) and computes its row shard [r * s / R, (r + 1) * s / R) (row_shard); per-row outputs
// are that shard's, losses and gradients this rank's share (the group's sum is the whole), with
// denominators over the whole batch. Comm::self() is one rank.

// Forward and backward of one micro-batch; gradients are ADDED into `grads` (views of a gradient
// arena with the model's table).
StepStats model_step(const Model& m, const Batch& batch, const StepOptions& opt, io::TensorMap& grads,
                     Comm& cp = Comm::self());

// Forward only: logits [b, s, vocab] f32; with `topk`, also each layer's selection table
// ([b, s, K + W] i32, undefined for layers that select nothing); with `experts`, each layer's
// chosen experts ([b * s, num_experts_per_tok] i32 by descending choice value, undefined for dense
// layers). Under CP: the shard's rows.
Tensor model_logits(const Model& m, const Batch& batch, std::vector<Tensor>* topk = nullptr, Comm& cp = Comm::self(),
                    std::vector<Tensor>* experts = nullptr);
// Forward only: mean LM loss over the batch's targets (under CP: this rank's share).
double model_lm_loss(const Model& m, const Batch& batch, Comm& cp = Comm::self());

}  // namespace hmla
