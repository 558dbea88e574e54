// The bytes expert parallelism moves (DESIGN.md section 8): what one rank sends by all-to-all for
// one MoE layer, under balanced routing. `hmla plan` prints it; the EP implementation's tests and
// `hmla bench ep` assert the bytes they see on the wire against these functions (issue 47), so
// the count is written once, here. Rows only: the counts exchanged before them (one integer per
// destination rank) are not included.
#pragma once
#include <cstdint>

#include "hmla/core/size_check.h"

namespace hmla {

// Of a rank's `tokens` x k expert choices, the rows that leave it for another of the ep ranks when
// routing is balanced (each rank's experts receive tokens x k / ep of them, its own included): the
// floor of tokens x k x (ep - 1) / ep, exact when ep divides tokens x k.
inline int64_t ep_rows_leaving(int64_t tokens, int64_t k, int64_t ep) {
  const int64_t choices = checked_product({{"tokens", tokens}, {"num_experts_per_tok", k}}, "the EP rows");
  return ep <= 1 ? 0 : choices / ep * (ep - 1) + choices % ep * (ep - 1) / ep;
}

// One MoE layer over one micro-batch (forward and backward), from one rank: the forward's dispatch
// (its rows to their experts) and combine (the experts' outputs back), and the backward's two
// exchanges of the same rows (the outputs' gradients out, the inputs' gradients back): 2
// directions x 2 passes x ep_rows_leaving x hidden x elem_bytes (the compute dtype's size).
inline int64_t ep_all_to_all_bytes(int64_t tokens, int64_t k, int64_t hidden, int64_t elem_bytes, int64_t ep) {
  return checked_product({{"exchanges", 4},
                          {"rows leaving", ep_rows_leaving(tokens, k, ep)},
                          {"hidden_size", hidden},
                          {"bytes per value", elem_bytes}},
                         "the EP all-to-all bytes");
}

}  // namespace hmla
