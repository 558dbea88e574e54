// The CUDA backend: every op on the device (cuda_kernels.h); its memory is the caching allocator
// of device.cu. Its compute dtype is bf16 (DESIGN.md section 4): the attention kernels and the
// indexer's scores run on bf16 tensors; the products take f32 or bf16 operands into bf16
// tensor-core math; the norms, RoPE, SwiGLU and the indexer's KLs read (and the row ops write)
// bf16 activations where nn.h says so; statistics, losses, gradients and the optimizer are f32.
#include "hmla/ops/backend.h"
#include "cuda_kernels.h"
#include "traits.h"
#include "attn_dense.cuh"

namespace hmla {

namespace {

using cuda::attn_dense_smem_bytes;
using cuda::IndexerKlTraits;
using cuda::kAttnMaxSmemBytes;
using cuda::kMmaK;
using cuda::SparseTraits;
using cuda::TopkTraits;

bool f32_or_bf16(DType t) { return t == DType::f32 || t == DType::bf16; }

class CudaBackend final : public Backend {
 public:
  CudaBackend() : Backend(Device::cuda) {}
  const char* name() const override { return "cuda"; }
  DType compute_dtype() const override { return DType::bf16; }
  // Every limit of the CUDA kernels, for the real params (traits.h and attn_dense.cuh say why).
  bool supports(const AttnDenseParams& p) const override {
    return p.dtype == DType::bf16 && p.Dqk % kMmaK == 0 && p.Dv % kMmaK == 0 &&
           attn_dense_smem_bytes(p) <= kAttnMaxSmemBytes;
  }
  bool supports(const AttnSparseParams& p) const override {
    using T = SparseTraits;
    const bool backward = p.dq != nullptr;
    return p.dtype == DType::bf16 && p.Dqk % kMmaK == 0 && p.Dv % kMmaK == 0 && p.KW <= T::kMaxKW &&
           T::fwd_smem_bytes(p.H, p.Dqk, p.KW) <= T::kFwdMaxSmemBytes &&
           (!backward || (p.H % T::kHeadStep == 0 && T::bwd_smem_bytes(p.Dqk, p.Dv, p.KW) + 1024 <= T::kBwdMaxSmemBytes));
  }
  bool supports(const IndexerTopkParams& p) const override {
    const bool select = p.scores != nullptr;  // from given scores: f32, any widths
    return p.K <= TopkTraits::kMaxK &&
           (select || (p.dtype == DType::bf16 && p.HI % kMmaK == 0 && p.DI % kMmaK == 0));
  }
  bool supports(const IndexerKlParams& p) const override {
    using T = IndexerKlTraits;
    const int64_t cand = p.topk ? T::pow2_at_least(p.K) : 0;
    const bool bf16_inputs = p.dtype == DType::bf16 && p.qk_dtype == DType::bf16;
    if (!p.topk && T::mma_dense(bf16_inputs, p.H, p.HI, p.Dqk, p.DI)) return true;  // the tensor-core paths
    if (p.topk && T::mma_sparse(bf16_inputs, p.H, p.HI, p.Dqk, p.DI, p.K)) return true;
    return f32_or_bf16(p.dtype) && f32_or_bf16(p.qk_dtype) && p.HI <= T::kMaxHI && p.H <= T::kMaxH && p.K <= T::kMaxK &&
           T::smem_bytes(p.HI, p.H, cand) <= T::kMaxSmemBytes;
  }
  bool supports(const GemmParams& p) const override {  // any mix of f32 and bf16 (gemm.cu)
    return f32_or_bf16(p.a_dtype) && f32_or_bf16(p.b_dtype) && f32_or_bf16(p.c_dtype);
  }
  // The activations of the row and element ops, f32 or bf16 (nn.cu's instantiations); the fused
  // add reads the residual stream x in f32 only.
  bool supports(const NormParams& p) const override {
    return f32_or_bf16(p.x_dtype) && f32_or_bf16(p.x2_dtype) && f32_or_bf16(p.y_dtype) &&
           (!p.x2 || p.x_dtype == DType::f32);
  }
  bool supports(const RopeParams& p) const override { return f32_or_bf16(p.x_dtype); }
  bool supports(const SwigluParams& p) const override { return f32_or_bf16(p.dtype); }
  bool supports(const EmbeddingParams&) const override { return true; }
  bool supports(const CrossEntropyParams&) const override { return true; }
  bool supports(const AxpyParams&) const override { return true; }
  bool supports(const ConvertParams& p) const override {
    return p.src_dtype == p.dst_dtype || (f32_or_bf16(p.src_dtype) && f32_or_bf16(p.dst_dtype));
  }
  bool supports(const SumSquaresParams&) const override { return true; }
  bool supports(const StatsParams&) const override { return true; }
  bool supports(const AdamWParams&) const override { return true; }
  bool supports(const MuonParams&) const override { return true; }
  bool supports(const MoeBalanceParams&) const override { return true; }  // moe_balance.cu
  // The MoE ops (moe.cu): the kept groups in a 64-bit mask; the gather's source and the row dot's
  // operands may be bf16 activations; the grouped products take linear's dtypes, their experts'
  // matrices at one stride (one arena) and a grid that fits.
  bool supports(const MoeRouteParams& p) const override { return p.n_group <= cuda::MoeTraits::kMaxGroups; }
  bool supports(const MoeDispatchParams&) const override { return true; }
  bool supports(const MoeRowsParams& p) const override {
    return f32_or_bf16(p.src_dtype) && f32_or_bf16(p.a_dtype) && f32_or_bf16(p.b_dtype);
  }
  bool supports(const MoeGroupedParams& p) const override {
    using T = cuda::MoeTraits;
    int64_t stride = 0;
    return f32_or_bf16(p.x_dtype) && f32_or_bf16(p.w_dtype) && f32_or_bf16(p.y_dtype) && f32_or_bf16(p.dx_dtype) &&
           cuda::moe_expert_stride(p.W, p.E, int64_t(dtype_size(p.w_dtype)), stride) &&
           (!p.dW || cuda::moe_expert_stride(reinterpret_cast<const void* const*>(p.dW), p.E, sizeof(float), stride)) &&
           T::row_tiles(p.rows, p.E) <= T::kMaxGridY && p.E <= T::kMaxGridY;
  }

#define HMLA_CUDA_ENTRY(ret, name, P) HMLA_FORWARD(cuda, ret, name, P)
  HMLA_OP_LIST(HMLA_CUDA_ENTRY)
#undef HMLA_CUDA_ENTRY
};

}  // namespace

const Backend* cuda_backend() {
  static const CudaBackend b;
  return &b;
}

}  // namespace hmla
