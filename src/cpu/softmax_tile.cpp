// Element-wise passes over the dense attention's score tiles (softmax_tile.h): exp, row maxima
// and sums, compiled twice (AVX-512 and the x86-64-v3 baseline) and picked at load time.
#include "softmax_tile.h"

#include <cmath>

#include "vexp.h"


namespace hmla::cpu {

HMLA_CLONES
void softmax_online_tile(float* S, int64_t nq, int64_t nk, float* m, float* l, float* O, int64_t Dv) {
  for (int64_t r = 0; r < nq; ++r) {
    float* row = S + r * nk;
    float mx = m[r];
#pragma omp simd reduction(max : mx)
    for (int64_t c = 0; c < nk; ++c) mx = row[c] > mx ? row[c] : mx;
    if (mx == -INFINITY) {  // nothing allowed in this row yet
      for (int64_t c = 0; c < nk; ++c) row[c] = 0.f;
      continue;
    }
    const float alpha = exp_approx(m[r] - mx);
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < nk; ++c) {
      const float e = exp_approx(row[c] - mx);
      row[c] = e;
      sum += e;
    }
    l[r] = l[r] * alpha + sum;
    m[r] = mx;
    if (alpha != 1.f) {
      float* o = O + r * Dv;
#pragma omp simd
      for (int64_t d = 0; d < Dv; ++d) o[d] *= alpha;
    }
  }
}

HMLA_CLONES
void probs_from_lse_tile(float* S, int64_t nq, int64_t nk, const float* lse) {
  for (int64_t r = 0; r < nq; ++r) {
    float* row = S + r * nk;
    const float x = lse[r];
#pragma omp simd
    for (int64_t c = 0; c < nk; ++c) row[c] = exp_approx(row[c] - x);
  }
}

HMLA_CLONES
void dscores_tile(float* dP, const float* P, int64_t nq, int64_t nk, const float* D, float scale) {
  for (int64_t r = 0; r < nq; ++r) {
    float* ds = dP + r * nk;
    const float* pr = P + r * nk;
    const float d = D[r];
#pragma omp simd
    for (int64_t c = 0; c < nk; ++c) ds[c] = pr[c] * (ds[c] - d) * scale;
  }
}

}  // namespace hmla::cpu
