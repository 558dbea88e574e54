// The materialised arm of `hmla bench indexer`: the dense KL with [s, s] f32 tensors P, I, Q
// and dI per batch row (heads reduced into them as they are produced, plus one [s, s] head
// scratch), the way an unfused autograd implementation holds them. Same sgemm as the kernels.
#pragma once
#include "hmla/ops/indexer.h"

namespace hmla::bench {

IndexerKlResult indexer_kl_materialized(const IndexerKlInputs& in);

}  // namespace hmla::bench
