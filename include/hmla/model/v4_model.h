// DeepSeek-V4 stacks on the ops (DESIGN.md section 10; docs/deepseek_v4_math.md is the math,
// docs/deepseek_v4.md the layout): the embedding copied to hc_mult streams, per layer the attention
// block and the MoE block each between an mHC entry (mhc_pre) and exit (mhc_post), hc_head, the
// final norm and the head. Forward and backward are explicit like the MLA model's (model.cpp): the
// forward keeps each block's named fields (V4LayerSaved), the backward runs the layers in reverse
// and adds every weight's gradient into the gradient views. model_logits and model_step dispatch
// here for a deepseek_v4 config.
#pragma once
#include <cstdint>
#include <vector>

#include "hmla/core/layout.h"
#include "hmla/core/tensor.h"
#include "hmla/io/safetensors.h"
#include "hmla/model/config.h"
#include "hmla/model/params.h"
#include "hmla/ops/mhc.h"

namespace hmla {

struct Model;
struct StepOptions;
struct StepStats;
struct DeviceBatch;
class Comm;

// A compressor's tensors (attn.compressor.* or attn.indexer.compressor.*).
struct V4CompressorTensors {
  Tensor wkv, wgate, ape, norm;
};

// "attn.*" of one layer. Sliding layers have no compressor, HCA layers no indexer.
struct V4AttnTensors {
  Tensor wq_a, q_norm, wq_b, wkv, norm, wo_a, wo_b, sink;
  V4CompressorTensors comp;
  V4CompressorTensors icomp;  // the CSA indexer's own compressor
  Tensor iwq_b, iweights;     // attn.indexer.wq_b, attn.indexer.weights_proj
};

// "model.layers.{L}.*": the two mixers, the two norms, the attention (attn.*; a hybrid_mla layer's
// is mla, its self_attn.* in the MLA layer's names), and the MoE in the MLA model's typed form
// (LayerTensors::moe: gate = ffn.gate.weight, e_score_correction_bias = ffn.gate.bias on learned
// layers, experts' gate/up/down_proj = w1/w3/w2, shared = shared_experts).
struct V4LayerTensors {
  MhcWeights hc_attn, hc_ffn;
  Tensor attn_norm, ffn_norm;
  V4AttnTensors attn;
  AttnTensors mla;
  LayerTensors mlp;
};

struct V4Tensors {
  Tensor embed, norm, head;
  MhcWeights hc_head;
  std::vector<V4LayerTensors> layers;
};

// Typed views of one V4 table's tensors (weights or their gradients: same names and shapes).
V4Tensors v4_tensors(const io::TensorMap& named, const ModelConfig& c);

// model_logits / model_step for a deepseek_v4 model (model.h's contracts; context parallelism over
// cp: `in` holds this rank's rows, DESIGN.md section 8). topk: per layer the CSA layers' selection [b, s, index_topk] i32 (-1 pads)
// and the hybrid_mla layers' in dsa modes ([b, s, hybrid_mla_index_topk + sliding_window]),
// undefined elsewhere; experts: per layer [b * s, k] i32 (by descending choice; hash layers: the
// tid2eid row).
Tensor v4_logits(const Model& m, const DeviceBatch& in, std::vector<Tensor>* topk, std::vector<Tensor>* experts,
                 Comm& cp);
double v4_lm_loss(const Model& m, const DeviceBatch& in, Comm& cp);
StepStats v4_step(const Model& m, const DeviceBatch& in, const StepOptions& opt, io::TensorMap& grads, Comm& cp);

// The multi-token-prediction layers whose indexer trains by its KL in a step that runs them
// (StepOptions::mtp_coeff > 0; in dsa_warmup for that KL alone): the MTP layers of kind hybrid_mla
// and CSA that run their indexer in mtp_mode, where the MTP layers are parameters. Their KL is
// counted with the stack's layers of their kind (StepStats::indexer_kl_hybrid, indexer_kl_csa;
// docs/deepseek_v4_math.md section 14).
struct MtpKlLayers {
  int64_t hybrid = 0, csa = 0;
  int64_t all() const { return hybrid + csa; }
};
MtpKlLayers v4_mtp_kl_layers(const ModelConfig& c);

}  // namespace hmla
