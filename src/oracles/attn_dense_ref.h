// Naive dense per-document causal attention with materialised scores, in any precision: the
// float64 instance is the oracle every kernel is tested against; the float32 instance measures
// the error a naive implementation makes in f32 (the STYLE.md tolerance rule).
#pragma once
#include <cstdint>
#include <vector>

namespace hmla::ref {

struct AttnDims {
  int64_t b, s, H, Hkv, Dqk, Dv;
};

template <class T>
struct AttnRefResult {
  std::vector<T> out;    // [b, s, H, Dv]
  std::vector<T> lse;    // [b, H, s] (+inf on empty rows)
  std::vector<T> dq;     // [b, s, H, Dqk]
  std::vector<T> dk;     // [b, s, Hkv, Dqk]
  std::vector<T> dv;     // [b, s, Hkv, Dv]
  std::vector<T> dsink;  // [H], empty without a sink
};

// All tensors contiguous. doc_start is [b, s] (DocLayout convention); sink is [H] or empty;
// dout [b, s, H, Dv] (empty: forward only). L = sum(out * dout) defines the gradients.
template <class T>
AttnRefResult<T> attn_dense_ref(const AttnDims& d, const std::vector<T>& q, const std::vector<T>& k,
                                const std::vector<T>& v, const std::vector<int32_t>& doc_start,
                                const std::vector<T>& sink, T scale, const std::vector<T>& dout);

}  // namespace hmla::ref
