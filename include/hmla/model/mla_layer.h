// One MLA attention layer, forward and backward, from the attention input x (the output of
// input_layernorm) to o_proj's output (DESIGN.md sections 2 and 4). Modes mha (per-head K/V
// through kv_b_proj, dense MHA core) and mqa_full_causal (absorbed latent MQA, dense over the
// per-document causal set, MHA scale). Which one runs is latent_mqa_enabled(config, layer).
#pragma once
#include <string>
#include <vector>

#include "hmla/core/layout.h"
#include "hmla/io/safetensors.h"
#include "hmla/model/config.h"
#include "hmla/ops/attention.h"

namespace hmla {

struct ParamSpec {
  std::string name;  // without the "model.layers.{L}.self_attn." prefix
  Shape shape;
};

// The layer's tensors, in checkpoint form (kv_b_proj) or split (k_b_proj/v_b_proj) form.
std::vector<ParamSpec> mla_param_table(const ModelConfig& c, bool split_kv_b_proj);

// kv_b_proj [H(Dn+Dv), Rkv] <-> k_b_proj [H, Rkv, Dn] + v_b_proj [H, Dv, Rkv]; bit-exact copies.
void split_kv_b_proj(io::TensorMap& w, const ModelConfig& c);
void fold_kv_b_proj(io::TensorMap& w, const ModelConfig& c);

// Checks that `w` holds exactly the table's tensors with their shapes (clear error otherwise).
void check_mla_weights(const io::TensorMap& w, const ModelConfig& c, bool split_kv_b_proj,
                       const std::string& what);

struct MlaLayer {
  const ModelConfig* cfg = nullptr;
  int64_t layer = 0;
  bool split_kv_b_proj = false;  // weights hold k_b_proj/v_b_proj instead of kv_b_proj
  io::TensorMap weights;
  bool latent() const { return latent_mqa_enabled(*cfg, layer); }
};

// What the backward needs, named (STYLE.md: no hidden tape). N = b * s rows.
struct MlaSaved {
  Tensor qa, rstd_q, cq;   // q latent before/after RMSNorm [N, Rq], rstd [N] (Rq > 0)
  Tensor q;                // [N, H, Dn + Dr], rope applied
  Tensor kva, rstd_kv, c;  // kv_a output [N, Rkv + Dr], rstd [N], normalised latent [N, Rkv]
  Tensor kpe;              // [N, Dr] shared rope key, rope applied
  Tensor k, v;             // mha: [N, H, Dn + Dr], [N, H, Dv]
  Tensor qabs, ka;         // mqa: [N, H, Rkv + Dr], [N, 1, Rkv + Dr]
  AttnDenseSaved att;      // core output [b, s, H, Dv or Rkv] and lse
  Tensor o;                // [N, H, Dv] input of o_proj
};

struct MlaGrads {
  Tensor dx;               // [b, s, hidden]
  io::TensorMap dweights;  // same names and shapes as the layer's weights
};

Tensor mla_forward(const MlaLayer& L, const Tensor& x, const DocLayout& layout, MlaSaved& saved);
MlaGrads mla_backward(const MlaLayer& L, const Tensor& x, const DocLayout& layout,
                      const MlaSaved& saved, const Tensor& dy);

}  // namespace hmla
