// The MoE ops on the CPU (hmla/ops/moe.h): the router per token (its own thread, a fixed order of
// comparisons and sums), the dispatch as one stable counting sort, and the row gathers, combines
// and dots, each output row by one thread. f32 throughout, as transformers' router computes it.
// The experts' grouped products are linear_fwd's / linear_bwd's products expert after expert.
#include <cmath>
#include <vector>

#include "cpu_kernels.h"

namespace hmla::cpu {

namespace {

// a ranks before b: larger value, or equal value and smaller index (docs/moe.md's tie rule).
inline bool before(float va, int64_t a, float vb, int64_t b) { return va > vb || (va == vb && a < b); }

float sigmoid(float u) { return 1.f / (1.f + std::exp(-u)); }

// torch's softplus (beta 1, threshold 20): u itself above the threshold.
float softplus(float u) { return u > 20.f ? u : std::log1p(std::exp(u)); }

float score_of(MoeScore f, float u) { return f == MoeScore::sigmoid ? sigmoid(u) : std::sqrt(softplus(u)); }

// ds/du at the logit u whose score is s: s (1 - s) for sigmoid; softplus'(u) / 2s for
// sqrt(softplus(u)) (softplus' = sigmoid(u), 1 above the threshold), 0 where s underflowed to 0.
float dscore(MoeScore f, float u, float s) {
  if (f == MoeScore::sigmoid) return s * (1.f - s);
  return s > 0.f ? (u > 20.f ? 1.f : sigmoid(u)) / (2.f * s) : 0.f;
}

// The normaliser of a token's chosen scores, summed in slot order (as the forward and the
// backward both form it).
float denominator(const float* s, int64_t k) {
  float sum = 0.f;
  for (int64_t j = 0; j < k; ++j) sum += s[j];
  return sum + 1e-20f;
}

// Token t's scores at its chosen experts and their gating weights.
void weigh(const MoeRouteParams& p, const float* s, int64_t t) {
  const int64_t k = p.k;
  const int32_t* idx = p.idx + t * k;
  float* sc = p.score + t * k;
  float* w = p.weight + t * k;
  for (int64_t j = 0; j < k; ++j) sc[j] = s[idx[j]];
  const float den = p.norm_topk_prob ? denominator(sc, k) : 1.f;
  for (int64_t j = 0; j < k; ++j) w[j] = (p.norm_topk_prob ? sc[j] / den : sc[j]) * p.scaling;
}

}  // namespace

void moe_route_fwd(const MoeRouteParams& p) {
  const int64_t E = p.E, k = p.k, G = p.n_group, per = E / G;
#pragma omp parallel
  {
    std::vector<float> s(E), c(E), gscore(G);
    std::vector<char> keep(G);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < p.N; ++t) {
      const float* u = p.logits + t * E;
      for (int64_t e = 0; e < E; ++e) {
        s[e] = score_of(p.score_fn, u[e]);
        c[e] = p.bias ? s[e] + p.bias[e] : s[e];
      }
      int32_t* idx = p.idx + t * k;
      if (p.fixed) {  // hash routing: the experts are given
        for (int64_t j = 0; j < k; ++j) idx[j] = p.fixed[t * k + j];
        weigh(p, s.data(), t);
        continue;
      }
      // A group's score: its largest choice value plus its second largest.
      for (int64_t g = 0; g < G; ++g) {
        int64_t b1 = -1, b2 = -1;
        for (int64_t e = g * per; e < (g + 1) * per; ++e) {
          if (b1 < 0 || before(c[e], e, c[b1], b1)) {
            b2 = b1, b1 = e;
          } else if (b2 < 0 || before(c[e], e, c[b2], b2)) {
            b2 = e;
          }
        }
        gscore[g] = c[b1] + c[b2];
        keep[g] = 0;
      }
      for (int64_t r = 0; r < p.topk_group; ++r) {  // the best topk_group groups
        int64_t best = G;  // none yet (topk_group <= n_group: one is always left)
        for (int64_t g = 0; g < G; ++g)
          if (!keep[g] && (best == G || before(gscore[g], g, gscore[best], best))) best = g;
        if (best < G) keep[best] = 1;
      }
      // The k experts of the kept groups by descending choice value (selection, k passes).
      for (int64_t j = 0; j < k; ++j) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; ++e) {
          if (!keep[e / per]) continue;
          bool taken = false;
          for (int64_t i = 0; i < j; ++i) taken |= idx[i] == e;
          if (!taken && (best < 0 || before(c[e], e, c[best], best))) best = e;
        }
        idx[j] = int32_t(best);
      }
      weigh(p, s.data(), t);
    }
  }
}

// w_j = scaling s_j / D (D = sum_i s_i + 1e-20; D = 1 without normalisation and no second term):
// dL/ds_j = (scaling dw_j - sum_i dw_i w_i) / D, and du_j = dL/ds_j ds/du (dscore).
void moe_route_bwd(const MoeRouteParams& p) {
  const int64_t E = p.E, k = p.k;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < p.N; ++t) {
    float* du = p.dlogits + t * E;
    for (int64_t e = 0; e < E; ++e) du[e] = 0.f;
    const float* s = p.score_in + t * k;
    const float* dw = p.dweight + t * k;
    const int32_t* idx = p.idx_in + t * k;
    float den = 1.f, q = 0.f;
    if (p.norm_topk_prob) {
      den = denominator(s, k);
      for (int64_t i = 0; i < k; ++i) q += dw[i] * (s[i] / den * p.scaling);
    }
    for (int64_t j = 0; j < k; ++j) {
      const float ds = (p.scaling * dw[j] - q) / den;
      const float u = p.logits ? p.logits[t * E + idx[j]] : 0.f;
      du[idx[j]] = ds * dscore(p.score_fn, u, s[j]);
    }
  }
}

void moe_dispatch(const MoeDispatchParams& p) {
  const int64_t slots = p.N * p.k;
  for (int64_t e = 0; e <= p.E; ++e) p.offsets[e] = 0;
  for (int64_t i = 0; i < slots; ++i) ++p.offsets[p.idx[i] + 1];
  for (int64_t e = 0; e < p.E; ++e) p.offsets[e + 1] += p.offsets[e];
  std::vector<int32_t> next(p.offsets, p.offsets + p.E);
  for (int64_t i = 0; i < slots; ++i) {  // slots ascending: each expert's rows in token order
    const int32_t r = next[p.idx[i]]++;
    p.order[r] = int32_t(i);
    p.pos[i] = r;
  }
}

void moe_gather(const MoeRowsParams& p) {
  const int64_t slots = p.N * p.k, D = p.D;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < slots; ++i) {
    const int64_t slot = p.order[i], r = p.from_tokens ? slot / p.k : i;
    const float* src = static_cast<const float*>(p.src) + r * p.ld_src;
    float* out = p.out + i * p.ld_out;
    const float w = p.w ? p.w[slot] : 1.f;
    if (p.w)
      for (int64_t d = 0; d < D; ++d) out[d] = src[d] * w;
    else
      for (int64_t d = 0; d < D; ++d) out[d] = src[d];
  }
}

void moe_combine(const MoeRowsParams& p) {
  const int64_t D = p.D, k = p.k;
#pragma omp parallel
  {
    std::vector<float> acc(D);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < p.N; ++t) {
      for (int64_t d = 0; d < D; ++d) acc[d] = 0.f;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t slot = t * k + j;
        const float* src = static_cast<const float*>(p.src) + int64_t(p.pos[slot]) * p.ld_src;
        const float w = p.w ? p.w[slot] : 1.f;
        for (int64_t d = 0; d < D; ++d) acc[d] += w * src[d];
      }
      float* out = p.out + t * p.ld_out;
      for (int64_t d = 0; d < D; ++d) out[d] = p.accumulate ? out[d] + acc[d] : acc[d];
    }
  }
}

void moe_rowdot(const MoeRowsParams& p) {
  const int64_t slots = p.N * p.k, D = p.D;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < slots; ++i) {
    const float* a = static_cast<const float*>(p.a) + i * D;
    const float* b = static_cast<const float*>(p.b) + i * D;
    float sum = 0.f;
    for (int64_t d = 0; d < D; ++d) sum += a[d] * b[d];
    p.out[p.order[i]] = sum;
  }
}

// Expert e's rows [r0, r1) as linear_fwd (y = x W^T) and linear_bwd (dW += dy^T x, then dx = dy W
// + beta dx) fill their GemmParams for a contiguous slice, so the bits are a per-expert loop's.
void moe_grouped_fwd(const MoeGroupedParams& p) {
  for (int64_t e = 0; e < p.E; ++e) {
    const int64_t r0 = p.offsets[e], r1 = p.offsets[e + 1];
    if (r0 == r1) continue;  // no token chose it
    GemmParams g;
    g.ta = Trans::no, g.tb = Trans::yes;
    g.M = r1 - r0, g.N = p.out, g.K = p.in;
    g.a = static_cast<const float*>(p.x) + r0 * p.ld_x, g.lda = p.ld_x;
    g.b = p.W[e], g.ldb = p.in;
    g.c = static_cast<float*>(p.y) + r0 * p.ld_y, g.ldc = p.ld_y;
    gemm(g);
  }
}

void moe_grouped_bwd(const MoeGroupedParams& p) {
  for (int64_t e = 0; e < p.E; ++e) {
    const int64_t r0 = p.offsets[e], r1 = p.offsets[e + 1];
    if (r0 == r1) continue;
    const float* dy = static_cast<const float*>(p.y) + r0 * p.ld_y;
    GemmParams g;  // dW += dy^T x
    g.ta = Trans::yes, g.tb = Trans::no, g.beta = 1.f;
    g.M = p.out, g.N = p.in, g.K = r1 - r0;
    g.a = dy, g.lda = p.ld_y;
    g.b = static_cast<const float*>(p.x) + r0 * p.ld_x, g.ldb = p.ld_x;
    g.c = p.dW[e], g.ldc = p.in;
    gemm(g);
    if (!p.dx) continue;
    GemmParams q;  // dx = dy W (+ dx)
    q.M = r1 - r0, q.N = p.in, q.K = p.out, q.beta = p.dx_beta;
    q.a = dy, q.lda = p.ld_y;
    q.b = p.W[e], q.ldb = p.in;
    q.c = static_cast<float*>(p.dx) + r0 * p.ld_dx, q.ldc = p.ld_dx;
    gemm(q);
  }
}

// The CPU's plans (cpu_kernels.h): the routing and dispatch on any sizes; rows and products f32.
Plan plan(Op, const MoeRouteParams&) { return {Variant::cpu, {}}; }
Plan plan(Op, const MoeDispatchParams&) { return {Variant::cpu, {}}; }
Plan plan(Op, const MoeRowsParams& p) { return plan_if(f32(p.src_dtype) && f32(p.a_dtype) && f32(p.b_dtype), Variant::cpu); }
Plan plan(Op, const MoeGroupedParams& p) {
  return plan_if(f32(p.x_dtype) && f32(p.w_dtype) && f32(p.y_dtype) && f32(p.dx_dtype), Variant::cpu);
}

}  // namespace hmla::cpu
