// The run's inputs (run_inputs.h): the hybrid mask, the memory plan of every phase, the data.
#include "run_inputs.h"

#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "hmla/core/cuda.h"
#include "hmla/core/error.h"
#include "hmla/core/size_check.h"
#include "hmla/train/run_state.h"
#include "hmla/ops/backend.h"

namespace hmla::train {

namespace fs = std::filesystem;

namespace {

std::vector<bool> hybrid_mask(const Programme& pr, int64_t layers) {
  std::vector<bool> h(layers, pr.hybrid_layers.empty());
  for (int64_t L : pr.hybrid_layers) {
    HMLA_CHECK(L >= 0 && L < layers, ConfigError, pr.path, ": hybrid layer ", L, " does not exist (", layers, " layers)");
    h[L] = true;
  }
  return h;
}

// Checks every phase's plan against the budget; returns one line per phase for the console:
// parameters with their gradients and moments, and a micro-batch's activations (lower bounds).
std::string check_programme_memory(const Programme& pr, const ModelConfig& cfg, const std::vector<bool>& hybrid,
                                   int cp, int ep, Device dev) {
  std::ostringstream lines;
  for (const PhaseSettings& ph : pr.phases) {
    ModelConfig pc = cfg;
    set_modes(pc, hybrid, ph.mode);
    const std::vector<bool> indexer = phase_indexers(cfg, hybrid, ph.mode);
    const SizeFactor s = cp > 1 ? SizeFactor{"seq_len / cp", ph.seq_len / cp} : SizeFactor{"seq_len", ph.seq_len};
    const std::string where = pr.path + ": phase '" + ph.name + "'";
    MemoryPlan step, eval;
    const DType compute = compute_dtype(dev);  // the activations' and the weight copy's element sizes
    plan_parameters(step, pc, indexer, true, compute, ep);  // --ep: this rank's block of the experts
    const int64_t params = step.total();
    plan_activations(step, pc, {"batch / micro_batches", ph.batch / ph.micro_batches}, s, true, compute,
                     ph.recompute_attention);
    step.check(where + ": a training step", dev);
    lines << "memory plan [" << ph.name << "]: parameters, gradients and moments " << format_bytes(double(params))
          << ", activations of a micro-batch >= " << format_bytes(double(step.total() - params)) << "\n";
    plan_parameters(eval, pc, indexer, false, compute, ep);
    plan_activations(eval, pc, {"eval_rows", ph.eval_rows}, s, false, compute);
    eval.check(where + ": the held-out evaluation", dev);
  }
  return lines.str();
}

// Multi-token prediction (docs/deepseek_v4_math.md section 14): a programme with a phase of
// mtp_loss_coeff > 0 makes the MTP layers parameters for all its phases (frozen where the
// coefficient is 0), on a deepseek_v4 model that has them with learned routing, of any attention
// kind (a hybrid_mla MTP layer runs each phase's mode: set_modes).
void train_mtp_layers(const Programme& pr, ModelConfig& cfg) {
  for (const PhaseSettings& ph : pr.phases) {
    if (ph.mtp_loss_coeff == 0) continue;
    HMLA_CHECK(cfg.is_v4() && cfg.form.num_nextn_predict_layers > 0, ConfigError, pr.path, ": phase '", ph.name,
               "': mtp_loss_coeff = ", ph.mtp_loss_coeff, " needs a deepseek_v4 model with MTP layers (",
               pr.model_config, ": ", cfg.is_v4() ? "num_nextn_predict_layers = 0" : "not deepseek_v4",
               "); hmla trains DeepSeek-V4's MTP layers only");
    for (size_t i = 0; i < cfg.v4.mtp_hash.size(); ++i)
      HMLA_CHECK(!cfg.v4.mtp_hash[i], ConfigError, pr.model_config, ": MTP layer ", i,
                 " is hash_moe in mlp_layer_types; hmla trains MTP layers with learned routing only (DeepSeek's are)");
    cfg.v4.mtp_params = true;
  }
}

}  // namespace

std::vector<PhaseModel> phase_models(const Programme& pr) {
  ModelConfig cfg = load_model_config(pr.model_config, LayerModesFrom::programme);
  train_mtp_layers(pr, cfg);
  const std::vector<bool> hybrid = hybrid_mask(pr, cfg.num_hidden_layers);
  std::vector<PhaseModel> models;
  for (const PhaseSettings& ph : pr.phases) {
    ModelConfig pc = cfg;
    set_modes(pc, hybrid, ph.mode);
    models.push_back({pc, phase_indexers(cfg, hybrid, ph.mode)});
  }
  return models;
}

std::string memory_plan_table(const Programme& pr, int cp, Device dev) {
  const std::vector<PhaseModel> models = phase_models(pr);
  // CUDA's compute dtype (DESIGN.md section 4) is known without a device or its backend.
  const DType compute = dev == Device::cpu ? DType::f32 : DType::bf16;
  const bool env = std::getenv("HMLA_MEMORY_BUDGET") && *std::getenv("HMLA_MEMORY_BUDGET");
  const bool known = env || dev == Device::cpu || cuda_device_count() > 0;
  const int64_t budget = known ? memory_budget(dev) : -1;
  std::ostringstream out;
  auto line = [&out](const std::string& what, double bytes) {
    out << "  " << what << std::string(what.size() < 58 ? 58 - what.size() : 1, ' ') << format_bytes(bytes) << "\n";
  };
  for (size_t i = 0; i < pr.phases.size(); ++i) {
    const PhaseSettings& ph = pr.phases[i];
    const auto& [pc, indexer] = models[i];
    const SizeFactor s = cp > 1 ? SizeFactor{"seq_len / cp", ph.seq_len / cp} : SizeFactor{"seq_len", ph.seq_len};
    MemoryPlan params, acts;
    plan_parameters(params, pc, indexer, false, compute);
    plan_activations(acts, pc, {"batch / micro_batches", ph.batch / ph.micro_batches}, s, true, compute,
                     ph.recompute_attention);
    const double p = double(params.items().front().bytes);  // the f32 parameters (then tid2eid, the compute copy)
    out << "memory plan [" << ph.name << "] (" << mode_name(ph.mode) << ", seq_len " << ph.seq_len << ", micro-batch "
        << ph.batch / ph.micro_batches << " rows, " << device_name(dev) << "):\n";
    line("parameters (f32)", p);
    line("gradients (f32)", p);
    line("optimizer moments (f32, 2 per parameter)", 2 * p);
    for (size_t i = 1; i < params.items().size(); ++i) line(params.items()[i].what, double(params.items()[i].bytes));
    out << "  activations of a micro-batch (lower bounds):\n";
    for (const MemoryPlan::Item& it : acts.items()) line("  " + it.what, double(it.bytes));
    const double total = 4 * p + double(params.total()) - p + double(acts.total());
    line("total (at least)", total);
    if (!known) {
      out << "  budget: unknown (no CUDA device here; HMLA_MEMORY_BUDGET sets one, e.g. 141000000000 for an H200)\n";
      continue;
    }
    out << "  budget: " << (budget < 0 ? std::string("unlimited") : format_bytes(double(budget))) << " ("
        << memory_budget_source(dev) << ")\n";
    if (budget >= 0)
      out << "  fits: " << (total <= double(budget) ? "yes" : "no, " + format_bytes(total - double(budget)) + " over") << "\n";
  }
  return out.str();
}

std::vector<bool> phase_indexers(const ModelConfig& c, const std::vector<bool>& hybrid, LayerMode mode) {
  std::vector<bool> need(hybrid.size());
  for (size_t L = 0; L < hybrid.size(); ++L) need[L] = hybrid[L] && is_dsa(mode) && c.has_dsa(int64_t(L));
  return need;
}

void set_modes(ModelConfig& c, const std::vector<bool>& hybrid, LayerMode mode) {
  c.mtp_mode = mode;  // a V4 stack's MTP layers run the programme too (DESIGN.md section 10)
  for (size_t L = 0; L < hybrid.size(); ++L) c.layer_modes[L] = hybrid[L] ? mode : LayerMode::mha;
}

RunInputs load_run_inputs(const Programme& pr, int cp_ranks, Device dev, int ep_ranks) {
  RunInputs in;
  in.cfg = load_model_config(pr.model_config, LayerModesFrom::programme);
  train_mtp_layers(pr, in.cfg);
  in.hybrid = hybrid_mask(pr, in.cfg.num_hidden_layers);
  in.memory_plan = check_programme_memory(pr, in.cfg, in.hybrid, cp_ranks, ep_ranks, dev);
  TokenData data = load_token_data(pr.data_dir);  // refuses a pair from two prepare-data runs
  // The data's ids were checked against the vocab_size its files record; that must fit the model.
  HMLA_CHECK(data.vocab_size <= in.cfg.vocab_size, ConfigError, pr.data_dir, ": the data's tokenizer (",
             data.tokenizer, ") has vocab_size ", data.vocab_size, ", more than the model's ", in.cfg.vocab_size,
             " (", pr.model_config, "); prepare the data with the model's tokenizer");
  in.train = std::move(data.train);
  in.held = std::move(data.held);
  in.fingerprint = std::move(data.fingerprint);
  in.tokenizer = {data.tokenizer, data.tokenizer_fingerprint, data.vocab_size};
  return in;
}

}  // namespace hmla::train
