// The loss rows of DESIGN.md section 3, shared by the LM loss (model.h) and the indexer's KL:
// which rows count and their weights mask / valid_rows.
#pragma once
#include <cstdint>

#include "hmla/core/layout.h"
#include "hmla/core/tensor.h"

namespace hmla {

// Loss rows (DESIGN.md section 3): mask[t] = (input_ids[t] != pad_token_id) and A(t) non-empty;
// without input_ids every row counts. Returns [b, s] f32 mask / valid_rows, where valid_rows is
// `global_valid_rows` when given (> 0: summed over every rank and micro-batch of the step), else
// this batch's max(sum(mask), 1) (or b * s without input_ids).
Tensor loss_row_weights(const DocLayout& layout, const Tensor* input_ids, int64_t pad_token_id,
                        int64_t global_valid_rows = 0);
// sum(mask) of this batch (before the max with 1): what ranks and micro-batches add up.
int64_t loss_row_count(const DocLayout& layout, const Tensor* input_ids, int64_t pad_token_id);
// The packed rows (sequences) of this batch holding at least one loss row: the sequences the MoE
// balance loss averages over (docs/moe.md).
int64_t loss_sequence_count(const DocLayout& layout, const Tensor* input_ids, int64_t pad_token_id);

}  // namespace hmla
