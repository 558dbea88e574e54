// The compressed entries a query of DeepSeek-V4's attention sees, on the device (the CPU's
// src/cpu/entry_range.h; include/hmla/ops/compressed_attention.h's metadata contract: a batch row's
// entries sorted by document, then by last row, unused slots, ent_doc -1, last). Shared by the
// compressed attention and the CSA indexer's selection.
#pragma once
#include <cstdint>

namespace hmla::cuda {

// First i in [lo, hi) with a[i] > v (a non-decreasing there), or with a[i] >= v (entry_lower).
__device__ inline int64_t entry_upper(const int32_t* a, int64_t lo, int64_t hi, int32_t v) {
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (a[mid] <= v) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}
__device__ inline int64_t entry_lower(const int32_t* a, int64_t lo, int64_t hi, int32_t v) {
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (a[mid] < v) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// [lo, hi): the entries of one batch row (doc, last: its n_e slots of ent_doc, ent_last) in the
// document starting at st whose window ends at or before row t. Binary searches, no table.
__device__ inline void visible_entries(const int32_t* doc, const int32_t* last, int64_t n_e, int64_t st, int64_t t,
                                       int64_t& lo, int64_t& hi) {
  int64_t used = 0, end = n_e;  // unused slots (ent_doc -1) end the row
  while (used < end) {
    const int64_t mid = (used + end) / 2;
    if (doc[mid] != -1) used = mid + 1;
    else end = mid;
  }
  lo = entry_lower(doc, 0, used, int32_t(st));
  const int64_t doc_hi = entry_upper(doc, lo, used, int32_t(st));
  hi = entry_upper(last, lo, doc_hi, int32_t(t));
}

}  // namespace hmla::cuda
