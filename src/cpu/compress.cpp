// DeepSeek-V4's compressor pooling on the CPU (hmla/ops/compress.h): one entry's channel at a
// time, its slots in order (the max, then the exponentials' sum, then the weighted sum), so each
// output is one thread's fixed sequence of operations. The backward writes each dkv / dgate
// element from the one slot that reads it, then sums dape over the entries in order, one thread
// per (slot, channel) column.
#include <cmath>
#include <limits>
#include <vector>

#include "cpu_kernels.h"

namespace hmla::cpu {

namespace {

// Entry (r, e)'s slots in channel c: slot i reads kv/gate at flat offset off[i] and ape at
// ape_off[i]; count = m (HCA), 2m (CSA), or m for a CSA entry without a previous window (its
// a-slots weigh 0: they are left out, which is the softmax with gate -inf).
struct Slots {
  int64_t count = 0;
  std::vector<int64_t> off, ape_off;
};

void slots_of(const CompressParams& p, int64_t r, int64_t first, int64_t c, Slots& sl) {
  const int64_t C = p.overlap ? 2 * p.W : p.W, m = p.m;
  sl.off.resize(size_t(2 * m)), sl.ape_off.resize(size_t(2 * m));
  sl.count = 0;
  auto add = [&](int64_t token, int64_t ch, int64_t j) {
    sl.off[size_t(sl.count)] = (r * p.s + token) * C + ch;
    sl.ape_off[size_t(sl.count)] = j * C + ch;
    ++sl.count;
  };
  if (!p.overlap) {
    for (int64_t j = 0; j < m; ++j) add(first + j, c, j);
    return;
  }
  if (first - m >= p.doc_start[r * p.s + first])  // a previous window in the same document
    for (int64_t j = 0; j < m; ++j) add(first - m + j, c, j);
  for (int64_t j = 0; j < m; ++j) add(first + j, p.W + c, j);
}

// alpha (count values) = softmax of the slots' gate + ape; returns the pooled value.
float pool(const CompressParams& p, const Slots& sl, float* alpha) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < sl.count; ++i) {
    alpha[i] = p.gate[sl.off[size_t(i)]] + p.ape[sl.ape_off[size_t(i)]];
    mx = std::max(mx, alpha[i]);
  }
  float sum = 0.f;
  for (int64_t i = 0; i < sl.count; ++i) sum += alpha[i] = std::exp(alpha[i] - mx);
  float out = 0.f;
  for (int64_t i = 0; i < sl.count; ++i) out += (alpha[i] /= sum) * p.kv[sl.off[size_t(i)]];
  return out;
}

}  // namespace

void compress_fwd(const CompressParams& p) {
#pragma omp parallel
  {
    Slots sl;
    std::vector<float> alpha(size_t(2 * p.m));
#pragma omp for schedule(static)
    for (int64_t re = 0; re < p.b * p.n; ++re) {
      const int64_t r = re / p.n, first = p.first[re];
      float* out = p.out + re * p.W;
      for (int64_t c = 0; c < p.W; ++c) {
        if (first < 0) {
          out[c] = 0.f;
          continue;
        }
        slots_of(p, r, first, c, sl);
        out[c] = pool(p, sl, alpha.data());
      }
    }
  }
}

void compress_bwd(const CompressParams& p) {
  const int64_t C = p.overlap ? 2 * p.W : p.W, total = p.b * p.s * C;
  for (int64_t i = 0; i < total; ++i) p.dkv[i] = p.dgate[i] = 0.f;
#pragma omp parallel
  {
    Slots sl;
    std::vector<float> alpha(size_t(2 * p.m));
#pragma omp for schedule(static)
    for (int64_t re = 0; re < p.b * p.n; ++re) {
      const int64_t r = re / p.n, first = p.first[re];
      if (first < 0) continue;
      for (int64_t c = 0; c < p.W; ++c) {
        slots_of(p, r, first, c, sl);
        const float out = pool(p, sl, alpha.data()), d = p.dout[re * p.W + c];
        for (int64_t i = 0; i < sl.count; ++i) {  // each element is one slot of one entry
          const int64_t o = sl.off[size_t(i)];
          p.dkv[o] = alpha[i] * d;
          p.dgate[o] = alpha[i] * (p.kv[o] - out) * d;
        }
      }
    }
  }
  // dape[j, ch] += sum over the entries (rows, then entries, in order) of the dz its slot j took.
#pragma omp parallel for schedule(static)
  for (int64_t col = 0; col < p.m * C; ++col) {
    const int64_t j = col / C, ch = col % C;
    float acc = 0.f;
    for (int64_t re = 0; re < p.b * p.n; ++re) {
      const int64_t r = re / p.n, first = p.first[re];
      if (first < 0) continue;
      int64_t token = first + j;  // HCA, and CSA's b-series (channels [W, 2W))
      if (p.overlap && ch < p.W) {  // CSA's a-series: the previous window's tokens, if any
        if (first - p.m < p.doc_start[r * p.s + first]) continue;
        token = first - p.m + j;
      }
      acc += p.dgate[(r * p.s + token) * C + ch];
    }
    p.dape[col] += acc;
  }
}

// The CPU's plan: f32 throughout (the params carry no dtype), any sizes.
Plan plan(Op, const CompressParams&) { return {Variant::cpu, {}}; }

}  // namespace hmla::cpu
