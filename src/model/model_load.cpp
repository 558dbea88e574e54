// Checkpoint tensors into a built model (model.h): names and shapes checked against the table,
// no tensor the config's model lacks (IndexShare's shared layers named), bf16 widened, every
// weight finite, the compute copy refreshed; the kept multi-token-prediction tensors moved in.
#include <algorithm>
#include <string>
#include <vector>

#include "hmla/model/model.h"
#include "hmla/model/params.h"
#include "hmla/model/v4_tables.h"

namespace hmla {

namespace {

// README: a tensor a command would ignore is an error. A checkpoint with more layers than the
// config, a sink or an indexer the config does not run, is refused before anything is copied.
void check_no_unexpected(const Model& m, const io::TensorMap& tensors, const std::string& what) {
  std::vector<std::string> extra = unexpected_tensors(full_param_table(m), tensors);  // every rank's experts
  std::erase_if(extra, [&m](const std::string& n) { return m.ints.count(n) > 0; });  // integer tables
  if (extra.empty()) return;
  for (int64_t L = 0; L < m.cfg.num_hidden_layers; ++L) {  // IndexShare: a shared layer has no indexer
    const std::string pre = layer_prefix(L) + "self_attn.indexer.";
    for (const std::string& n : extra)
      HMLA_CHECK(!m.cfg.indexer_shared(L) || n.compare(0, pre.size(), pre) != 0, IoError, what, ": tensor '", n,
                 "': layer ", L, " is 'shared' in indexer_types (it reuses layer ", m.cfg.indexer_source(L),
                 "'s top-k) and has no indexer; remove the tensor or make the layer full");
  }
  std::string names;
  for (size_t i = 0; i < std::min<size_t>(extra.size(), 3); ++i) names += (i ? ", '" : "'") + extra[i] + "'";
  if (extra.size() > 3) names += " and " + std::to_string(extra.size() - 3) + " more";
  throw IoError(what + ": " + std::to_string(extra.size()) + " tensor" + (extra.size() > 1 ? "s" : "") +
                " the config's model does not have (" + names + "); an ignored tensor is an error: check that the "
                "config (num_hidden_layers = " + std::to_string(m.cfg.num_hidden_layers) +
                ", num_nextn_predict_layers = " + std::to_string(m.cfg.form.num_nextn_predict_layers) + ", attention_sink, tie_word_embeddings, the layer modes) matches the checkpoint");
}

// An integer table, checked, into m.ints as i32.
void load_int_table(Model& m, const std::string& name, const Tensor& t, const std::string& what) {
  Tensor& dst = m.ints.at(name);
  dst.copy_from(Tensor::from_vector<int32_t>(dst.shape(), expert_table(t, dst.shape(), m.cfg.moe.n_routed_experts,
                                                                       what, name)));
}

}  // namespace

std::vector<int32_t> expert_table(const Tensor& t, const Shape& need, int64_t E, const std::string& what,
                                  const std::string& name) {
  HMLA_CHECK(t.shape() == need, IoError, what, ": tensor '", name, "' is ", shape_str(t.shape()),
             ", the config needs ", shape_str(need));
  HMLA_CHECK(t.dtype() == DType::i64 || t.dtype() == DType::i32, IoError, what, ": tensor '", name, "' is ",
             dtype_name(t.dtype()), "; an expert table must be I64 or I32");
  const Tensor h = t.on(Device::cpu);
  const int64_t rows = h.size(0), k = h.size(1);
  std::vector<int32_t> v(static_cast<size_t>(h.numel()));
  for (int64_t i = 0; i < h.numel(); ++i) {
    const int64_t e = h.dtype() == DType::i64 ? h.data<int64_t>()[i] : h.data<int32_t>()[i];
    HMLA_CHECK(e >= 0 && e < E, IoError, what, ": tensor '", name, "' row ", i / k, " names expert ", e,
               ", outside [0, n_routed_experts = ", E, ")");
    v[size_t(i)] = int32_t(e);
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < k; ++j)
      for (int64_t i = 0; i < j; ++i)
        HMLA_CHECK(v[size_t(r * k + i)] != v[size_t(r * k + j)], IoError, what, ": tensor '", name, "' row ", r,
                   " names expert ", v[size_t(r * k + j)], " twice");
  return v;
}

std::vector<bool> checkpoint_indexers(const ModelConfig& c, const io::TensorMap& w) {
  std::vector<bool> has(size_t(c.num_hidden_layers), false);
  for (int64_t L = 0; L < c.num_hidden_layers; ++L)
    has[size_t(L)] = w.count(layer_prefix(L) + "self_attn.indexer.wk.weight") > 0 ||  // MLA, V4 hybrid_mla
                     (c.is_v4() && w.count(layer_prefix(L) + "attn.indexer.wq_b.weight") > 0);  // V4 CSA
  return has;
}

void load_into_model(Model& m, const io::TensorMap& tensors, const std::string& what,
                     const std::vector<std::string>& may_be_missing) {
  check_no_unexpected(m, tensors, what);
  // Every rank checks the whole table's names and shapes (expert parallelism: the others' experts
  // too), so a bad checkpoint fails on every rank alike; it loads its own.
  for (const ParamSpec& p : full_param_table(m)) {
    auto it = tensors.find(p.name);
    if (it == tensors.end()) {
      bool ok = false;
      for (const auto& n : may_be_missing) ok |= n == p.name;
      HMLA_CHECK(ok, IoError, what, ": tensor '", p.name, "' is missing");
      continue;
    }
    const Tensor& t = it->second;
    HMLA_CHECK(t.shape() == p.shape, IoError, what, ": tensor '", p.name, "' is ", shape_str(t.shape()),
               ", the config needs ", shape_str(p.shape));
    if (!m.params.count(p.name)) continue;  // another expert-parallel rank's
    Tensor dst = Tensor::empty(p.shape, DType::f32);  // on the host, checked, then into the arena
    if (t.dtype() == DType::f32) {
      dst.copy_from(t);
    } else {
      HMLA_CHECK(t.dtype() == DType::bf16, IoError, what, ": tensor '", p.name, "' is ", dtype_name(t.dtype()),
                 "; weights must be f32 or bf16");
      const bf16* src = t.data<bf16>();
      for (int64_t i = 0; i < t.numel(); ++i) dst.data<float>()[i] = bf16_to_f32(src[i]);
    }
    check_finite_weight(dst, what, p.name);
    m.params.at(p.name).copy_from(dst);
  }
  for (const auto& [name, table] : m.ints) {
    const auto it = tensors.find(name);
    if (it != tensors.end()) load_int_table(m, name, it->second, what);
    else HMLA_CHECK(std::find(may_be_missing.begin(), may_be_missing.end(), name) != may_be_missing.end(), IoError,
                    what, ": tensor '", name, "' is missing");
  }
  refresh_compute_weights(m);
}

std::vector<std::string> load_checkpoint_into_model(Model& m, CheckpointTensors ck, const std::string& what,
                                                    uint64_t seed) {
  int64_t bytes = 0;
  for (const auto& [name, t] : ck.kept) bytes += int64_t(t.bytes.size());
  MemoryPlan plan;
  plan.add_bytes("the multi-token-prediction layers, kept as read", bytes,
                 std::to_string(ck.kept.size()) + " tensors of num_nextn_predict_layers = " +
                     std::to_string(m.cfg.form.num_nextn_predict_layers));
  plan.check(what + ": the tensors hmla carries");
  // The trained MTP layers of which the checkpoint has nothing, and a hybrid_mla MTP layer's indexer
  // that it lacks (a run that kept the layer in mha, or one that did not train it, saved none).
  std::vector<std::string> fresh;
  for (int64_t i = 0; m.cfg.is_v4() && m.cfg.v4.mtp_params && i < m.cfg.form.num_nextn_predict_layers; ++i) {
    const std::string pre = mtp_prefix(i), indexer = pre + "self_attn.indexer.";
    const auto it = ck.tensors.lower_bound(pre);
    const bool held = it != ck.tensors.end() && it->first.starts_with(pre);
    for (const ParamSpec& p : full_param_table(m))  // every rank's: init_tensors draws the whole table's stream
      if (p.name.starts_with(held ? indexer : pre) && !ck.tensors.count(p.name)) fresh.push_back(p.name);
  }
  load_into_model(m, ck.tensors, what, fresh);
  if (!fresh.empty()) init_tensors(m, fresh, seed);
  m.kept = std::move(ck.kept);
  return fresh;
}

}  // namespace hmla
