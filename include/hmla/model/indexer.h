// The lightning indexer module (DESIGN.md section 5): its five tensors, forward from detached
// copies of the attention input x and the normalised q latent cq, and backward into its own
// weights only (nothing flows into the backbone). Also the loss-row weights of section 3.
#pragma once
#include <vector>

#include "hmla/io/safetensors.h"
#include "hmla/model/config.h"
#include "hmla/model/mla_layer.h"
#include "hmla/ops/indexer.h"

namespace hmla {

// indexer.wq_b.weight [HI*DI, Rq], indexer.wk.weight [DI, hidden], indexer.k_norm.weight [DI],
// indexer.k_norm.bias [DI], indexer.weights_proj.weight [HI, hidden].
std::vector<ParamSpec> indexer_param_table(const ModelConfig& c);

// Initialises missing indexer tensors (wq_b, wk, weights_proj ~ N(0, initializer_range) from
// `seed`; k_norm weight 1, bias 0); present ones are kept. Returns how many were created.
int indexer_init_missing(io::TensorMap& w, const ModelConfig& c, uint64_t seed);

// x [b, s, hidden], cq [N, Rq]: the attention input and the normalised q latent (read only), of
// this rank's rows under context parallelism (the key kI is all-gathered: [b, S, DI]).
void indexer_forward(const ModelConfig& c, const io::TensorMap& w, const Tensor& x, const Tensor& cq,
                     const DocLayout& layout, IndexerState& saved, Comm& cp = Comm::self());
// Writes grad.<indexer tensors> into `grads` from the KL's dqI, dkI, dw (dkI over every key row
// is reduce-scattered to this rank's rows first).
void indexer_backward(const ModelConfig& c, const io::TensorMap& w, const Tensor& x, const Tensor& cq,
                      const IndexerState& saved, const IndexerKlResult& kl, io::TensorMap& grads,
                      Comm& cp = Comm::self());

// Loss rows (DESIGN.md section 3): mask[t] = (input_ids[t] != pad_token_id) and A(t) non-empty;
// without input_ids every row counts. Returns [b, s] f32 mask / valid_rows, where valid_rows is
// `global_valid_rows` when given (> 0: summed over every rank and micro-batch of the step), else
// this batch's max(sum(mask), 1) (or b * s without input_ids).
Tensor loss_row_weights(const DocLayout& layout, const Tensor* input_ids, int64_t pad_token_id,
                        int64_t global_valid_rows = 0);
// sum(mask) of this batch (before the max with 1): what ranks and micro-batches add up.
int64_t loss_row_count(const DocLayout& layout, const Tensor* input_ids, int64_t pad_token_id);

}  // namespace hmla
