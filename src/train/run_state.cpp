// state.json and programme.json (run_state.h): written as canonical JSON, read back and checked
// against the programme and the training data before --resume trusts them.
#include "hmla/train/run_state.h"

#include <nlohmann/json.hpp>

#include "hmla/core/error.h"
#include "hmla/data/fingerprint.h"
#include "hmla/io/json_strict.h"
#include "hmla/io/safetensors.h"

namespace hmla {

using json = nlohmann::ordered_json;

namespace {

json phase_json(const PhaseSettings& p) {
  const OptimSettings& o = p.optim;
  json j{{"name", p.name}, {"mode", mode_name(p.mode)}, {"steps", p.steps}, {"batch", p.batch},
         {"micro_batches", p.micro_batches}, {"seq_len", p.seq_len}, {"optimizer", o.optimizer},
         {"lr", o.lr}, {"indexer_lr", o.indexer_lr}, {"min_lr_ratio", o.min_lr_ratio},
         {"warmup_steps", o.warmup_steps}, {"weight_decay", o.weight_decay}, {"beta1", o.beta1},
         {"beta2", o.beta2}, {"eps", o.eps}, {"clip_backbone", o.clip_backbone},
         {"clip_indexer", o.clip_indexer}, {"muon_momentum", o.muon_momentum},
         {"checkpoint_every", p.checkpoint_every}, {"log_every", p.log_every},
         {"equivalence_rtol", p.equivalence_rtol}, {"eval_rows", p.eval_rows},
         {"recompute_attention", p.recompute_attention}};
  if (p.mqa_split_kv_b_proj) j["mqa_split_kv_b_proj"] = true;  // only when set: older runs' files stay valid
  // Only when not the defaults, for the same reason (a run from before balancing resumes as it was).
  if (p.moe_bias_update_rate != PhaseSettings{}.moe_bias_update_rate) j["moe_bias_update_rate"] = p.moe_bias_update_rate;
  if (p.moe_aux_loss_coeff != PhaseSettings{}.moe_aux_loss_coeff) j["moe_aux_loss_coeff"] = p.moe_aux_loss_coeff;
  if (!p.control.empty()) j["control"] = p.control;
  if (p.control_of >= 0) j["control_of"] = p.control_of;
  if (p.mtp_loss_coeff != 0) j["mtp_loss_coeff"] = p.mtp_loss_coeff;
  return j;
}

// Leaves of a JSON document as "path" -> value text.
void flatten(const json& j, const std::string& path, std::map<std::string, std::string>& out) {
  if (j.is_object()) {
    for (const auto& [k, v] : j.items()) flatten(v, path.empty() ? k : path + "." + k, out);
  } else if (j.is_array() && !j.empty() && j.front().is_object()) {
    for (size_t i = 0; i < j.size(); ++i) flatten(j[i], path + "[" + std::to_string(i) + "]", out);
  } else {
    out[path] = j.dump();
  }
}

bool safe_change(const std::string& key, int64_t from_phase) {
  int64_t phase = -1;
  char field[32] = {};
  if (std::sscanf(key.c_str(), "phases[%ld].%31s", &phase, field) != 2) return false;
  const std::string f = field;
  return phase >= from_phase && (f == "steps" || f == "log_every" || f == "checkpoint_every" || f == "eval_rows");
}

}  // namespace

std::string run_state_json(const RunState& st) {
  return json{{"phase", st.phase}, {"step", st.step}, {"data_pos", st.data_pos},
              {"data_fingerprint", st.data_fingerprint}, {"metrics_bytes", st.metrics_bytes}}
             .dump(2) + "\n";
}

RunState parse_run_state(const std::string& text, const std::string& what, const Programme& pr,
                         const TokenSet& train) {
  RunState st;
  try {
    const json s = io::parse_ordered_json(text, what);
    st.phase = s.at("phase").get<int64_t>();
    st.step = s.at("step").get<int64_t>();
    st.data_pos = s.at("data_pos").get<std::vector<int64_t>>();
    st.data_fingerprint = s.value("data_fingerprint", std::string());
    st.metrics_bytes = s.value("metrics_bytes", int64_t(-1));
  } catch (const json::exception& e) {
    throw IoError(what + ": malformed (" + e.what() + ")");
  }
  const int64_t phases = static_cast<int64_t>(pr.phases.size());
  HMLA_CHECK(st.phase >= 0 && st.phase <= phases &&
                 (st.phase == phases || (st.step >= 0 && st.step <= pr.phases[st.phase].steps)),
             IoError, what, ": phase ", st.phase, ", step ", st.step,
             " does not fit this programme; resume with the programme that wrote it");
  HMLA_CHECK(st.metrics_bytes >= 0, IoError, what, ": metrics_bytes is missing or negative");
  if (st.step > 0) {
    HMLA_CHECK(st.data_pos.size() == 3, IoError, what, ": data_pos must be [epoch, document, offset]");
    const int64_t epoch = st.data_pos[0], index = st.data_pos[1], offset = st.data_pos[2];
    HMLA_CHECK(epoch >= 0 && index >= 0 && index <= train.docs() && offset >= 0, IoError, what, ": data_pos [",
               epoch, ", ", index, ", ", offset, "] lies outside the training data (", train.docs(), " documents)");
    // The offset is checked against its document by PackedLoader::seek (which knows the shuffle).
  } else {
    HMLA_CHECK(st.data_pos.empty() || st.data_pos.size() == 3, IoError, what, ": data_pos is malformed");
  }
  return st;
}

std::string programme_json(const Programme& pr) {
  const std::string model = io::read_file(pr.model_config);
  FingerprintHasher model_hash;  // FNV-1a 64 of the config's text
  model_hash.add(model.data(), model.size());
  json j{{"model", pr.model_config}, {"model_fnv1a", model_hash.hex()},
         {"data", pr.data_dir}, {"init_checkpoint", pr.init_checkpoint}, {"seed", pr.seed},
         {"hybrid_layers", pr.hybrid_layers}, {"phases", json::array()}};
  for (const PhaseSettings& p : pr.phases) j["phases"].push_back(phase_json(p));
  return j.dump(2) + "\n";
}

std::vector<std::string> programme_changes(const std::string& saved, const std::string& current,
                                           int64_t from_phase, bool allow_safe, const std::string& saved_what) {
  std::map<std::string, std::string> a, b;
  flatten(io::parse_ordered_json(saved, saved_what), "", a);
  flatten(io::parse_ordered_json(current, "the programme"), "", b);
  std::vector<std::string> changed;
  for (const auto& [k, v] : a) {
    auto it = b.find(k);
    const std::string now = it == b.end() ? "(absent)" : it->second;
    if (now != v && !(allow_safe && safe_change(k, from_phase))) changed.push_back(k + ": " + v + " -> " + now);
  }
  for (const auto& [k, v] : b)
    if (!a.count(k) && !(allow_safe && safe_change(k, from_phase))) changed.push_back(k + ": (absent) -> " + v);
  return changed;
}

}  // namespace hmla
