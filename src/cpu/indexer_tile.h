// Tiles of the lightning indexer on the CPU, shared by top-k and the KL losses. A score tile
// stacks a query tile's index heads: S [nq * HI, nk] = qI (nq * HI x DI) kI^T, one product, then
// I [nq, nk] = sum_h w[r, h] relu(S[r * HI + h, :]).
#pragma once
#include <cstdint>

namespace hmla::cpu {

struct IndexerCpuTraits {
  // 32 query rows x 64 index heads x 128 keys of f32 = 1 MiB of S: one product of M = 2048,
  // N = 128, K = DI, sized to stay in a 2 MiB L2 with its kI tile.
  static constexpr int64_t kBq = 32;
  static constexpr int64_t kBk = 128;
};

// S and I as above; qI rows [nq, HI, DI] and kI rows [nk, DI] contiguous (ld DI).
void indexer_score_tile(const float* qI, const float* kI, const float* w, int64_t nq, int64_t nk,
                        int64_t HI, int64_t DI, float* S, float* I);

// I[r, c] = sum_h w[r, h] relu(S[r * HI + h, c]).
void relu_head_sum(const float* S, const float* w, int64_t nq, int64_t HI, int64_t nk, float* I);

// Backward of relu_head_sum: dS[r * HI + h, c] = dI[r, c] w[r, h] [S > 0] (overwrite),
// dw[r, h] += sum_c dI[r, c] relu(S[r * HI + h, c]).
void relu_head_sum_bwd(const float* S, const float* w, const float* dI, int64_t nq, int64_t HI, int64_t nk,
                       float* dS, float* dw);

// P[r, c] += exp(L[r, c] - lse[r]) (masked logits are -inf and add 0).
void accumulate_probs(const float* L, int64_t nq, int64_t nk, const float* lse, float* P);

// Per element of a KL tile with g[r] = coeff * rw[r]: Q = exp(I - lseI[r]);
// kl[r] += P (log P - (I - lseI)) (0 where P = 0); dI = g[r] (Q - P). Rows with g = 0 still add
// their kl (for logging) and get dI = 0.
void kl_tile(const float* P, const float* I, int64_t nq, int64_t nk, const float* lseI, const float* g,
             float* kl, float* dI);

}  // namespace hmla::cpu
