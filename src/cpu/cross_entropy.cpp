// The CPU's cross-entropy (hmla/ops/nn.h): per row the weighted loss w (lse - l[target]) and, when
// asked, its gradient w (softmax - onehot), which may be written over the logits themselves. Rows
// run in parallel; their losses are added in row order. Limits: logits finite (a NaN spreads).
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu_kernels.h"
#include "vexp.h"

namespace hmla::cpu {

namespace {

// Rows this wide or wider take the vector path; narrower ones keep the f64 exp of every run made
// before issue 44 (the demo's, the tests' and the HF fixtures' vocabularies are a few hundred), so
// their bits do not move. At a real vocabulary (DeepSeek's 129280) the two f64 exps per logit
// cost as much as the head's three products together; in f32 vectors they cost about a tenth.
constexpr int64_t kWideRow = 4096;
// The f32 exps of a wide row are summed in blocks of this many, each block's sum added in f64: a
// block's rounding is at most kSumBlock f32 ulps of its sum, whatever the vector width.
constexpr int64_t kSumBlock = 256;

// f64 exps, as before issue 44 (the bits of narrow rows). In place: l[v] is read before d[v].
double narrow_row(const float* l, float* d, int64_t V, int32_t t, float w) {
  float mx = l[0];
  for (int64_t v = 1; v < V; ++v) mx = std::max(mx, l[v]);
  double z = 0;
  for (int64_t v = 0; v < V; ++v) z += std::exp(double(l[v] - mx));
  const double lse = double(mx) + std::log(z);
  const double loss = double(w) * (lse - double(l[t]));
  if (d) {
    for (int64_t v = 0; v < V; ++v) d[v] = w * float(std::exp(double(l[v]) - lse));
    d[t] -= w;
  }
  return loss;
}

// f32 exps (exp_approx, < 2 ulp) over l - max <= 0, stored in d and summed; then d *= w / z. The
// file is compiled without trapping math (src/CMakeLists.txt), else GCC keeps exp_approx's
// selects as branches and these loops scalar.
HMLA_CLONES double wide_row(const float* l, float* d, int64_t V, int32_t t, float w) {
  const float mx = row_max(l, V), lt = l[t];  // l[t] before d, which may be l, is written
  double z = 0;
  for (int64_t v0 = 0; v0 < V; v0 += kSumBlock) {
    const int64_t n = std::min(kSumBlock, V - v0);
    const float* x = l + v0;
    float s = 0.f;
    if (d) {
      float* e = d + v0;
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < n; ++i) {
        const float ex = exp_approx(x[i] - mx);
        e[i] = ex;
        s += ex;
      }
    } else {
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < n; ++i) s += exp_approx(x[i] - mx);
    }
    z += double(s);
  }
  const double lse = double(mx) + std::log(z);
  if (d) {
    const float k = float(double(w) / z);
#pragma omp simd
    for (int64_t v = 0; v < V; ++v) d[v] *= k;
    d[t] -= w;
  }
  return double(w) * (lse - double(lt));
}

}  // namespace

void cross_entropy(const CrossEntropyParams& p) {
  const int64_t N = p.N, V = p.V;
  std::vector<double> row_loss(N, 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* l = p.logits + n * V;
    float* d = p.dlogits ? p.dlogits + n * V : nullptr;
    if (p.w[n] == 0.f) {
      if (d) std::fill(d, d + V, 0.f);
      continue;
    }
    row_loss[n] = V >= kWideRow ? wide_row(l, d, V, p.target[n], p.w[n]) : narrow_row(l, d, V, p.target[n], p.w[n]);
  }
  double sum = *p.acc;  // rows in order after what acc holds (chunks chain as one call)
  for (double x : row_loss) sum += x;
  *p.acc = sum;
}

}  // namespace hmla::cpu
