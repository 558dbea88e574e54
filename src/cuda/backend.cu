// The CUDA backend: every op on the device (cuda_kernels.h); its memory is the caching allocator
// of device.cu. Its compute dtype is bf16 (DESIGN.md section 4): the attention kernels and the
// indexer's scores run on bf16 tensors; the products take f32 or bf16 operands into bf16
// tensor-core math; the norms, RoPE, SwiGLU and the indexer's KLs read (and the row ops write)
// bf16 activations where nn.h says so; statistics, losses, gradients and the optimizer are f32.
// Its limits and its choice of implementation are the kernel families' plans (cuda::plan, each in
// its family's .cu, from the traits of traits.h and attn_dense.cuh).
#include "hmla/ops/backend.h"
#include "cuda_kernels.h"

namespace hmla {

namespace {

class CudaBackend final : public Backend {
 public:
  CudaBackend() : Backend(Device::cuda) {}
  const char* name() const override { return "cuda"; }
  DType compute_dtype() const override { return DType::bf16; }

#define HMLA_CUDA_PLAN(P) HMLA_FORWARD_PLAN(cuda, P)
  HMLA_PARAMS_LIST(HMLA_CUDA_PLAN)
#undef HMLA_CUDA_PLAN
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
