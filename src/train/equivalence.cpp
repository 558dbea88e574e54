// The equivalence check (equivalence.h): the same weights run twice, the hybrid layers as MHA and
// as full-causal latent MQA, compared by max |difference| against max |logit|.
#include "equivalence.h"

#include <algorithm>
#include <cmath>
#include <iomanip>

#include "hmla/core/error.h"
#include "hmla/ops/backend.h"
#include "run_inputs.h"

namespace hmla::train {

namespace {

// max |logits_mqa - logits_mha| and max |logits_mha| with the hybrid layers in each form (over
// the context-parallel group's rows).
std::pair<double, double> equivalence(const Model& m, const std::vector<bool>& hybrid, const Batch& batch, Comm& cp) {
  Model a = m, b = m;
  set_modes(a.cfg, hybrid, LayerMode::mha);
  set_modes(b.cfg, hybrid, LayerMode::mqa_full_causal);
  auto la = model_logits(a, batch, nullptr, cp).to_vector<float>(), lb = model_logits(b, batch, nullptr, cp).to_vector<float>();
  double r[2] = {0, 0};  // diff, magnitude
  for (size_t i = 0; i < la.size(); ++i) {
    r[0] = std::max(r[0], std::abs(double(lb[i]) - la[i]));
    r[1] = std::max(r[1], std::abs(double(la[i])));
  }
  cp.allreduce_max(r, 2);
  return {r[0], r[1]};
}

// The check's tolerance: the programme's for f32 compute (the CPU). On CUDA the two forms round
// different intermediates to bf16 (unit roundoff u = 2^-8: 8 significant bits, so 1 + 2^-8 is a
// tie between 1 and 1 + 2^-7): per hybrid layer the attention's q, k and v and the absorption's and
// de-absorption's two inputs, <= 8 sites each perturbing what it touches by <= u relative, so to
// first order the logits differ by <= 8 u per hybrid layer relative to their largest; a
// structural error (a wrong split or absorption) is O(1).
double equivalence_rtol(const PhaseSettings& ph, const Model& model, const std::vector<bool>& hybrid) {
  if (compute_dtype(model.device()) == DType::f32) return ph.equivalence_rtol;
  const double layers = double(std::count(hybrid.begin(), hybrid.end(), true));
  return std::max(ph.equivalence_rtol, 8.0 * layers * std::ldexp(1.0, -8));
}

}  // namespace

void check_phase_equivalence(const PhaseSettings& ph, const Model& model, const std::vector<bool>& hybrid,
                             const Batch& eval, Comm& cp, std::ostream& log, MetricsLog& metrics) {
  auto [diff, mag] = equivalence(model, hybrid, eval, cp);
  const double rtol = equivalence_rtol(ph, model, hybrid);
  log << "[" << ph.name << "] equivalence: max|logits_mqa - logits_mha| = " << std::scientific << std::setprecision(3)
      << diff << ", max|logits_mha| = " << mag << " (rtol " << rtol
      << (rtol != ph.equivalence_rtol ? ", the bound of bf16 compute" : "") << ")\n"
      << std::defaultfloat << std::setprecision(6);
  MetricsRow row{MetricsRow::Kind::equivalence, ph.name};
  row.equivalence_max_diff = diff, row.equivalence_max_logit = mag;
  metrics.row(row);
  HMLA_CHECK(diff <= rtol * mag, ConfigError, "phase '", ph.name, "': the MHA/MQA equivalence check failed (", diff,
             " > ", rtol, " * ", mag, "); the programme stops");
}

}  // namespace hmla::train
