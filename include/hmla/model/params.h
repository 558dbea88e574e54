// A named tensor of a parameter table (name and shape): what the model, the layer and the
// indexer declare, and what the arenas, the optimizer and checkpoint I/O walk in order.
#pragma once
#include <string>
#include <vector>

#include "hmla/core/tensor.h"
#include "hmla/io/safetensors.h"
#include "hmla/model/config.h"

namespace hmla {

struct ParamSpec {
  std::string name;  // without the "model.layers.{L}.self_attn." prefix in layer tables
  Shape shape;
};

// The checks every loader of weights shares (the model's checkpoints, `hmla layer`'s files).
// IoError "<what>: tensor 'name' holds a non-finite value (nan at flat index i)" for a weight with
// a NaN or an infinity; t is a contiguous f32 CPU tensor.
void check_finite_weight(const Tensor& t, const std::string& what, const std::string& name);
// The names of `w` that `table` does not have (sorted): a loader that would ignore them refuses.
std::vector<std::string> unexpected_tensors(const std::vector<ParamSpec>& table, const io::TensorMap& w);

// A checkpoint's tensors as the parameter table names them (docs/moe.md, "Real checkpoints"):
// FP8 weights dequantized to f32 (their weight_scale_inv consumed), fused experts
// (mlp.experts.gate_up_proj [E, 2I, hidden]: gate rows then up rows, as transformers concatenates
// them; mlp.experts.down_proj [E, hidden, I]) split into experts.{e}.*, and the multi-token-
// prediction layers model.layers.{num_hidden_layers + i}.* (i < num_nextn_predict_layers) set
// aside as stored, to be written back unchanged. DeepSeek-V4 (docs/deepseek_v4.md, "Checkpoints"):
// the MTP layers are mtp.{i}.* (parameters, not kept, where the run trains them: V4Config::mtp_params,
// model.mtp.{i}.* named mtp.{i}.*), DeepSeek's released names (embed.weight, layers.*, norm.weight,
// hc_head_*) become those transformers saves, `.scale` F8_E8M0 scales and packed FP4 experts are
// dequantized too, and the hash layers' tid2eid stays an integer tensor (load_into_model checks it).
// IoError naming the tensor on a bad form.
struct CheckpointTensors {
  io::TensorMap tensors;
  io::StoredMap kept;  // the MTP layers, dtype and bytes as read
};
CheckpointTensors checkpoint_forms(io::TensorMap tensors, io::StoredMap fp8, const ModelConfig& c,
                                   const std::string& what);
// Reads `path` (load_checkpoint_tensors: a file, an index or a directory) through checkpoint_forms.
CheckpointTensors read_checkpoint(const std::string& path, const ModelConfig& c);

// Typed views of one table's tensors (weights, their gradients or the optimizer's moments alike:
// same names, same shapes). Built once from the named views, so the math reads `w.o_proj`, and
// names stay at the checkpoint boundary. A tensor the config does not have is undefined.
struct IndexerTensors {  // "indexer.*" of one layer (DESIGN.md section 5)
  Tensor wq_b, wk, k_norm_weight, k_norm_bias, weights_proj;
};

struct AttnTensors {  // "self_attn.*" of one layer, without the prefix
  Tensor q_a_proj, q_a_layernorm, q_b_proj;  // q_lora_rank > 0
  Tensor q_proj;                              // q_lora_rank = 0
  Tensor kv_a_proj_with_mqa, kv_a_layernorm;
  Tensor kv_b_proj;                           // checkpoint form, or split:
  Tensor k_b_proj, v_b_proj;
  Tensor o_proj, softmax_offset;
  IndexerTensors indexer;
};

struct SwigluTensors {  // one SwiGLU MLP: gate_proj, up_proj [I, hidden], down_proj [hidden, I]
  Tensor gate_proj, up_proj, down_proj;
};

// "mlp.*" of a MoE layer (DESIGN.md section 9), in the layout transformers 5.24's save_pretrained
// writes: the router "gate.weight" [E, hidden] (f32 in every dtype policy) and
// "gate.e_score_correction_bias" [E] (no gradient), "experts.{e}.{gate,up,down}_proj.weight" one
// SwiGLU per routed expert, "shared_experts.*" one SwiGLU of n_shared x moe_intermediate_size.
struct MoeTensors {
  Tensor gate, e_score_correction_bias;
  std::vector<SwigluTensors> experts;
  SwigluTensors shared;  // undefined when n_shared_experts is 0
};

struct LayerTensors {  // "model.layers.{L}.*"
  Tensor input_layernorm, post_attention_layernorm, gate_proj, up_proj, down_proj;  // a dense layer's mlp
  MoeTensors moe;                                                                   // a MoE layer's mlp
  AttnTensors attn;
};

struct ModelTensors {
  Tensor embed_tokens, norm, lm_head;  // lm_head is embed_tokens when tied
  std::vector<LayerTensors> layers;
};

// Every tensor of a, in a fixed order (undefined ones included): zips two views of one table. The
// last kIndexerFields are the indexer's.
std::vector<Tensor*> fields(AttnTensors& a);
constexpr size_t kIndexerFields = 5;

// From names without the "self_attn." prefix (a layer's checkpoint tensors, `hmla layer`'s
// files) and back (its defined tensors only) ...
AttnTensors attn_tensors(const io::TensorMap& w);
io::TensorMap attn_tensor_map(AttnTensors a);
// ... and from a whole model's full names (the model's, a gradient arena's or a moment's views).
ModelTensors model_tensors(const io::TensorMap& w, int64_t layers, bool tied);

}  // namespace hmla
