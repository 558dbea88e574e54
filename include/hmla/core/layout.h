// Document layouts of packed rows (DESIGN.md section 3). Per token t of row r: doc_start[r, t]
// and doc_end[r, t] (exclusive). The allowed key set of query t is A(t) = [doc_start[t], t];
// padding rows belong to no document and store doc_start = doc_end = t + 1, so A(t) is empty.
#pragma once
#include <cstdint>
#include <vector>

#include "hmla/core/tensor.h"

namespace hmla {

struct DocLayout {
  int64_t b = 0, s = 0;
  Tensor doc_start;  // [b, s] i32, on the host (what host code reads: is_padding, the counts)
  Tensor doc_end;    // [b, s] i32, exclusive, on the host
  // The same two tables on a device, when the caller uploaded them once (the training step's device
  // batch does, with the rest of the micro-batch); the ops read these instead of a copy per call.
  Tensor device_start, device_end;

  // doc_start / doc_end as a kernel on `dev` reads them: the device form when it is on dev, else
  // the host table (a copy for a device: a layout built per call, as hmla.torch's, is uploaded
  // per op).
  Tensor doc_start_on(Device dev) const { return on(doc_start, device_start, dev); }
  Tensor doc_end_on(Device dev) const { return on(doc_end, device_end, dev); }

  bool is_padding(int64_t r, int64_t t) const { return doc_start.data<int32_t>()[r * s + t] > t; }
  int64_t num_docs() const;        // documents over all rows
  int64_t allowed_pairs() const;   // sum over rows of |A(t)|
  int64_t valid_rows() const;      // rows with a non-empty A(t)

 private:
  static Tensor on(const Tensor& host, const Tensor& dev_form, Device dev) {
    return dev_form.defined() && dev_form.device() == dev ? dev_form : host.on(dev);
  }
};

// One causal document per row: A(t) = [0, t].
DocLayout layout_causal(int64_t b, int64_t s);

// cu_seqlens per row: document starts, then the end of the last document (rows from there up
// to s are tail padding). Starts at 0, non-decreasing (equal entries: a zero-length document),
// last entry <= s.
DocLayout layout_from_cu_seqlens(int64_t s, const std::vector<std::vector<int64_t>>& cu_seqlens);

// Per-token end rows, [b, s] row-major (flashmask convention): entry t is the exclusive end row
// of t's document; end_row[t] <= t marks padding. Every row of a document carries the same end.
DocLayout layout_from_end_rows(int64_t b, int64_t s, const std::vector<int64_t>& end_rows);

// EOS separators over token ids [b, s]: each EOS ends (and belongs to) its document; the
// trailing run of pad tokens after the last document is tail padding; a final document without
// EOS is still a document. pad_id may equal eos_id.
DocLayout layout_from_eos(int64_t b, int64_t s, const std::vector<int64_t>& token_ids,
                          int64_t eos_id, int64_t pad_id);

}  // namespace hmla
