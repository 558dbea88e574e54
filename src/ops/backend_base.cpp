// The Backend base class's op entries: unsupported, a clear error. Its own library
// (hmla_backend) so that every backend's library can link it, whatever the link order.
#include <string>

#include "hmla/core/error.h"
#include "hmla/ops/backend.h"

namespace hmla {

namespace {
[[noreturn]] void unsupported(const Backend& b, const char* op) {
  throw ShapeError(std::string(op) + ": the " + b.name() + " backend does not run this op");
}
}  // namespace

#define HMLA_UNSUPPORTED(ret, name, params)                   \
  ret Backend::name params const { unsupported(*this, #name); }
HMLA_UNSUPPORTED(void, gemm, (const GemmParams&))
HMLA_UNSUPPORTED(void, rmsnorm_fwd, (const NormParams&))
HMLA_UNSUPPORTED(void, rmsnorm_bwd, (const NormParams&))
HMLA_UNSUPPORTED(void, layernorm_fwd, (const NormParams&))
HMLA_UNSUPPORTED(void, layernorm_bwd, (const NormParams&))
HMLA_UNSUPPORTED(void, rope, (const RopeParams&))
HMLA_UNSUPPORTED(void, swiglu_fwd, (const SwigluParams&))
HMLA_UNSUPPORTED(void, swiglu_bwd, (const SwigluParams&))
HMLA_UNSUPPORTED(void, embedding_fwd, (const EmbeddingParams&))
HMLA_UNSUPPORTED(void, embedding_bwd, (const EmbeddingParams&))
HMLA_UNSUPPORTED(double, cross_entropy, (const CrossEntropyParams&))
HMLA_UNSUPPORTED(void, axpy, (const AxpyParams&))
HMLA_UNSUPPORTED(void, convert, (const ConvertParams&))
HMLA_UNSUPPORTED(double, sum_squares, (const SumSquaresParams&))
HMLA_UNSUPPORTED(void, adamw_update, (const AdamWParams&))
HMLA_UNSUPPORTED(void, muon_momentum, (const MuonParams&))
HMLA_UNSUPPORTED(void, muon_update, (const MuonParams&))
HMLA_UNSUPPORTED(void, attn_dense_fwd, (const AttnDenseParams&))
HMLA_UNSUPPORTED(void, attn_dense_bwd, (const AttnDenseParams&))
HMLA_UNSUPPORTED(void, attn_sparse_check_table, (const AttnSparseParams&))
HMLA_UNSUPPORTED(void, attn_sparse_fwd, (const AttnSparseParams&))
HMLA_UNSUPPORTED(void, attn_sparse_bwd, (const AttnSparseParams&))
HMLA_UNSUPPORTED(void, indexer_topk, (const IndexerParams&))
HMLA_UNSUPPORTED(void, indexer_select, (const IndexerParams&))
HMLA_UNSUPPORTED(double, indexer_kl_dense, (const IndexerParams&))
HMLA_UNSUPPORTED(double, indexer_kl_sparse, (const IndexerParams&))
#undef HMLA_UNSUPPORTED

}  // namespace hmla
