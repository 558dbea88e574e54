// What every op family's entry points share (src/ops): a tensor as an error message names it, and
// the dispatch on the one device of the call's tensors (hmla::dispatch, hmla::device_of).
#pragma once

#include <initializer_list>
#include <string>

#include "hmla/core/tensor.h"
#include "hmla/ops/backend.h"

namespace hmla {
struct DocLayout;
}

namespace hmla::detail {

inline std::string desc(const Tensor& t) {
  return t.defined() ? std::string(dtype_name(t.dtype())) + shape_str(t.shape()) + " on " + device_name(t.device())
                     : "undefined";
}

// hmla::dispatch of `entry` on the tensors' device; `why` ends the error when no plan takes p.
void run(const char* op, Op entry, const auto& p, std::initializer_list<const Tensor*> ts,
         const char* why = "these tensors") {
  dispatch(device_of(op, ts), entry, p, op, why);
}

// The compressed entries' metadata contract on host tensors (ent_doc, ent_last [b, n_e]; the
// compressed attention and the compressed indexer): what makes a query's visible entries one range.
// Throws LayoutError naming `op` and the first entry that breaks it.
void check_entry_metadata(const char* op, const int32_t* doc, const int32_t* last, const DocLayout& l, int64_t b,
                          int64_t n_e);

}  // namespace hmla::detail
