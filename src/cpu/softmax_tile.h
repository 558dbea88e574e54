// Element-wise passes over [nq, nk] score tiles (row stride nk) of the dense attention kernels.
// Compiled twice (AVX-512 and the x86-64-v3 baseline) and picked at load time for the CPU.
#pragma once
#include <cstdint>

namespace hmla::cpu {

// Forward, one key tile of the online softmax: per row r, m[r] = max(m[r], max_c S), S = exp(S -
// m[r]), l[r] = l[r] * alpha + sum_c S, O[r] *= alpha (alpha = exp(m_old - m_new)). Rows with no
// allowed key so far (all -inf) get S = 0 and keep m = -inf, l = 0.
void softmax_online_tile(float* S, int64_t nq, int64_t nk, float* m, float* l, float* O, int64_t Dv);

// Backward: P = exp(S - lse[r]) in place (lse = +inf on empty rows gives P = 0).
void probs_from_lse_tile(float* S, int64_t nq, int64_t nk, const float* lse);

// Backward: dP = P * (dP - D[r]) * scale in place.
void dscores_tile(float* dP, const float* P, int64_t nq, int64_t nk, const float* D, float scale);

}  // namespace hmla::cpu
