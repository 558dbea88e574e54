// The MoE load-balancing ops (hmla/ops/moe.h) on the GPU are not written yet: CudaBackend::supports
// refuses MoeBalanceParams (the Backend default), as it refuses the other MoE ops (moe.cu), so
// dispatch reports the missing backend before any of these runs. They exist because every backend
// forwards every op of the op list to a kernel of its own namespace.
#include <stdexcept>
#include <string>

#include "cuda_kernels.h"

namespace hmla::cuda {

namespace {
[[noreturn]] void not_written(const char* op) {
  throw std::logic_error(std::string(op) + ": no CUDA kernel yet; supports() must have refused it");
}
}  // namespace

void moe_expert_load(const MoeBalanceParams&) { not_written("moe_expert_load"); }
void moe_bias_update(const MoeBalanceParams&) { not_written("moe_bias_update"); }
void moe_aux_loss(const MoeBalanceParams&) { not_written("moe_aux_loss"); }

}  // namespace hmla::cuda
