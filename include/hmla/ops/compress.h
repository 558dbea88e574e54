// DeepSeek-V4's compressor pooling as ops (DESIGN.md section 10; docs/deepseek_v4_math.md sections
// 5-6; docs/deepseek_v4.md "Compressor"): the gated per-channel softmax pooling that turns a
// document's windows of m tokens into compressed entries. The projections before it (wkv, wgate)
// and the RMSNorm and RoPE after it are the nn ops; this family is the pooling between them.
//
// Entries. Per batch row, each document [st, en) is cut into windows of m tokens from its start;
// its trailing partial window has no entry. The row's entries list its documents' windows in
// order; entry e has the row position of its window's first token, first[e] (compressed_entries
// builds the list from a DocLayout). Entry e is visible to query t of the same document iff
// first[e] + m - 1 <= t.
//
// Pooling of entry e, channel c of width W (z = gate + ape, a per-channel softmax over the slots):
// - HCA (overlap false; kv and gate are [b, s, W]): slots j = 0 .. m-1 are the tokens
//   first + j with z = gate[first + j, c] + ape[j, c];
// - CSA (overlap true; kv and gate are [b, s, 2W]): slots 0 .. m-1 are channels [0, W) of the
//   previous window's tokens first - m + j (z = gate[.., c] + ape[j, c]), absent (weight 0) for a
//   document's first window; slots m .. 2m-1 are channels [W, 2W) of the window's own tokens
//   first + j (z = gate[.., W + c] + ape[j, W + c]).
// out[e, c] = sum over the slots of softmax(z)_slot kv_slot. Backward (dout given): with
// alpha = softmax(z), dkv_slot = alpha_slot dout and dz_slot = alpha_slot (kv_slot - out) dout;
// dgate = dz, written (0 where no slot reads the element: tokens past a document's last full
// window, and CSA's a-channels of a document's last window); dape[j] += the sum of dz over the
// entries, in entry order (rows in order).
#pragma once
#include <cstdint>

#include "hmla/core/layout.h"
#include "hmla/core/tensor.h"

namespace hmla {

struct CompressParams {
  int64_t b = 0, s = 0, W = 0, m = 0, n = 0;  // n: entries per row (the longest row's; shorter rows pad)
  bool overlap = false;                       // CSA's two series
  const float* kv = nullptr;                  // [b, s, C] contiguous, C = W (HCA) or 2W (CSA)
  const float* gate = nullptr;                // [b, s, C] contiguous
  const float* ape = nullptr;                 // [m, C]
  const int32_t* first = nullptr;             // [b, n]: the entry's first token, -1 for padding
  const int32_t* doc_start = nullptr;         // [b, s]: the layout's (CSA: is there a previous window?)
  float* out = nullptr;                       // [b, n, W] (padding entries: 0)
  // Backward only.
  const float* dout = nullptr;  // [b, n, W]
  float* dkv = nullptr;         // [b, s, C], written
  float* dgate = nullptr;       // [b, s, C], written
  float* dape = nullptr;        // [m, C], added into
};

// The entries of every row of `layout` for windows of m tokens: first [b, n] i32 on the host (-1
// pads rows with fewer), n the longest row's count (0 when no document has a full window).
struct CompressedEntries {
  Tensor first;  // [b, n] i32 on the host
  int64_t n = 0;
  // The same list on a device, when the caller uploaded it once (the training step's batch does);
  // the ops read it instead of a copy per call (first_on).
  Tensor device_first;
  Tensor first_on(Device dev) const {
    return device_first.defined() && device_first.device() == dev ? device_first : first.on(dev);
  }
};
CompressedEntries compressed_entries(const DocLayout& layout, int64_t m);

// kv, gate [b, s, C] f32 contiguous (C = W, or 2W with overlap), ape [m, C] f32, e.first [b, n];
// out [b, n, W] f32 contiguous, written.
void compress_fwd(const Tensor& kv, const Tensor& gate, const Tensor& ape, const CompressedEntries& e,
                  const DocLayout& layout, bool overlap, const Tensor& out);
// dkv, dgate [b, s, C] written; dape [m, C] added into.
void compress_bwd(const Tensor& dout, const Tensor& kv, const Tensor& gate, const Tensor& ape, const CompressedEntries& e,
                  const DocLayout& layout, bool overlap, const Tensor& dkv, const Tensor& dgate, const Tensor& dape);

}  // namespace hmla

#define HMLA_COMPRESS_PARAMS(X) X(CompressParams)
#define HMLA_COMPRESS_OPS(X)          \
  X(void, compress_fwd, CompressParams) \
  X(void, compress_bwd, CompressParams)
