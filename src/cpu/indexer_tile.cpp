// The CPU indexer's score tiles (indexer_tile.h): one product for a query tile's index heads,
// then the weighted relu sum per query row; shared by top-k and both KLs.
#include "indexer_tile.h"

#include <cmath>

#include "cpu_kernels.h"
#include "vexp.h"


namespace hmla::cpu {

void indexer_score_tile(const float* qI, const float* kI, const float* w, int64_t nq, int64_t nk,
                        int64_t HI, int64_t DI, float* S, float* I) {
  sgemm(Trans::no, Trans::yes, nq * HI, nk, DI, 1.f, qI, DI, kI, DI, 0.f, S, nk);
  relu_head_sum(S, w, nq, HI, nk, I);
}

HMLA_CLONES
void relu_head_sum(const float* S, const float* w, int64_t nq, int64_t HI, int64_t nk, float* I) {
  for (int64_t r = 0; r < nq; ++r) {
    float* out = I + r * nk;
    for (int64_t c = 0; c < nk; ++c) out[c] = 0.f;
    for (int64_t h = 0; h < HI; ++h) {
      const float wh = w[r * HI + h];
      const float* s = S + (r * HI + h) * nk;
#pragma omp simd
      for (int64_t c = 0; c < nk; ++c) out[c] += wh * (s[c] > 0.f ? s[c] : 0.f);
    }
  }
}

HMLA_CLONES
void relu_head_sum_bwd(const float* S, const float* w, const float* dI, int64_t nq, int64_t HI, int64_t nk,
                       float* dS, float* dw) {
  for (int64_t r = 0; r < nq; ++r) {
    const float* g = dI + r * nk;
    for (int64_t h = 0; h < HI; ++h) {
      const float wh = w[r * HI + h];
      const float* s = S + (r * HI + h) * nk;
      float* ds = dS + (r * HI + h) * nk;
      float acc = 0.f;
#pragma omp simd reduction(+ : acc)
      for (int64_t c = 0; c < nk; ++c) {
        const bool pos = s[c] > 0.f;
        ds[c] = pos ? g[c] * wh : 0.f;
        acc += pos ? g[c] * s[c] : 0.f;
      }
      dw[r * HI + h] += acc;
    }
  }
}

HMLA_CLONES
void accumulate_probs(const float* L, int64_t nq, int64_t nk, const float* lse, float* P) {
  for (int64_t r = 0; r < nq; ++r) {
    const float* l = L + r * nk;
    float* p = P + r * nk;
    const float x = lse[r];
#pragma omp simd
    for (int64_t c = 0; c < nk; ++c) p[c] += exp_approx(l[c] - x);
  }
}

void kl_tile(const float* P, const float* I, int64_t nq, int64_t nk, const float* lseI, const float* g,
             float* kl, float* dI) {
  for (int64_t r = 0; r < nq; ++r) {
    const float* p = P + r * nk;
    const float* i = I + r * nk;
    float* d = dI + r * nk;
    float acc = 0.f;
    for (int64_t c = 0; c < nk; ++c) {
      const float logq = i[c] - lseI[r];  // -inf for masked keys
      const float q = exp_approx(logq);
      if (p[c] > 0.f) acc += p[c] * (std::log(p[c]) - logq);
      d[c] = g[r] * (q - p[c]);
    }
    kl[r] += acc;
  }
}

}  // namespace hmla::cpu
