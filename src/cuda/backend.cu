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
  bool supports(const IndexerScores& sc) const override {
    return sc.qI.dtype() == DType::bf16 && sc.qI.size(2) % 16 == 0 && sc.qI.size(3) % 16 == 0;
  }

  void attn_dense_fwd(const AttnDenseParams& p) const override { cuda::attn_dense_fwd(p); }
  void attn_dense_bwd(const AttnDenseParams& p) const override { cuda::attn_dense_bwd(p); }
  void attn_sparse_check_table(const AttnSparseParams& p) const override { cuda::attn_sparse_check_table(p); }
  void attn_sparse_fwd(const AttnSparseParams& p) const override { cuda::attn_sparse_fwd(p); }
  void attn_sparse_bwd(const AttnSparseParams& p) const override { cuda::attn_sparse_bwd(p); }
  Tensor indexer_topk(const IndexerScores& sc, int64_t K, int64_t W) const override {
    return cuda::indexer_topk(sc, K, W);
  }
  Tensor indexer_select(const Tensor& scores, const DocLayout& layout, int64_t q_row0, int64_t K,
                        int64_t W) const override {
    return cuda::indexer_select(scores, layout, q_row0, K, W);
  }
};

}  // namespace

const Backend* cuda_backend() {
  static const CudaBackend b;
  return &b;
}

}  // namespace hmla
