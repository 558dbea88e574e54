// The MoE load-balancing ops on the CPU (hmla/ops/moe.h, docs/moe.md "Load balancing"): the
// experts' load per segment (one thread per segment, tokens and slots in order), the bias update
// (one pass over the experts) and the sequence-wise balance loss per token (one thread per token;
// the loss summed over tokens in order afterwards). No atomics: the same bits on any thread count.
#include <cmath>
#include <vector>

#include "cpu_kernels.h"

namespace hmla::cpu {

void moe_expert_load(const MoeBalanceParams& p) {
  const int64_t per = p.N / p.rows;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < p.rows; ++r) {
    double* out = p.load + r * p.E;
    if (!p.accumulate)
      for (int64_t e = 0; e < p.E; ++e) out[e] = 0;
    for (int64_t t = r * per; t < (r + 1) * per; ++t) {
      if (p.mask && !(p.mask[t] > 0.f)) continue;
      for (int64_t j = 0; j < p.k; ++j) out[p.idx[t * p.k + j]] += 1;  // integers: exact in any order
    }
  }
}

void moe_bias_update(const MoeBalanceParams& p) {
  double total = 0;
  for (int64_t e = 0; e < p.E; ++e) total += p.load_in[e];
  for (int64_t e = 0; e < p.E; ++e) {
    // sign(total / E - load) as sign(total - E load): exact on integer counts below 2^53 / E.
    const double d = total - double(p.E) * p.load_in[e];
    const float sign = d > 0 ? 1.f : d < 0 ? -1.f : 0.f;
    p.bias[e] = p.bias[e] + p.rate * sign;
  }
}

void moe_aux_loss(const MoeBalanceParams& p) {
  const int64_t E = p.E, per = p.N / p.rows;
  std::vector<double> lt(size_t(p.N), 0.0);
#pragma omp parallel
  {
    std::vector<float> s(static_cast<size_t>(E));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < p.N; ++t) {
      if (!(p.mask[t] > 0.f)) continue;  // not a loss row (padding): no loss, no gradient
      const float* u = p.logits + t * E;
      const double* F = p.counts + (t / per) * E;
      double T = 0;  // the segment's counted tokens: its counts / k (integers, exact)
      for (int64_t e = 0; e < E; ++e) T += F[e];
      T /= double(p.k);
      const float c = float(p.scale / (T * T));
      float S = 0.f;
      for (int64_t e = 0; e < E; ++e) {
        s[e] = 1.f / (1.f + std::exp(-u[e]));
        S += s[e];
      }
      float q = 0.f;  // sum_i F_i s'_i
      for (int64_t e = 0; e < E; ++e) q += float(F[e]) * (s[e] / S);
      lt[size_t(t)] = double(c) * double(q);
      float* d = p.dlogits + t * E;
      for (int64_t e = 0; e < E; ++e) d[e] += c * (float(F[e]) - q) / S * (s[e] * (1.f - s[e]));
    }
  }
  double sum = 0;
  for (int64_t t = 0; t < p.N; ++t) sum += lt[size_t(t)];
  *p.loss += sum;
}

// The CPU's plan (cpu_kernels.h): integer loads and f32 statistics, any sizes.
Plan plan(Op, const MoeBalanceParams&) { return {Variant::cpu, {}}; }

}  // namespace hmla::cpu
