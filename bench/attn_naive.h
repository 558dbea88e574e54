// The naive arm of `hmla bench attention`: materialised fp32 attention done well. Per (batch row,
// head) it builds the full [s, s] score matrix with one product, applies the document-causal
// mask element-wise (as a masked SDPA does; it never blocks by document), and backpropagates
// from recomputed probabilities. Products use the same sgemm as the kernels (all threads);
// element-wise passes use OpenMP. Memory: two [s, s] f32 matrices.
#pragma once
#include "hmla/ops/attention.h"

namespace hmla::bench {

AttnDenseSaved attn_naive_fwd(const AttnDenseInputs& in);
AttnDenseGrads attn_naive_bwd(const AttnDenseInputs& in, const AttnDenseSaved& saved,
                              const Tensor& dout);

}  // namespace hmla::bench
