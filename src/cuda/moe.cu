// The MoE ops on the GPU are not written yet (issue 28): CudaBackend::supports refuses their
// params (the Backend default), so dispatch reports "moe_route: the cuda backend does not run the
// MoE ops yet" before any of these is called. They exist because every backend forwards every op
// of the op list to a kernel of its own namespace.
#include <stdexcept>
#include <string>

#include "cuda_kernels.h"

namespace hmla::cuda {

namespace {
[[noreturn]] void not_written(const char* op) {
  throw std::logic_error(std::string(op) + ": no CUDA kernel yet; supports() must have refused it");
}
}  // namespace

void moe_route_fwd(const MoeRouteParams&) { not_written("moe_route_fwd"); }
void moe_route_bwd(const MoeRouteParams&) { not_written("moe_route_bwd"); }
void moe_dispatch(const MoeDispatchParams&) { not_written("moe_dispatch"); }
void moe_gather(const MoeRowsParams&) { not_written("moe_gather"); }
void moe_combine(const MoeRowsParams&) { not_written("moe_combine"); }
void moe_rowdot(const MoeRowsParams&) { not_written("moe_rowdot"); }

}  // namespace hmla::cuda
