// The training step (step.h): micro-batches, the model's forward and backward per micro-batch,
// one SUM all-reduce of the gradient arena (sharded: a reduce-scatter to the owners, then an
// all-gather of the weights) and the losses, the update gated on the device, one read-back of the
// step's stats, the divergence checks.
#include "step.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "hmla/core/error.h"
#include "hmla/model/losses.h"
#include "hmla/model/v4_model.h"
#include "hmla/ops/moe.h"
#include "hmla/ops/optim.h"

namespace hmla::train {

namespace {

// The MoE part of the stats buffer: after the kStatCount slots, each MoE layer's expert load
// [n_moe, E], then each layer's balance loss [n_moe]; read back with the rest.
struct MoeSlots {
  int64_t n_moe = 0, E = 0;
  int64_t size() const { return n_moe * (E + 1); }
};

// After the step's checks: the global load (every rank's counts summed: identical on every rank,
// sums of integers), the bias update outside dsa_warmup, the per-layer imbalance and balance loss.
void balance_experts(RankGrid& grid, const PhaseSettings& ph, Model& model, const MoeSlots& ms, const double* h,
                     bool aux, StepResult& r) {
  const std::vector<int64_t> layers = moe_layers(model.cfg);
  std::vector<double> load(h, h + ms.size());  // loads, then aux losses
  grid.world.allreduce_sum(load.data(), int64_t(load.size()));
  r.moe_layers = layers;
  for (int64_t j = 0; j < ms.n_moe; ++j) {
    const double* lj = load.data() + j * ms.E;
    double total = 0, most = 0;
    for (int64_t e = 0; e < ms.E; ++e) total += lj[e], most = std::max(most, lj[e]);
    r.moe_imbalance.push_back(total > 0 ? most / (total / double(ms.E)) : std::nan(""));
    if (aux) r.moe_aux_loss.push_back(load[size_t(ms.n_moe * ms.E + j)]);
  }
  if (ph.mode == LayerMode::dsa_warmup || ph.moe_bias_update_rate == 0) return;  // frozen, or off
  load.resize(size_t(ms.n_moe * ms.E));  // the loads: one upload for every layer
  const Tensor dev_load = Tensor::from_vector<double>({ms.n_moe, ms.E}, load).on(model.device());
  for (int64_t j = 0; j < ms.n_moe; ++j) {
    const std::string bias = moe_bias_name(model.cfg, layers[size_t(j)]);
    if (!bias.empty()) moe_bias_update(model.params.at(bias), dev_load.select(0, j), float(ph.moe_bias_update_rate));
  }
}

// A V4 stack's KL per kind: the logged KL is the mean over every layer that ran one, the CSA
// layers' mean came separately, the hybrid_mla layers' (the MTP layers' where the phase runs them,
// v4_mtp_kl_layers) is the rest.
void kl_per_kind(const ModelConfig& c, const PhaseSettings& ph, double kl, double kl_csa, StepResult& r) {
  if (!c.is_v4()) return;
  const MtpKlLayers mtp = ph.mtp_loss_coeff > 0 ? v4_mtp_kl_layers(c) : MtpKlLayers{};
  int64_t all = mtp.all(), csa = mtp.csa;
  for (int64_t L = 0; L < c.num_hidden_layers; ++L)
    if (c.runs_indexer(L)) ++all, csa += c.v4.layer_types[size_t(L)] == V4Kind::csa;
  if (csa > 0) r.kl_csa = kl_csa;
  if (all > csa) r.kl_hybrid = (kl * double(all) - kl_csa * double(csa)) / double(all - csa);
}

// The attention mass's global means from its sums (StepOptions::attn_mass: per kind window,
// entries, sink, (row, head) pairs over every rank's loss rows); kinds without layers stay NaN, as
// does a sliding layer's entries (it has none).
void attn_mass_means(const double* sums, AttnMass& m) {
  for (size_t k = 0; k < 3; ++k) {
    const double* row = sums + 4 * k;
    if (row[3] > 0)
      for (size_t q = 0; q < 3; ++q) m[k][q] = row[q] / row[3];
  }
  m[size_t(V4Kind::sliding)][1] = NAN;
}

}  // namespace

StepResult train_step(RankGrid& grid, const PhaseSettings& ph, int64_t step, Model& model, Optimizer& optim,
                      PackedLoader& loader, Tensor& garena, io::TensorMap& grads, bool log_step) {
  const auto t0 = std::chrono::steady_clock::now();
  const CudaCounters c0 = cuda_counters();
  allocator(model.device()).reset_peak();
  std::vector<Batch> micro;
  int64_t targets = 0, rows = 0, sequences = 0;
  // Multi-token prediction: each depth's targets, k + 2 ahead (dsa_warmup freezes the MTP layers too,
  // but for a hybrid_mla MTP layer's indexer).
  const bool mtp = ph.mtp_loss_coeff > 0 && ph.mode != LayerMode::dsa_warmup;
  std::vector<int64_t> mtp_targets(mtp ? size_t(model.cfg.form.num_nextn_predict_layers) : 0, 0);
  for (int64_t i = 0; i < ph.micro_batches; ++i) {
    micro.push_back(loader.next(ph.batch / ph.micro_batches));
    targets += count_lm_targets(micro.back(), model.cfg.pad_token_id);
    rows += loss_row_count(micro.back().layout, &micro.back().input_ids, model.cfg.pad_token_id);
    sequences += loss_sequence_count(micro.back().layout, &micro.back().input_ids, model.cfg.pad_token_id);
    for (size_t k = 0; k < mtp_targets.size(); ++k)
      mtp_targets[k] += count_lm_targets(micro.back(), model.cfg.pad_token_id, int64_t(k) + 2);
  }
  garena.fill_zero();
  const bool indexer_only = ph.mode == LayerMode::dsa_warmup;
  StepOptions so;
  so.backbone = !indexer_only, so.recompute_attention = ph.recompute_attention;
  so.lm_targets = std::max<int64_t>(targets, 1), so.valid_rows = std::max<int64_t>(rows, 1);
  // The step's scalars stay on the device until its one read-back (hmla/ops/optim.h): the
  // micro-batches' losses, the norms, the clip scales and the gate of the update.
  const MoeSlots ms{int64_t(moe_layers(model.cfg).size()), model.cfg.moe.n_routed_experts};
  // A V4 stack's logging step: the attention mass's sums [3 kinds, 4] after the MoE part.
  const bool mass = log_step && model.cfg.is_v4();
  const int64_t at_mass = kStatCount + ms.size();
  const Tensor all_stats = Tensor::zeros({at_mass + (mass ? 12 : 0)}, DType::f64, model.device());
  const Tensor stats = all_stats.slice(0, 0, kStatCount);
  const Tensor bad = Tensor::zeros({1}, DType::f32, model.device());
  so.stats = stats;
  const bool aux = ms.n_moe > 0 && !indexer_only && ph.moe_aux_loss_coeff > 0;
  if (ms.n_moe > 0) {
    so.expert_load = all_stats.slice(0, kStatCount, kStatCount + ms.n_moe * ms.E).view({ms.n_moe, ms.E});
    so.aux_loss = all_stats.slice(0, kStatCount + ms.n_moe * ms.E, kStatCount + ms.size());
  }
  if (aux) so.moe_aux_coeff = ph.moe_aux_loss_coeff, so.aux_sequences = std::max<int64_t>(sequences, 1);
  // dsa_warmup: no MTP loss, but a hybrid_mla MTP layer's indexer trains by its KL (v4_step).
  if (ph.mtp_loss_coeff > 0) so.mtp_coeff = ph.mtp_loss_coeff;
  if (mtp) {  // the MTP loss goes into kStatMtp (docs/deepseek_v4_math.md section 14)
    so.mtp_targets = mtp_targets;
    for (int64_t& t : so.mtp_targets) t = std::max<int64_t>(t, 1);
  }
  if (mass) so.attn_mass = all_stats.slice(0, at_mass, at_mass + 12).view({3, 4});
  double tokens = 0;
  int64_t ep_bytes = -1;
  // Under expert parallelism (Model::ep) every rank of the EP group runs the same count of
  // micro-batches (micro_batches % DP == 0), so their MoE layers' exchanges pair up.
  const int64_t ep0 = grid.ep.bytes_sent();
  for (size_t i = grid.dp_rank; i < micro.size(); i += size_t(grid.dp))
    tokens += double(model_step(model, micro[i], so, grads, grid.cp).tokens);
  if (model.ep) ep_bytes = grid.ep.bytes_sent() - ep0;
  // Every rank must skip the update when any rank's loss is not finite. The gradient's
  // all-reduce carries a NaN loss's NaN gradient to every rank's norm, but not every non-finite
  // loss has one (an infinite KL where Q underflows has a finite gradient), so each rank's
  // verdict on its own losses is summed over the ranks on the device as well. The host's global
  // losses (all-reduced below) are non-finite exactly when some rank's are: a sum of finite
  // per-rank values cannot overflow (each is a sum of f32-sized terms, far below 1e308).
  stats_losses(stats, bad);
  if (optim.sharded()) {  // ZeRO-1: each tensor's sum reaches its owner only, the weights come back
    grid.world.allreduce_sum(bad.data<float>(), 1, bad.device());
    optim.launch_sharded_step(model, garena, step, stats, bad);
  } else {
    optim.allreduce_gradients(garena);  // CP shares and DP replicas (an expert over the ranks holding it)
    grid.world.allreduce_sum(bad.data<float>(), 1, bad.device());
    optim.launch_step(model, grads, step, stats, bad);
  }
  const std::vector<double> h = all_stats.to_vector<double>();  // the step's one read-back
  // lm, kl, tokens of this rank's micro-batches, the MTP loss, the CSA layers' kl, the mass's sums
  std::vector<double> sums = {h[kStatLm], h[kStatKl], tokens, mtp ? h[kStatMtp] : 0.0,
                              h[kStatKlCsa]};
  if (mass) sums.insert(sums.end(), h.begin() + at_mass, h.begin() + at_mass + 12);
  grid.world.allreduce_sum(sums.data(), int64_t(sums.size()));
  StepResult r;
  r.ep_bytes = ep_bytes;
  r.lm = sums[0];
  r.kl = sums[1];
  r.tokens = int64_t(sums[2]);
  r.mtp = mtp ? sums[3] : std::nan("");
  kl_per_kind(model.cfg, ph, sums[1], sums[4], r);
  if (mass) attn_mass_means(sums.data() + 5, r.attn_mass);
  const std::string at = "phase '" + ph.name + "' step " + std::to_string(step + 1) + ": ";
  HMLA_CHECK(std::isfinite(r.lm) && std::isfinite(r.kl), DivergenceError, at, "the ",
             std::isfinite(r.lm) ? "indexer KL" : "LM loss", " is ", std::isfinite(r.lm) ? r.kl : r.lm,
             "; the run stops and the last checkpoint is kept as it was");
  HMLA_CHECK(!mtp || std::isfinite(r.mtp), DivergenceError, at, "the MTP loss is ", r.mtp,
             "; the run stops and the last checkpoint is kept as it was");
  try {
    r.os = optim.stats_of(h, step);
  } catch (const DivergenceError& e) {
    throw DivergenceError(at + e.what() + "; the run stops and the last checkpoint is kept as it was");
  }
  if (ms.n_moe > 0) balance_experts(grid, ph, model, ms, h.data() + kStatCount, aux, r);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.cuda = cuda_counters() - c0;
  return r;
}

MetricsRow step_row(const PhaseSettings& ph, int64_t step, const StepResult& r, Device dev) {
  MetricsRow row{MetricsRow::Kind::step, ph.name};
  row.step = step + 1;
  row.lm_loss = r.lm;
  row.indexer_kl = is_dsa(ph.mode) ? r.kl : MetricsRow::none;
  row.indexer_kl_csa = r.kl_csa, row.indexer_kl_hybrid = r.kl_hybrid;
  row.mtp_loss = r.mtp;  // NaN (not written) where the phase trains no MTP loss
  row.attn_mass = r.attn_mass;
  row.lr = r.os.lr;
  row.grad_norm_backbone = r.os.grad_norm_backbone, row.grad_norm_indexer = r.os.grad_norm_indexer;
  row.tokens_per_s = double(r.tokens) / r.seconds;
  row.peak_bytes = double(allocator(dev).peak_bytes());
  row.moe_layers = r.moe_layers, row.moe_imbalance = r.moe_imbalance, row.moe_aux_loss = r.moe_aux_loss;
  if (r.ep_bytes >= 0) row.ep_bytes = double(r.ep_bytes);
  if (dev == Device::cuda) {
    row.cuda_syncs = double(r.cuda.syncs), row.cuda_launches = double(r.cuda.launches);
    row.h2d_bytes = double(r.cuda.h2d_bytes), row.d2h_bytes = double(r.cuda.d2h_bytes);
    row.cuda_uploads = double(r.cuda.uploads);
  }
  return row;
}

}  // namespace hmla::train
