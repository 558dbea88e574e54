// DeepSeek-V4's attention core (DESIGN.md section 10, docs/v4_attention.md): one shared K = V head
// of width d for all H query heads, over the sliding window of the query's document, the visible
// compressed entries and a per-head sink. Letters: b batch, s rows, H heads, d head width, n_e
// entries per batch row, k selected slots per query, W sliding window.
//
// Context parallelism (DESIGN.md section 8): q may hold the sq query rows [q_row0, q_row0 + sq) of
// the layout's s rows (q_row0 = 0, sq = s: every row); kv, ent and their gradients always cover all
// s rows and n_e entries, and out, lse, dout, dq and idx the sq query rows. Positions t below are
// global (the layout's).
//
// Query row t of document [st, en) (the layout's doc_start / doc_end), per head h:
//   window keys  u with max(st, t - W + 1) <= u <= t       (kv[u]: key and value)
//   entries      e with ent_doc[e] == st and ent_last[e] <= t (ent[e]: key and value); dense mode:
//                every one of them; selected mode: those among idx[t, 0..k) (-1 and any index
//                outside [0, n_e) are no entry, a repeated index counts once, an invisible one is
//                ignored: transformers' mask)
//   z_j = scale * q_h(t) . key_j,  out_h(t) = sum_j e^{z_j} key_j / (sum_j e^{z_j} + e^{sink_h}),
//   lse_h(t) = log(sum_j e^{z_j} + e^{sink_h}) (the sink is a raw logit, never scaled).
// Padding rows (doc_start > t): out = 0, lse = +inf, no gradient. The window always holds t, so no
// other row is empty. Entry metadata contract: a batch row's entries are its documents' entries in
// document order, each document's in window order (ent_doc non-decreasing, ent_last increasing
// within a document), as the compressor emits them, and a row with fewer entries than n_e ends in
// unused slots with ent_doc = -1 (no document); the visible entries of t are then one
// contiguous range, found per query by binary search (no [s, n_e] table exists anywhere). The
// entry points check the contract on host tensors; CUDA callers pass the compressor's own metadata.
// Backward: writes dq, dkv (the window keys' key and value gradients in one tensor), dent (the
// entries' likewise) and ADDS into dsink (a parameter's gradient: hmla/ops/nn.h's convention).
#pragma once
#include <cstdint>

#include "hmla/core/layout.h"
#include "hmla/core/tensor.h"

namespace hmla {

// The backends' params struct: pointers on the backend's device, filled and validated by the entry
// points below. Every tensor but q is contiguous.
struct AttnCompressedParams {
  DType dtype = DType::f32;  // of q, kv, ent, out, dout, dq, dkv, dent
  int64_t b = 0, s = 0, H = 0, d = 0;  // s: the layout's (kv's) rows
  int64_t sq = 0, q_row0 = 0;          // query rows and the global position of the first
  int64_t n_e = 0;     // entries per batch row (0: window and sink only)
  int64_t k = 0;       // selected slots per query; 0: dense mode (every visible entry)
  int64_t window = 0;  // W >= 1
  float scale = 0.f;   // on q . key only
  const void* q = nullptr;  // [b, sq, H, d], last dim contiguous
  int64_t q_bstride = 0, q_rstride = 0, q_hstride = 0;
  const void* kv = nullptr;             // [b, s, d]
  const void* ent = nullptr;            // [b, n_e, d] (null when n_e = 0)
  const int32_t* ent_last = nullptr;    // [b, n_e] row of the entry's window's last token
  const int32_t* ent_doc = nullptr;     // [b, n_e] start row of the entry's document; -1: unused slot
  const int32_t* idx = nullptr;         // [b, sq, k] entry indices, selected mode only
  const int32_t* doc_start = nullptr;   // [b, s]
  const int32_t* doc_end = nullptr;     // [b, s] exclusive
  const float* sink = nullptr;          // [H] or null
  void* out = nullptr;                  // [b, sq, H, d]
  float* lse = nullptr;                 // [b, H, sq] f32
  // Backward only.
  const void* dout = nullptr;  // [b, sq, H, d]
  void* dq = nullptr;          // [b, sq, H, d]
  void* dkv = nullptr;         // [b, s, d]
  void* dent = nullptr;        // [b, n_e, d] (null when n_e = 0)
  float* dsink = nullptr;      // [H] or null: added into
};

struct AttnCompressedInputs {
  Tensor q;         // [b, sq, H, d], last dim contiguous (normed and roped): rows [q_row0, q_row0 + sq)
  Tensor kv;        // [b, s, d] contiguous: window keys = values
  Tensor ent;       // [b, n_e, d] contiguous: compressed entries = values; undefined or n_e = 0: none
  Tensor ent_last;  // [b, n_e] i32
  Tensor ent_doc;   // [b, n_e] i32
  Tensor idx;       // [b, sq, k] i32 contiguous: selected mode; undefined: dense mode
  const DocLayout* layout = nullptr;
  Tensor sink;      // [H] f32, optional
  float scale = 0.f;
  int64_t window = 0;
  int64_t q_row0 = 0;  // global position of q's first row (q_row0 + sq <= s)
};

struct AttnCompressedSaved {
  Tensor out;  // [b, sq, H, d]
  Tensor lse;  // [b, H, sq] f32
};

struct AttnCompressedGrads {
  Tensor dq;     // [b, sq, H, d]
  Tensor dkv;    // [b, s, d]
  Tensor dent;   // [b, n_e, d], with entries
  Tensor dsink;  // [H] f32, with a sink
};

// The attention mass's sums (DeepSeek-V4's metrics; docs/v4_attention.md "Attention mass"): from a
// forward's lse and lse_ws, the same core's without entries (window + sink; lse itself where the
// layer has none), over the query rows with row_weight > 0 and every head, in f64:
//   sink = e^{sink_h - lse}, window = e^{lse_ws - lse} - sink, entries = 1 - e^{lse_ws - lse},
// their sums and the count of (row, head) pairs ADDED into acc [4] (window, entries, sink, pairs).
struct AttnMassParams {
  int64_t b = 0, sq = 0, H = 0;
  const float* lse = nullptr;         // [b, H, sq]
  const float* lse_ws = nullptr;      // [b, H, sq]
  const float* sink = nullptr;        // [H] or null (no sink: -inf)
  const float* row_weight = nullptr;  // [b, sq]
  double* acc = nullptr;              // [4], added into
};
void attn_compressed_mass(const Tensor& lse, const Tensor& lse_ws, const Tensor& sink, const Tensor& row_weight,
                          const Tensor& acc);

// Whether the inputs' device runs both passes on them (its plans): f32 on the CPU; f32 and bf16 on
// CUDA.
bool attn_compressed_supports(const AttnCompressedInputs& in);

AttnCompressedSaved attn_compressed_fwd(const AttnCompressedInputs& in);
void attn_compressed_fwd(const AttnCompressedInputs& in, const AttnCompressedSaved& saved);
// dsink: the given tensor (the sink's gradient added into it), else zeros.
AttnCompressedGrads attn_compressed_bwd(const AttnCompressedInputs& in, const AttnCompressedSaved& saved,
                                        const Tensor& dout, const Tensor& dsink = {});

}  // namespace hmla

// The family's backend entries (op_list.h).
#define HMLA_ATTN_COMPRESSED_PARAMS(X) X(AttnCompressedParams) X(AttnMassParams)
#define HMLA_ATTN_COMPRESSED_OPS(X)                   \
  X(void, attn_compressed_fwd, AttnCompressedParams)  \
  X(void, attn_compressed_bwd, AttnCompressedParams) \
  X(void, attn_compressed_mass, AttnMassParams)
