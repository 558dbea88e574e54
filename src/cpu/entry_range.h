// The compressed entries a query of DeepSeek-V4's attention sees (include/hmla/ops/compressed_attention.h's
// metadata contract: a batch row's entries sorted by document, then by last row, unused slots,
// ent_doc -1, last), shared by the compressed attention and the CSA indexer's selection.
#pragma once
#include <algorithm>
#include <cstdint>

namespace hmla::cpu {

// [lo, hi): the entries of one batch row (doc, last: its n_e slots of ent_doc, ent_last) in the
// document starting at st whose window ends at or before row t. Binary searches, no table.
inline void visible_entries(const int32_t* doc, const int32_t* last, int64_t n_e, int64_t st, int64_t t, int64_t& lo,
                            int64_t& hi) {
  const int64_t used = std::partition_point(doc, doc + n_e, [](int32_t v) { return v != -1; }) - doc;
  lo = std::lower_bound(doc, doc + used, int32_t(st)) - doc;
  const int64_t doc_hi = std::upper_bound(doc + lo, doc + used, int32_t(st)) - doc;
  hi = std::upper_bound(last + lo, last + doc_hi, int32_t(t)) - last;
}

}  // namespace hmla::cpu
