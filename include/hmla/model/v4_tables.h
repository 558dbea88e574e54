// DeepSeek-V4's parameter table (DESIGN.md section 10; docs/deepseek_v4.md): the tensors of a
// deepseek_v4 model in DeepSeek's checkpoint names as transformers 5.24 saves them
// (model.embed_tokens, model.layers.{L}.attn.*, .ffn.*, .hc_{attn,ffn}_{fn,base,scale},
// model.hc_head.*, model.norm, head), then, where the run trains them (V4Config::mtp_params), the
// multi-token-prediction layers mtp.{i}.* in DeepSeek's released names, in table order; and its
// integer tables (the hash layers' frozen ffn.gate.tid2eid), which are no parameters: no
// gradient, no moments.
#pragma once
#include <string>
#include <vector>

#include "hmla/core/size_check.h"
#include "hmla/model/config.h"
#include "hmla/model/params.h"

namespace hmla {

// The f32 parameters. one_expert: a layer's routed expert 0 only (the memory plan counts it
// n_routed_experts times). A hybrid_mla layer's attention is self_attn.* in the MLA layer's names
// (DESIGN.md section 2). The layers with DSA machinery (ModelConfig::has_dsa: CSA and hybrid_mla)
// carry their indexer's tensors where has_indexer[L] (empty: none).
std::vector<ParamSpec> v4_param_table(const ModelConfig& c, bool one_expert = false,
                                      const std::vector<bool>& has_indexer = {});
// Layer L's entries only (full names), in table order; indexer: its indexer's too (CSA, hybrid_mla).
std::vector<ParamSpec> v4_layer_params(const ModelConfig& c, int64_t L, bool one_expert = false, bool indexer = false);
// Whether layer L carries its indexer's tensors: a layer with DSA machinery and has_indexer[L].
inline bool v4_has_indexer(const ModelConfig& c, const std::vector<bool>& has_indexer, int64_t L) {
  return c.has_dsa(L) && size_t(L) < has_indexer.size() && has_indexer[size_t(L)];
}
// transformers' form: every layer that can have an indexer has one.
std::vector<bool> v4_indexer_layers(const ModelConfig& c);
// The multi-token-prediction layer i's entries (the table's last ones, where c.v4.mtp_params), in
// DeepSeek's released names (docs/deepseek_v4_math.md section 14): mtp.{i}.e_proj, enorm, h_proj,
// hnorm, a block as layer num_hidden_layers + i's (its kv norm attn.kv_norm; a hybrid_mla layer's
// self_attn.* in the MLA names; a CSA or hybrid_mla layer's indexer always), hc_head_{fn,base,scale}
// and norm.
std::vector<ParamSpec> v4_mtp_params(const ModelConfig& c, int64_t i, bool one_expert = false);
std::string mtp_prefix(int64_t i);              // "mtp.{i}."
bool is_mtp_tensor(const std::string& name);    // a name under mtp.
// The hash layers' tid2eid [vocab_size, num_experts_per_tok] (integers in the checkpoint).
std::vector<ParamSpec> v4_int_tables(const ModelConfig& c);

// What a V4 forward over rows x s tokens keeps (v4_model.cpp), by kind: the part of
// plan_activations (model.h) that the MLA models' activation table is, in f32 and in the compute
// dtype `compute` (what the device keeps between ops). A hybrid_mla layer's attention keeps the MLA
// layer's fields (mla_fields, in its mode).
void plan_v4_activations(MemoryPlan& plan, const ModelConfig& c, const SizeFactor& rows, const SizeFactor& s,
                         DType compute);

}  // namespace hmla
