// Per-thread accumulators (for sums over rows that threads would otherwise race on) are added
// in thread order, so a result depends on the thread count but never on scheduling.
#pragma once
#include <cstdint>
#include <cstring>

namespace hmla::cpu {

// out[i] = sum_t partials[t * n + i] for t = 0 .. nthreads - 1, in that order.
inline void sum_thread_partials(float* out, const float* partials, int nthreads, int64_t n) {
  std::memcpy(out, partials, n * sizeof(float));
  for (int t = 1; t < nthreads; ++t) {
    const float* p = partials + t * n;
    for (int64_t i = 0; i < n; ++i) out[i] += p[i];
  }
}

// out[i] += that same sum (summed first, then added: the bits of a sum added into a gradient).
inline void add_thread_partials(float* out, const float* partials, int nthreads, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float s = partials[i];
    for (int t = 1; t < nthreads; ++t) s += partials[t * n + i];
    out[i] += s;
  }
}

}  // namespace hmla::cpu
