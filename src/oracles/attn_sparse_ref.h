// Naive sparse latent MQA attention: per row, per head, loops over the listed keys.
#pragma once
#include <cstdint>
#include <vector>

namespace hmla::ref {

struct SparseDims {
  int64_t b, s, H, Dqk, Dv, KW, K;
};

template <class T>
struct SparseRefResult {
  std::vector<T> out, lse, lse_c, dq, dkv, dsink;
};

// q [b, s, H, Dqk], kv [b, s, Dqk], idx [b, s, KW]; sink [H] or empty; dout [b, s, H, Dv] or empty.
template <class T>
SparseRefResult<T> attn_sparse_ref(const SparseDims& d, const std::vector<T>& q, const std::vector<T>& kv,
                                   const std::vector<int32_t>& idx, const std::vector<T>& sink, T scale,
                                   const std::vector<T>& dout);

}  // namespace hmla::ref
