// The equivalence check (equivalence.h): the same weights run twice, the hybrid layers as MHA and
// as full-causal latent MQA, compared by max |difference| against max |logit| (in a MoE model over
// the tokens before a row's first differing routing choice).
#include "equivalence.h"

#include <algorithm>
#include <cmath>
#include <iomanip>

#include "hmla/core/error.h"
#include "hmla/ops/backend.h"
#include "run_inputs.h"

namespace hmla::train {

namespace {

// Per batch row, how many leading tokens the two forms' logits are compared on. A MoE router's
// choice is piecewise constant: where the two forms round differently (bf16 compute), a token
// whose best experts nearly tie may take another expert in one form, a jump the first-order bound
// below does not cover and that says nothing about the forms' equivalence. A token's logits depend
// on its own and earlier positions of its row only (causal), so each row is compared up to its
// first token whose chosen experts differ in some MoE layer. Under context parallelism a rank
// sees a slice of each row, so a row with such a token anywhere is left out whole.
std::vector<int64_t> comparable_prefix(const std::vector<Tensor>& ea, const std::vector<Tensor>& eb, int64_t rows,
                                       int64_t s, Comm& cp) {
  std::vector<int64_t> upto(size_t(rows), s);
  for (size_t L = 0; L < ea.size(); ++L) {
    if (!ea[L].defined()) continue;
    const int64_t k = ea[L].size(1);
    const std::vector<int32_t> va = ea[L].to(Device::cpu).to_vector<int32_t>(),
                               vb = eb[L].to(Device::cpu).to_vector<int32_t>();
    for (int64_t i = 0; i < rows * s; ++i)
      if (!std::equal(va.begin() + i * k, va.begin() + (i + 1) * k, vb.begin() + i * k))
        upto[size_t(i / s)] = std::min(upto[size_t(i / s)], i % s);
  }
  if (cp.size() > 1) {
    std::vector<double> cut(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) cut[size_t(r)] = upto[size_t(r)] < s ? 1 : 0;
    cp.allreduce_max(cut.data(), rows);
    for (int64_t r = 0; r < rows; ++r) upto[size_t(r)] = cut[size_t(r)] > 0 ? 0 : s;
  }
  return upto;
}

struct Equivalence {
  double diff = 0, mag = 0;       // max |logits_mqa - logits_mha| (compared tokens), max |logits_mha|
  double left_out = 0, total = 0;  // tokens not compared (a MoE routing differed), all tokens
};

// The two forms' logits with the hybrid layers in each form (over the context-parallel group's rows).
Equivalence equivalence(const Model& m, const std::vector<bool>& hybrid, const Batch& batch, Comm& cp) {
  Model a = m, b = m;
  set_modes(a.cfg, hybrid, LayerMode::mha);
  set_modes(b.cfg, hybrid, LayerMode::mqa_full_causal);
  std::vector<Tensor> ea, eb;
  const Tensor ta = model_logits(a, batch, nullptr, cp, &ea), tb = model_logits(b, batch, nullptr, cp, &eb);
  const int64_t rows = ta.size(0), s = ta.size(1), V = ta.size(2);
  const std::vector<int64_t> upto = comparable_prefix(ea, eb, rows, s, cp);
  const std::vector<float> la = ta.to_vector<float>(), lb = tb.to_vector<float>();
  double r[4] = {0, 0, 0, double(rows * s)};  // diff, magnitude, tokens left out, tokens
  for (int64_t row = 0; row < rows; ++row) {
    r[2] += double(s - upto[size_t(row)]);
    for (int64_t t = 0; t < s; ++t)
      for (int64_t v = 0; v < V; ++v) {
        const size_t i = size_t((row * s + t) * V + v);
        if (t < upto[size_t(row)]) r[0] = std::max(r[0], std::abs(double(lb[i]) - la[i]));
        r[1] = std::max(r[1], std::abs(double(la[i])));
      }
  }
  cp.allreduce_max(r, 2);
  return {r[0], r[1], r[2], r[3]};
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
  const auto [diff, mag, left_out, total] = equivalence(model, hybrid, eval, cp);
  const double rtol = equivalence_rtol(ph, model, hybrid);
  log << "[" << ph.name << "] equivalence: max|logits_mqa - logits_mha| = " << std::scientific << std::setprecision(3)
      << diff << ", max|logits_mha| = " << mag << " (rtol " << rtol
      << (rtol != ph.equivalence_rtol ? ", the bound of bf16 compute" : "") << ")" << std::defaultfloat
      << std::setprecision(6);
  if (left_out > 0)
    log << "; " << left_out << " of " << total
        << " tokens (this rank's) not compared: a MoE routing differed at or before them";
  log << "\n";
  MetricsRow row{MetricsRow::Kind::equivalence, ph.name};
  row.equivalence_max_diff = diff, row.equivalence_max_logit = mag;
  metrics.row(row);
  HMLA_CHECK(diff <= rtol * mag, ConfigError, "phase '", ph.name, "': the MHA/MQA equivalence check failed (", diff,
             " > ", rtol, " * ", mag, "); the programme stops");
}

}  // namespace hmla::train
