// The lightning indexer module (DESIGN.md section 5): its five tensors, forward from detached
// copies of the attention input x and the normalised q latent cq, and backward into its own
// weights only (nothing flows into the backbone).
#pragma once
#include <vector>

#include "hmla/dist/comm.h"
#include "hmla/io/safetensors.h"
#include "hmla/model/config.h"
#include "hmla/model/losses.h"
#include "hmla/model/params.h"
#include "hmla/ops/indexer.h"

namespace hmla {

// The indexer's forward state (DESIGN.md section 5), kept by a dsa-mode layer.
struct IndexerState {
  Tensor kpre, k_mean, k_rstd;  // wk x before LayerNorm [N, DI] and its statistics [N]
  IndexerScores sc;             // qI [b,s,HI,DI], kI [b,s,DI] (rope applied), w [b,s,HI]
};

// indexer.wq_b.weight [HI*DI, Rq], indexer.wk.weight [DI, hidden], indexer.k_norm.weight [DI],
// indexer.k_norm.bias [DI], indexer.weights_proj.weight [HI, hidden].
std::vector<ParamSpec> indexer_param_table(const ModelConfig& c);

// Initialises missing indexer tensors (wq_b, wk, weights_proj ~ N(0, initializer_range) from
// `seed`; k_norm weight 1, bias 0); present ones are kept. Returns how many were created.
int indexer_init_missing(io::TensorMap& w, const ModelConfig& c, uint64_t seed);

// x [b, s, hidden], cq [N, Rq]: the attention input and the normalised q latent (read only), of
// this rank's rows under context parallelism (the key kI is all-gathered: [b, S, DI]).
void indexer_forward(const ModelConfig& c, const IndexerTensors& w, const Tensor& x, const Tensor& cq,
                     const DocLayout& layout, const RopeCache& rope, IndexerState& saved, Comm& cp = Comm::self());
// Writes the indexer's weight gradients into `grads` (same shapes as `w`, overwritten) from the
// KL's dqI, dkI, dw (dkI over every key row is reduce-scattered to this rank's rows first).
void indexer_backward(const ModelConfig& c, const IndexerTensors& w, const Tensor& x, const Tensor& cq,
                      const RopeCache& rope, const IndexerState& saved, const IndexerKlResult& kl,
                      const IndexerTensors& grads, Comm& cp = Comm::self());

}  // namespace hmla
