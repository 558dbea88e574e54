// DeepSeek-V4's parameter table (DESIGN.md section 10; docs/deepseek_v4.md): the tensors of a
// deepseek_v4 model in DeepSeek's checkpoint names as transformers 5.24 saves them
// (model.embed_tokens, model.layers.{L}.attn.*, .ffn.*, .hc_{attn,ffn}_{fn,base,scale},
// model.hc_head.*, model.norm, head), in table order, and its integer tables (the hash layers'
// frozen ffn.gate.tid2eid), which are no parameters: no gradient, no moments.
#pragma once
#include <vector>

#include "hmla/core/size_check.h"
#include "hmla/model/config.h"
#include "hmla/model/params.h"

namespace hmla {

// The f32 parameters. one_expert: a layer's routed expert 0 only (the memory plan counts it
// n_routed_experts times). A hybrid_mla layer's attention is self_attn.* in the MLA layer's names
// (DESIGN.md section 2), its five indexer tensors included where has_indexer[L] (the CSA layers'
// indexers are theirs whatever has_indexer says).
std::vector<ParamSpec> v4_param_table(const ModelConfig& c, bool one_expert = false,
                                      const std::vector<bool>& has_indexer = {});
// Layer L's entries only (full names), in table order; indexer: a hybrid_mla layer's.
std::vector<ParamSpec> v4_layer_params(const ModelConfig& c, int64_t L, bool one_expert = false, bool indexer = false);
// Whether hybrid_mla layer L carries its indexer's tensors: has_indexer[L] (false for other kinds and
// for an empty has_indexer).
inline bool v4_hybrid_indexer(const ModelConfig& c, const std::vector<bool>& has_indexer, int64_t L) {
  return c.v4.is_hybrid_mla(L) && size_t(L) < has_indexer.size() && has_indexer[size_t(L)];
}
// The hash layers' tid2eid [vocab_size, num_experts_per_tok] (integers in the checkpoint).
std::vector<ParamSpec> v4_int_tables(const ModelConfig& c);

// What a V4 forward over rows x s tokens keeps (v4_model.cpp), by kind: the part of
// plan_activations (model.h) that the MLA models' activation table is. A hybrid_mla layer's
// attention keeps the MLA layer's fields (mla_fields, in its mode) in f32.
void plan_v4_activations(MemoryPlan& plan, const ModelConfig& c, const SizeFactor& rows, const SizeFactor& s);

}  // namespace hmla
