// The CUDA backend's dense attention through cuDNN's fused SDPA (docs/cuda.md, "Dense attention
// through cuDNN"): packed documents as ragged (THD) sequences, one cuDNN sequence per document
// with a causal mask, bf16 in, f32 lse out, the deterministic backward. The graph code
// (attn_cudnn.cpp) exists only in a build with cudnn-frontend; the tables it runs on
// (attn_cudnn_thd.cu) are ordinary kernels, run by the emulator's tests too.
#pragma once
#include <cstdint>

#include "hmla/core/error.h"
#include "hmla/ops/attention.h"

namespace hmla::cuda {

// The ragged offset tables, one per tensor layout cuDNN reads or writes.
enum ThdLayout : int { kThdQ, kThdK, kThdV, kThdO, kThdDq, kThdDk, kThdDv, kThdStats, kThdLayouts };

// Device tables of the documents that hold a query row of p (all of them, unless p's queries
// are a context-parallel slice [q_row0, q_row0 + sq) of the key rows), in batch order (row by
// row, each row's in position order), padded with empty sequences to B entries: int32
// [kThdLayouts][B + 1] element offsets of each document's first row in each layout (entry B and
// the padding entries: the end of the last document), int32 [B] its query rows in the slice, int32
// [B] its key rows up to the slice's last query row. The query-side layouts (q, out, dq, stats)
// take the document's first row in the slice (local), the key-side ones (k, v, dk, dv) its first
// row. Stats is cuDNN's [b sq, H] f32 lse; out, dq, dk and dv are contiguous. Needs B >= the
// documents of p's layout and every offset < 2^31.
void cudnn_thd_tables(const AttnDenseParams& p, int64_t B, int32_t* tables);
// lse [b, H, sq] from cuDNN's stats [b sq, H] (+inf for padding rows), and back.
void cudnn_stats_to_lse(const AttnDenseParams& p, const float* stats);
void cudnn_lse_to_stats(const AttnDenseParams& p, float* stats);
// Zeroes the rows of x (bf16, contiguous) that no sequence covers, which cuDNN leaves unwritten
// and hmla's contract has 0: query side (x [b, sq, row_elems]: out, dq) the padding rows; key side
// (x [b, s, row_elems]: dk, dv) the keys no query of the slice sees.
void cudnn_zero_uncovered_rows(const AttnDenseParams& p, void* x, bool query_side, int64_t row_elems);
// The padded batch for n documents and the sequence bound for a longest document of n rows: the
// next power of two, so that a run's changing layouts build a few graphs, not one per step.
inline int64_t cudnn_pow2_bound(int64_t n) {
  int64_t B = 1;
  while (B < n) B *= 2;
  return B;
}

#ifdef HMLA_HAVE_CUDNN
// Why cuDNN's SDPA cannot compute p on this device (nullptr: it may; its graph build decides).
const char* cudnn_declines(const AttnDenseParams& p);
// Computes p through cuDNN; false (nothing done) when cuDNN refused p's graph and p.backend is
// auto_ (an error for cudnn), so that the caller runs hmla's kernels.
bool cudnn_attn_fwd(const AttnDenseParams& p);
bool cudnn_attn_bwd(const AttnDenseParams& p);
#endif

// Why cuDNN cannot compute p here, in any build (nullptr: it may): the dense attention's plan
// (attn_dense_fwd.cu) asks it.
inline const char* attn_cudnn_declines(const AttnDenseParams& p) {
#ifdef HMLA_HAVE_CUDNN
  return cudnn_declines(p);
#else
  return "this build has no cuDNN path (cudnn-frontend's headers were not found when it was configured: "
         "scripts/deps.sh installs them)";
#endif
}

}  // namespace hmla::cuda
