// The decoder layer as a forward/backward pair (llm.c's), over N = b x s rows of width hidden:
//   a = input_layernorm(h_in);  h_mid = h_in + attention(a);  mn = post_attention_layernorm(h_mid);
//   out = h_mid + mlp(mn).
// Whatever the backward needs is a named field of LayerSaved. The order of the activations in the
// activation arena is written once: layer_fields (the layer's own, then its MLP's); the arena
// table, the order a forward takes its views in, and the memory plan are all built from it.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hmla/dist/comm.h"
#include "hmla/model/mla_layer.h"
#include "hmla/model/mlp.h"
#include "hmla/model/params.h"

namespace hmla {

struct Model;

// The layer's activations: the layer's own (a, h_mid, mn, out [N, hidden]; rstd1, rstd2 [N]),
// then its MLP's fields, in arena order.
std::vector<ActField> layer_fields(const ModelConfig& c, int64_t L);

struct LayerSaved {
  Tensor h_in;              // the layer's input [b, s, hidden] (the previous layer's out)
  Tensor a, h_mid, mn, out; // [b, s, hidden]: the norms' outputs, the residual after attention, the output
  Tensor rstd1, rstd2;      // [N] the two RMSNorms' statistics
  std::vector<Tensor> mlp;  // the MLP's fields (Mlp::fields)
  MlaSaved attn;
};

// Views of the activation arena (one flat buffer per dtype of the table, allocated on `dev`),
// consecutive per dtype in the order of its table; each must have its entry's shape.
struct ArenaCursor {
  ArenaCursor(const std::vector<ActSpec>& table, Device dev);
  const std::vector<ActSpec>& table;
  std::map<DType, std::pair<Tensor, int64_t>> flat;  // per dtype: the buffer and the next offset
  size_t i = 0;
  Tensor next(const Shape& shape);
  void finish() const;
};

// Layer L's activations as table entries: "layers.{L}.<field>" for each of layer_fields, in its
// field_dtype for the compute dtype `compute`, then "layers.{L}.attn.<field>" for each of the
// attention's saved tensors (mla_fields).
void append_layer_table(std::vector<ActSpec>& table, const ModelConfig& c, int64_t L, const ActRows& r, DType compute);
// LayerSaved's fields as the cursor's next views, in the same order (layer_fields, then
// mla_fields into sv.attn's slots).
void take_layer_views(ArenaCursor& cur, const ModelConfig& c, int64_t L, const ActRows& r, DType compute, LayerSaved& sv);

// What the layer's forward and backward share: the layer, its attention's weights and its MLP.
struct DecoderLayer {
  const Model& m;
  int64_t L;
  MlaLayer attn;
  std::unique_ptr<Mlp> mlp;
};
// `grads`: the layer's gradient views (the arena's) for a backward; null for a forward only.
DecoderLayer decoder_layer(const Model& m, int64_t L, const LayerTensors* grads);

// sv.out = the layer of h_in [b, s, hidden]; sv's fields must be views (take_layer_views) and
// sv.attn.rope set. drop_core: free the attention core's output (rebuilt by the backward).
void decoder_layer_forward(const DecoderLayer& d, const Tensor& h_in, const DocLayout& layout, LayerSaved& sv, Comm& cp,
                           bool drop_core);

struct LayerBackward {
  Tensor dh_in;           // [b, s, hidden]: the gradient reaching h_in (undefined without the backbone)
  double indexer_kl = 0;  // dsa modes: sum_t rw kl of this layer (NaN when kl_acc took it)
};
// The gradient of dout (the gradient reaching sv.out; undefined when !opt.backbone) back through
// the layer: weight gradients ADDED into `grads` (the arena's views), the indexer's gradient from
// its KL. recompute: rebuild the attention core first (the forward dropped it).
LayerBackward decoder_layer_backward(const DecoderLayer& d, const Tensor& dout, const DocLayout& layout, LayerSaved& sv,
                                     const MlaBackwardOptions& opt, const LayerTensors& grads, bool recompute,
                                     Comm& cp);

}  // namespace hmla
