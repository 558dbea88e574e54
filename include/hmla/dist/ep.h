// Expert parallelism's exchange (DESIGN.md section 8; docs/scale_out.md "Expert parallelism"): the
// routed experts of a MoE layer are split over the R ranks of an expert-parallel group in
// contiguous blocks of E / R (rank q owns experts [q E / R, (q + 1) E / R)). A rank's expert rows,
// grouped by expert in ascending order (moe_dispatch's slot order), are then grouped by owner too,
// so each owner's share is one contiguous block: it travels by one all-to-all (the counts first,
// then the rows). An owner receives, for each of its experts, every rank's rows for it in rank
// order (expert-major: the order its grouped products read), and the results travel back by the
// inverse exchange into the sender's own order, so a token's combine adds its experts' outputs in
// the order it would with one rank.
//
// The counts are host vectors: on a GPU the caller reads the dispatch's per-expert counts back once
// per layer (an all-to-all's sizes must be known to post it). Rows are f32 or bf16, contiguous,
// on any device (CUDA rows through NCCL).
#pragma once
#include <cstdint>
#include <vector>

#include "hmla/core/tensor.h"
#include "hmla/dist/comm.h"

namespace hmla {

struct EpPlan {
  int R = 1, rank = 0;
  int64_t E = 0, E_local = 0;      // experts in all, per rank
  std::vector<int64_t> sent;       // [R * E_local]: rows this rank sends to rank q's j-th expert (q-major)
  std::vector<int64_t> received;   // [R * E_local]: rows rank q sends to this rank's j-th expert (q-major)
  int64_t rows_sent() const;       // sum of sent (this rank's own share included)
  int64_t rows_received() const;   // sum of received
  // Rows of each of this rank's experts [E_local] over every sender: its grouped products' groups.
  std::vector<int64_t> local_expert_rows() const;
};

// E experts over ep's ranks (R must divide E: a ConfigError otherwise) from this rank's rows per
// expert [E]: the counts exchanged (one all-to-all of E / R counts per pair). Collective.
EpPlan ep_plan(Comm& ep, const std::vector<int64_t>& expert_rows);
// rows [rows_sent, W] (expert order) -> [rows_received, W] expert-major (this rank's expert, then
// the sending rank). Collective.
Tensor ep_dispatch(Comm& ep, const EpPlan& p, const Tensor& rows);
// The inverse: [rows_received, W] in ep_dispatch's output order -> [rows_sent, W] in the order the
// rows were dispatched from. Collective.
Tensor ep_return(Comm& ep, const EpPlan& p, const Tensor& rows);

}  // namespace hmla
