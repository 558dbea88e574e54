// The CUDA backend: every op on the device (cuda_kernels.h); its memory is the caching allocator
// of device.cu. The attention kernels and the indexer's scores run on bf16 tensors (the op entries
// make bf16 compute copies of f32 inputs); the products take f32 tensors into bf16 tensor-core math;
// everything else is f32.
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
  bool supports(const IndexerParams& p) const override {
    switch (p.op) {
      case IndexerOp::select: return true;
      case IndexerOp::topk: return p.dtype == DType::bf16 && p.HI % 16 == 0 && p.DI % 16 == 0;
      default: return p.dtype == DType::f32 && p.HI <= 256 && p.H <= 1024 && p.K <= 8192;  // the KLs' shared memory
    }
  }
  bool supports(const GemmParams& p) const override { return p.dtype == DType::f32; }
  bool supports(const NormParams&) const override { return true; }
  bool supports(const RopeParams&) const override { return true; }
  bool supports(const SwigluParams&) const override { return true; }
  bool supports(const EmbeddingParams&) const override { return true; }
  bool supports(const CrossEntropyParams&) const override { return true; }
  bool supports(const AxpyParams&) const override { return true; }
  bool supports(const ConvertParams& p) const override {
    auto fb = [](DType t) { return t == DType::f32 || t == DType::bf16; };
    return p.src_dtype == p.dst_dtype || (fb(p.src_dtype) && fb(p.dst_dtype));
  }
  bool supports(const SumSquaresParams&) const override { return true; }
  bool supports(const AdamWParams&) const override { return true; }
  bool supports(const MuonParams&) const override { return true; }

  void attn_dense_fwd(const AttnDenseParams& p) const override { cuda::attn_dense_fwd(p); }
  void attn_dense_bwd(const AttnDenseParams& p) const override { cuda::attn_dense_bwd(p); }
  void attn_sparse_check_table(const AttnSparseParams& p) const override { cuda::attn_sparse_check_table(p); }
  void attn_sparse_fwd(const AttnSparseParams& p) const override { cuda::attn_sparse_fwd(p); }
  void attn_sparse_bwd(const AttnSparseParams& p) const override { cuda::attn_sparse_bwd(p); }
  void indexer_topk(const IndexerParams& p) const override { cuda::indexer_topk(p); }
  void indexer_select(const IndexerParams& p) const override { cuda::indexer_select(p); }
  double indexer_kl_dense(const IndexerParams& p) const override { return cuda::indexer_kl_dense(p); }
  double indexer_kl_sparse(const IndexerParams& p) const override { return cuda::indexer_kl_sparse(p); }
  void gemm(const GemmParams& p) const override { cuda::gemm(p); }
  void rmsnorm_fwd(const NormParams& p) const override { cuda::rmsnorm_fwd(p); }
  void rmsnorm_bwd(const NormParams& p) const override { cuda::rmsnorm_bwd(p); }
  void layernorm_fwd(const NormParams& p) const override { cuda::layernorm_fwd(p); }
  void layernorm_bwd(const NormParams& p) const override { cuda::layernorm_bwd(p); }
  void rope(const RopeParams& p) const override { cuda::rope(p); }
  void swiglu_fwd(const SwigluParams& p) const override { cuda::swiglu_fwd(p); }
  void swiglu_bwd(const SwigluParams& p) const override { cuda::swiglu_bwd(p); }
  void embedding_fwd(const EmbeddingParams& p) const override { cuda::embedding_fwd(p); }
  void embedding_bwd(const EmbeddingParams& p) const override { cuda::embedding_bwd(p); }
  double cross_entropy(const CrossEntropyParams& p) const override { return cuda::cross_entropy(p); }
  void axpy(const AxpyParams& p) const override { cuda::axpy(p); }
  void convert(const ConvertParams& p) const override { cuda::convert(p); }
  double sum_squares(const SumSquaresParams& p) const override { return cuda::sum_squares(p); }
  void adamw_update(const AdamWParams& p) const override { cuda::adamw_update(p); }
  void muon_momentum(const MuonParams& p) const override { cuda::muon_momentum(p); }
  void muon_update(const MuonParams& p) const override { cuda::muon_update(p); }
};

}  // namespace

const Backend* cuda_backend() {
  static const CudaBackend b;
  return &b;
}

}  // namespace hmla
