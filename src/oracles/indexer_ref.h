// Naive indexer oracles with materialised [b, s, s] tensors: scores I, brute-force selection by
// a full sort, and the KL with its gradients. The float64 instance is the reference; float32
// gives the naive error for the STYLE.md rule.
#pragma once
#include <cstdint>
#include <vector>

namespace hmla::ref {

struct IndexerDims {
  int64_t b, s, HI, DI;
};

// I [b, s, s]; entries outside A(t) are -inf.
template <class T>
std::vector<T> indexer_scores_ref(const IndexerDims& d, const std::vector<T>& qI, const std::vector<T>& kI,
                                  const std::vector<T>& w, const std::vector<int32_t>& doc_start);

// [b, s, K + W] by sorting every row of R(t) completely.
std::vector<int32_t> indexer_topk_ref(const IndexerDims& d, const std::vector<double>& I,
                                      const std::vector<int32_t>& doc_start, int64_t K, int64_t W);

struct KlAttn {  // the attention side of the KL target
  int64_t H, Hkv, Dqk;
  double scale;
};

template <class T>
struct KlRefResult {
  double kl_sum = 0, loss = 0;
  std::vector<T> dqI, dkI, dw;
  std::vector<T> kl;  // [b, s] per row, without weight or coeff
};

// topk empty: dense KL over A(t); else the sparse KL over slots < K of topk [b, s, K + W].
// stored (null: exact) rounds what a low-precision kernel feeds its gradient products: dI before
// dw and dqI (dqI_h += stored(dI) w_h kI), and dS = stored(stored(dI) w_h) before dkI. With
// T = float and bf16 rounding it is the naive bf16 implementation of the STYLE.md rule for the
// tensor-core KL (tests/cuda/emu/test_mixed_dtype_emu.cpp).
template <class T>
KlRefResult<T> indexer_kl_ref(const IndexerDims& d, const KlAttn& a, const std::vector<T>& q,
                              const std::vector<T>& k, const std::vector<T>& qI, const std::vector<T>& kI,
                              const std::vector<T>& w, const std::vector<int32_t>& doc_start,
                              const std::vector<T>& row_weight, T coeff, const std::vector<int32_t>& topk,
                              int64_t K, T (*stored)(T) = nullptr);

}  // namespace hmla::ref
