// The MLP of a decoder layer, behind one interface: y = mlp(x) over N rows of width hidden. Two
// kinds: the dense SwiGLU MLP (`mlp.{gate,up,down}_proj`) and DeepSeekMoE (DESIGN.md section 9,
// docs/moe.md: a router, routed experts, shared experts), picked per layer by
// ModelConfig::is_moe_layer. The decoder layer (decoder_layer.h) reads and writes an MLP only
// through these calls.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hmla/core/tensor.h"
#include "hmla/dist/comm.h"
#include "hmla/model/config.h"
#include "hmla/model/params.h"

namespace hmla {

// A saved activation of N rows: [N, width], or [N] when width is 0. The fields of a layer, in
// order, are the only place the order of its activations is written (decoder_layer.h).
// Precision (DESIGN.md section 4): a field is kept in its device's compute dtype (bf16 on CUDA),
// unless `exact`: the residual stream (its sums run in f32 so that no layer's contribution is
// rounded away against a large hidden state) and every statistic (width 0: rstd) are f32. A field
// of `ids` (a MoE layer's chosen experts) is i32.
struct ActField {
  const char* name;
  int64_t width;
  bool exact = false;
  bool ids = false;
};
// The dtype field f is kept in where the compute dtype is `compute`.
inline DType field_dtype(const ActField& f, DType compute) {
  return f.ids ? DType::i32 : f.exact || f.width == 0 ? DType::f32 : compute;
}
// An entry of the activation arena's table (model.h's activation_table).
struct ActSpec {
  std::string name;
  Shape shape;
  DType dtype;
};
// The rows a forward's activations cover: b x s of this rank's query rows over S key rows (S = s
// without context parallelism), and whether the attention core is recomputed (then not kept).
struct ActRows {
  int64_t b, s, S;
  bool recompute = false;
};

// The sequence-wise balance loss of a MoE MLP's backward (docs/moe.md "Load balancing"): counts
// [rows, E] f64, each batch row's expert counts over the whole row (every CP shard); mask [N] f32
// (> 0: the token is a loss row); scale = alpha E / (k B), B the step's sequences; the layer's loss
// is added into loss (f64 [1]). Undefined counts: no balance loss (the backward is today's).
struct MoeAuxInputs {
  Tensor counts, mask, loss;
  double scale = 0;
};

class Mlp {
 public:
  virtual ~Mlp() = default;
  MoeAuxInputs aux;  // read by a MoE MLP's backward only
  Tensor fixed;      // a MoE MLP's hash routing (DeepSeek-V4's hash_moe): [N, k] i32 experts per row
  // Expert parallelism (DESIGN.md section 8; docs/scale_out.md "Expert parallel"): with a group of
  // more than one rank, a MoE MLP computes only its block of the routed experts, over the rows every
  // rank of the group routes to them (hmla/dist/ep.h); every rank of the group calls each forward
  // and backward in the same order. Null: every expert here.
  Comm* ep = nullptr;
  // What the forward keeps for the backward, in arena order.
  virtual std::vector<ActField> fields() const = 0;
  // y [N, hidden] = mlp(x [N, hidden]), written; `saved` are the views of fields() (N rows).
  virtual void forward(const Tensor& x, const std::vector<Tensor>& saved, const Tensor& y) const = 0;
  // dx [N, hidden] = the gradient reaching x, written; the weights' gradients are ADDED into the
  // gradient views the MLP was made with (hmla/ops/nn.h's convention).
  virtual void backward(const Tensor& dy, const Tensor& x, const std::vector<Tensor>& saved, const Tensor& dx) const = 0;
  // The experts each row chose, [N, k] i32 (a view of `saved`), for a MoE MLP; undefined otherwise.
  virtual Tensor chosen_experts(const std::vector<Tensor>& saved) const {
    (void)saved;
    return {};
  }
};

// Layer L's MLP on its weights `w` (and, for a backward, the views `g` of their gradients): the
// MoE MLP where c.is_moe_layer(L), else the dense one.
std::unique_ptr<Mlp> make_mlp(const ModelConfig& c, int64_t L, const LayerTensors& w, const LayerTensors* g = nullptr);
// Layer L's MLP's fields (its Mlp::fields), without making the MLP.
std::vector<ActField> mlp_fields(const ModelConfig& c, int64_t L);

}  // namespace hmla
