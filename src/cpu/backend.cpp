// The CPU backend: every op in f32 on host memory, through the kernels of cpu_kernels.h.
#include "hmla/ops/backend.h"

#include "cpu_kernels.h"

namespace hmla {

namespace {

class CpuBackend final : public Backend {
 public:
  CpuBackend() : Backend(Device::cpu) {}
  const char* name() const override { return "cpu"; }

  bool supports(const GemmParams& p) const override { return p.dtype == DType::f32; }
  bool supports(const NormParams&) const override { return true; }
  bool supports(const RopeParams&) const override { return true; }
  bool supports(const SwigluParams&) const override { return true; }
  bool supports(const EmbeddingParams&) const override { return true; }
  bool supports(const CrossEntropyParams&) const override { return true; }
  bool supports(const AxpyParams&) const override { return true; }
  bool supports(const ConvertParams& p) const override {
    return p.src_dtype == p.dst_dtype || (p.src_dtype != DType::i32 && p.src_dtype != DType::i64 &&
                                          p.dst_dtype != DType::i32 && p.dst_dtype != DType::i64);
  }
  bool supports(const SumSquaresParams&) const override { return true; }
  bool supports(const AdamWParams&) const override { return true; }
  bool supports(const MuonParams&) const override { return true; }
  bool supports(const AttnDenseParams& p) const override { return p.dtype == DType::f32; }
  bool supports(const AttnSparseParams& p) const override { return p.dtype == DType::f32; }
  bool supports(const IndexerParams& p) const override { return p.dtype == DType::f32; }

  void gemm(const GemmParams& p) const override {
    const float* a = static_cast<const float*>(p.a);
    const float* b = static_cast<const float*>(p.b);
    float* c = static_cast<float*>(p.c);
    for (int64_t i = 0; i < p.batch; ++i)
      cpu::sgemm(p.ta, p.tb, p.M, p.N, p.K, p.alpha, a + i * p.a_batch, p.lda, b + i * p.b_batch, p.ldb, p.beta,
                 c + i * p.c_batch, p.ldc);
  }
  void rmsnorm_fwd(const NormParams& p) const override {
    cpu::rmsnorm_fwd(p.y, p.ldy, p.rstd, p.x, p.ldx, p.w, p.N, p.D, p.eps);
  }
  void rmsnorm_bwd(const NormParams& p) const override {
    cpu::rmsnorm_bwd(p.dx, p.lddx, p.dw, p.dy, p.lddy, p.x, p.ldx, p.w, p.rstd, p.N, p.D);
  }
  void layernorm_fwd(const NormParams& p) const override {
    cpu::layernorm_fwd(p.y, p.mean, p.rstd, p.x, p.w, p.bias, p.N, p.D, p.eps);
  }
  void layernorm_bwd(const NormParams& p) const override {
    cpu::layernorm_bwd(p.dx, p.dw, p.db, p.dy, p.x, p.w, p.mean, p.rstd, p.N, p.D);
  }
  void rope(const RopeParams& p) const override {
    cpu::rope(p.layout, p.x, p.ld, p.hstride, p.heads, p.N, p.s, p.Dr, p.cos, p.sin, p.transpose);
  }
  void swiglu_fwd(const SwigluParams& p) const override { cpu::swiglu_fwd(p.y, p.g, p.u, p.n); }
  void swiglu_bwd(const SwigluParams& p) const override { cpu::swiglu_bwd(p.dg, p.du, p.dy, p.g, p.u, p.n); }
  void embedding_fwd(const EmbeddingParams& p) const override { cpu::embedding_fwd(p); }
  void embedding_bwd(const EmbeddingParams& p) const override { cpu::embedding_bwd(p); }
  double cross_entropy(const CrossEntropyParams& p) const override {
    return cpu::cross_entropy(p.logits, p.target, p.w, p.N, p.V, p.dlogits, p.init);
  }
  void axpy(const AxpyParams& p) const override { cpu::axpy(p); }
  void convert(const ConvertParams& p) const override { cpu::convert(p); }
  double sum_squares(const SumSquaresParams& p) const override { return cpu::sum_squares(p); }
  void adamw_update(const AdamWParams& p) const override { cpu::adamw_update(p); }
  void muon_momentum(const MuonParams& p) const override { cpu::muon_momentum(p); }
  void muon_update(const MuonParams& p) const override { cpu::muon_update(p); }
  void attn_dense_fwd(const AttnDenseParams& p) const override { cpu::attn_dense_fwd(p); }
  void attn_dense_bwd(const AttnDenseParams& p) const override { cpu::attn_dense_bwd(p); }
  void attn_sparse_check_table(const AttnSparseParams& p) const override { cpu::attn_sparse_check_table(p); }
  void attn_sparse_fwd(const AttnSparseParams& p) const override { cpu::attn_sparse_fwd(p); }
  void attn_sparse_bwd(const AttnSparseParams& p) const override { cpu::attn_sparse_bwd(p); }
  void indexer_topk(const IndexerParams& p) const override { cpu::indexer_topk(p); }
  void indexer_select(const IndexerParams& p) const override { cpu::indexer_select(p); }
  double indexer_kl_dense(const IndexerParams& p) const override { return cpu::indexer_kl_dense(p); }
  double indexer_kl_sparse(const IndexerParams& p) const override { return cpu::indexer_kl_sparse(p); }
};

}  // namespace

const Backend& cpu_backend() {
  static const CpuBackend b;
  return b;
}

}  // namespace hmla
