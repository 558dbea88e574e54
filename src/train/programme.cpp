// A run's programme from YAML (hmla/train/programme.h): the base and each phase's keys, with
// their defaults, checked one by one; unknown keys and bad values are one-line errors.
#include "hmla/train/programme.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>
#include <set>

#include "hmla/core/error.h"
#include "hmla/io/paths.h"
#include "hmla/io/safetensors.h"
#include "hmla/train/yaml_map.h"

namespace hmla {

namespace {

template <class T>
T get(const YAML::Node& n, const std::string& key, const std::string& where) {
  return yaml_get<T>(n, key, where);
}

// Applies one key of a phase (or of the base) to `p`.
void apply(PhaseSettings& p, const std::string& k, const YAML::Node& v, const std::string& where) {
  OptimSettings& o = p.optim;
  if (k == "name") p.name = get<std::string>(v, k, where);
  else if (k == "mode") p.mode = parse_mode(get<std::string>(v, k, where), where + ": mode");
  else if (k == "steps") p.steps = get<int64_t>(v, k, where);
  else if (k == "batch") p.batch = get<int64_t>(v, k, where);
  else if (k == "micro_batches") p.micro_batches = get<int64_t>(v, k, where);
  else if (k == "seq_len") p.seq_len = get<int64_t>(v, k, where);
  else if (k == "optimizer") o.optimizer = get<std::string>(v, k, where);
  else if (k == "lr") o.lr = get<double>(v, k, where);
  else if (k == "indexer_lr") o.indexer_lr = get<double>(v, k, where);
  else if (k == "min_lr_ratio") o.min_lr_ratio = get<double>(v, k, where);
  else if (k == "warmup_steps") o.warmup_steps = get<int64_t>(v, k, where);
  else if (k == "weight_decay") o.weight_decay = get<double>(v, k, where);
  else if (k == "beta1") o.beta1 = get<double>(v, k, where);
  else if (k == "beta2") o.beta2 = get<double>(v, k, where);
  else if (k == "eps") o.eps = get<double>(v, k, where);
  else if (k == "clip_backbone") o.clip_backbone = get<double>(v, k, where);
  else if (k == "clip_indexer") o.clip_indexer = get<double>(v, k, where);
  else if (k == "muon_momentum") o.muon_momentum = get<double>(v, k, where);
  else if (k == "checkpoint_every") p.checkpoint_every = get<int64_t>(v, k, where);
  else if (k == "log_every") p.log_every = get<int64_t>(v, k, where);
  else if (k == "equivalence_rtol") p.equivalence_rtol = get<double>(v, k, where);
  else if (k == "eval_rows") p.eval_rows = get<int64_t>(v, k, where);
  else if (k == "recompute_attention") p.recompute_attention = get<bool>(v, k, where);
  else if (k == "mqa_split_kv_b_proj") p.mqa_split_kv_b_proj = get<bool>(v, k, where);
  else if (k == "moe_bias_update_rate") p.moe_bias_update_rate = get<double>(v, k, where);
  else if (k == "moe_aux_loss_coeff") p.moe_aux_loss_coeff = get<double>(v, k, where);
  else if (k == "control") p.control = get<std::string>(v, k, where);
  else if (k == "mtp_loss_coeff") p.mtp_loss_coeff = get<double>(v, k, where);
  else
    throw ConfigError(where + ": unknown key '" + k + "' (see docs/programme.md for the phase keys)");
}

void validate(const PhaseSettings& p, const std::string& where) {
  HMLA_CHECK(!p.name.empty(), ConfigError, where, ": every phase needs a name");
  // The name becomes part of checkpoint directories (checkpoints/<index>-<name>-end): it must
  // stay one plain component, or "a/../../x" would write outside the run.
  HMLA_CHECK(io::is_plain_name(p.name), ConfigError, where, ": phase name '", p.name, "' must be ",
             io::plain_name_rule(), " (it names checkpoint directories)");
  HMLA_CHECK(p.steps >= 0, ConfigError, where, ": steps must be >= 0");
  HMLA_CHECK(p.batch >= 1 && p.micro_batches >= 1 && p.batch % p.micro_batches == 0, ConfigError, where,
             ": batch (", p.batch, ") must be a positive multiple of micro_batches (", p.micro_batches, ")");
  HMLA_CHECK(p.seq_len >= 2, ConfigError, where, ": seq_len must be >= 2");
  const OptimSettings& o = p.optim;
  auto positive = [&](const char* key, double v, bool zero_ok) {
    HMLA_CHECK(std::isfinite(v) && (v > 0 || (zero_ok && v == 0)), ConfigError, where, ": ", key, " = ", v,
               ": it must be finite and ", zero_ok ? ">= 0" : "> 0");
  };
  auto fraction = [&](const char* key, double v, bool one_ok) {
    HMLA_CHECK(v >= 0 && (v < 1 || (one_ok && v == 1)), ConfigError, where, ": ", key, " = ", v,
               ": it must be in [0, 1", one_ok ? "]" : ")");
  };
  positive("lr", o.lr, false);
  positive("indexer_lr", o.indexer_lr, false);
  positive("eps", o.eps, false);
  positive("weight_decay", o.weight_decay, true);
  positive("equivalence_rtol", p.equivalence_rtol, false);
  positive("moe_bias_update_rate", p.moe_bias_update_rate, true);
  positive("moe_aux_loss_coeff", p.moe_aux_loss_coeff, true);
  positive("mtp_loss_coeff", p.mtp_loss_coeff, true);
  fraction("min_lr_ratio", o.min_lr_ratio, true);
  fraction("beta1", o.beta1, false);
  fraction("beta2", o.beta2, false);
  fraction("muon_momentum", o.muon_momentum, false);
  HMLA_CHECK(std::isfinite(o.clip_backbone) && std::isfinite(o.clip_indexer), ConfigError, where,
             ": clip_backbone and clip_indexer must be finite (<= 0: no clipping)");
  HMLA_CHECK(o.warmup_steps >= 0, ConfigError, where, ": warmup_steps = ", o.warmup_steps, ": it must be >= 0");
  HMLA_CHECK(p.optim.optimizer == "adamw" || p.optim.optimizer == "muon", ConfigError, where, ": optimizer '",
             p.optim.optimizer, "': use adamw or muon");
  HMLA_CHECK(!p.mqa_split_kv_b_proj || p.mode == LayerMode::mqa_full_causal || p.mode == LayerMode::dsa_sparse,
             ConfigError, where, ": mqa_split_kv_b_proj needs a latent mode (mqa_full_causal or dsa_sparse); this phase runs ",
             mode_name(p.mode));
  HMLA_CHECK(p.log_every >= 1 && p.eval_rows >= 1 && p.checkpoint_every >= 0, ConfigError, where,
             ": log_every and eval_rows must be >= 1, checkpoint_every >= 0");
  HMLA_CHECK(p.control.empty() || (p.control == "dense" && p.mode == LayerMode::dsa_sparse), ConfigError, where,
             ": control: '", p.control, "': the control arm is 'dense', on a dsa_sparse phase (this one runs ",
             mode_name(p.mode), ")");
}

// Each phase with `control: dense` gets its control arm just before it (PhaseSettings::control).
void expand_controls(Programme& pr) {
  std::vector<PhaseSettings> phases;
  std::vector<std::map<std::string, std::string>> raw;
  for (size_t i = 0; i < pr.phases.size(); ++i) {
    PhaseSettings p = pr.phases[i];
    if (!p.control.empty()) {
      HMLA_CHECK(!phases.empty(), ConfigError, pr.path, ": phases[", i, "] (", p.name,
                 "): a control arm continues the phase before it; this is the first phase");
      PhaseSettings c = p;
      c.name = p.name + "-control";
      c.mode = LayerMode::mha;
      c.control.clear();
      c.mqa_split_kv_b_proj = false;
      c.control_of = int64_t(phases.size()) + 1;
      c.data_phase = c.control_of;  // the sparse phase's data, in its order
      p.restart_from = int64_t(phases.size()) - 1;
      HMLA_CHECK(io::is_plain_name(c.name), ConfigError, pr.path, ": phases[", i, "]: the control arm's name '", c.name,
                 "' must be ", io::plain_name_rule());
      phases.push_back(c);
      raw.push_back(pr.phase_raw[i]);
    }
    phases.push_back(p);
    raw.push_back(pr.phase_raw[i]);
  }
  std::set<std::string> names;
  for (const PhaseSettings& p : phases)
    HMLA_CHECK(names.insert(p.name).second, ConfigError, pr.path, ": two phases are named '", p.name,
               "' (a control arm is named <phase>-control)");
  pr.phases = std::move(phases);
  pr.phase_raw = std::move(raw);
}

// An explicit list names at least one layer, each once ("all" is the way to say every layer; an
// empty list used to mean it too, silently).
std::vector<int64_t> hybrid_layers(const YAML::Node& v, const std::string& path) {
  std::vector<int64_t> layers = get<std::vector<int64_t>>(v, "hybrid_layers", path);
  HMLA_CHECK(!layers.empty(), ConfigError, path, ": hybrid_layers", yaml_line(v),
             " is an empty list; name at least one layer, or write 'all' (the default) for every layer");
  std::set<int64_t> seen;
  for (int64_t L : layers) {
    HMLA_CHECK(L >= 0, ConfigError, path, ": hybrid_layers", yaml_line(v), ": layer ", L, " is negative");
    HMLA_CHECK(seen.insert(L).second, ConfigError, path, ": hybrid_layers", yaml_line(v), ": layer ", L,
               " is listed twice; give each layer once");
  }
  return layers;
}

std::string resolve(const std::string& base_dir, const std::string& p) {
  if (p.empty() || std::filesystem::path(p).is_absolute()) return p;
  return (std::filesystem::path(base_dir) / p).lexically_normal().string();
}

}  // namespace

Programme parse_programme(const std::string& text, const std::string& path) {
  const YAML::Node root = load_yaml(text, path);
  HMLA_CHECK(root.IsMap(), ConfigError, path, ": a programme is a mapping (model, data, base, phases, ...)");
  Programme pr;
  pr.path = path;
  const std::string dir = std::filesystem::path(path).parent_path().string();
  YAML::Node base, phases;
  for_each_key(root, path, [&](const std::string& k, const YAML::Node& v) {
    if (k == "model") pr.model_config = resolve(dir, get<std::string>(v, k, path));
    else if (k == "data") pr.data_dir = resolve(dir, get<std::string>(v, k, path));
    else if (k == "init_checkpoint") pr.init_checkpoint = resolve(dir, get<std::string>(v, k, path));
    else if (k == "seed") pr.seed = get<uint64_t>(v, k, path);
    else if (k == "device") {
      pr.device = get<std::string>(v, k, path);
      HMLA_CHECK(pr.device == "cpu" || pr.device == "cuda", ConfigError, path, ": device '", pr.device,
                 "': use cpu or cuda");
    } else if (k == "attention_backend") {
      pr.attention_backend = parse_attn_backend(get<std::string>(v, k, path), path + ": attention_backend" + yaml_line(v));
    } else if (k == "hybrid_layers") {
      if (!(v.IsScalar() && v.Scalar() == "all")) pr.hybrid_layers = hybrid_layers(v, path);
    } else if (k == "base") base = v;
    else if (k == "phases") phases = v;
    else
      throw ConfigError(path + ": unknown key '" + k +
                        "' (known: model, data, init_checkpoint, seed, hybrid_layers, device, attention_backend, base, phases)");
  });
  HMLA_CHECK(!pr.model_config.empty() && !pr.data_dir.empty(), ConfigError, path, ": model and data are required");
  HMLA_CHECK(phases.IsSequence() && phases.size() > 0, ConfigError, path, ": phases must be a non-empty list");
  PhaseSettings b;
  if (base.IsDefined() && !base.IsNull()) {
    HMLA_CHECK(base.IsMap(), ConfigError, path, ": base must be a mapping");
    for_each_key(base, path + ": base", [&](const std::string& k, const YAML::Node& v) {
      apply(b, k, v, path + ": base");
      pr.base_raw[k] = YAML::Dump(v);
    });
  }
  for (size_t i = 0; i < phases.size(); ++i) {
    const std::string where = path + ": phases[" + std::to_string(i) + "]";
    HMLA_CHECK(phases[i].IsMap(), ConfigError, where, " must be a mapping");
    PhaseSettings p = b;
    std::map<std::string, std::string> raw;
    for_each_key(phases[i], where, [&](const std::string& k, const YAML::Node& v) {
      apply(p, k, v, where);
      raw[k] = YAML::Dump(v);
    });
    p.optim.total_steps = std::max<int64_t>(p.steps, 1);
    validate(p, where + " (" + p.name + ")");
    pr.phases.push_back(p);
    pr.phase_raw.push_back(raw);
  }
  expand_controls(pr);
  return pr;
}

Programme load_programme(const std::string& path) {
  return parse_programme(io::read_file(path, kMaxYamlBytes), path);
}

}  // namespace hmla
