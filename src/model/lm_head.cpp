// The LM head and its loss (model_internal.h): chunks of head_chunk_rows rows, each chunk's logits
// overwritten by their gradient.
#include <algorithm>

#include "hmla/ops/nn.h"
#include "model_internal.h"

namespace hmla {

void lm_head_loss(const Model& m, const Tensor& W, const Tensor& n_final, const Tensor& target, const Tensor& keep,
                  const Tensor& gW, const Tensor& dn, const Tensor& acc) {
  const int64_t N = n_final.size(0), V = m.cfg.vocab_size, rows = std::max<int64_t>(1, std::min(N, head_chunk_rows(V)));
  const Tensor logits = Tensor::empty({rows, V}, DType::f32, m.device());
  for (int64_t r0 = 0; r0 < N; r0 += rows) {
    const int64_t r1 = std::min(N, r0 + rows);
    const Tensor nc = n_final.slice(0, r0, r1), lg = logits.slice(0, 0, r1 - r0);
    linear_fwd(nc, W, lg);
    cross_entropy_into(lg, target.slice(0, r0, r1), keep.slice(0, r0, r1), dn.defined() ? lg : Tensor(), acc);
    if (dn.defined()) linear_bwd(lg, nc, W, gW, dn.slice(0, r0, r1));
  }
}

}  // namespace hmla
