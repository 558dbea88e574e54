// The CUDA backend: bf16 dense attention, sparse latent MQA and the indexer's selection on the
// device (cuda_kernels.h); its memory is the caching allocator of device.cu. The other ops are not
// on the GPU yet (issue 16) and report unsupported.
#include "hmla/ops/backend.h"
#include "cuda_kernels.h"

namespace hmla {

namespace {

class CudaBackend final : public Backend {
 public:
  CudaBackend() : Backend(Device::cuda) {}
  const char* name() const override { return "cuda"; }
  using Backend::supports;  // the families not overridden below: unsupported

  bool supports(const AttnDenseParams& p) const override {
    return p.dtype == DType::bf16 && p.Dqk % 16 == 0 && p.Dv % 16 == 0;
  }
  bool supports(const AttnSparseParams& p) const override {
    return p.dtype == DType::bf16 && p.Dqk % 16 == 0 && p.Dv % 16 == 0;
  }
  bool supports(const IndexerParams& p) const override {  // the scores and selection; no KL yet
    if (p.op == IndexerOp::select) return true;
    return p.op == IndexerOp::topk && p.dtype == DType::bf16 && p.HI % 16 == 0 && p.DI % 16 == 0;
  }

  void attn_dense_fwd(const AttnDenseParams& p) const override { cuda::attn_dense_fwd(p); }
  void attn_dense_bwd(const AttnDenseParams& p) const override { cuda::attn_dense_bwd(p); }
  void attn_sparse_check_table(const AttnSparseParams& p) const override { cuda::attn_sparse_check_table(p); }
  void attn_sparse_fwd(const AttnSparseParams& p) const override { cuda::attn_sparse_fwd(p); }
  void attn_sparse_bwd(const AttnSparseParams& p) const override { cuda::attn_sparse_bwd(p); }
  void indexer_topk(const IndexerParams& p) const override { cuda::indexer_topk(p); }
  void indexer_select(const IndexerParams& p) const override { cuda::indexer_select(p); }
};

}  // namespace

const Backend* cuda_backend() {
  static const CudaBackend b;
  return &b;
}

}  // namespace hmla
