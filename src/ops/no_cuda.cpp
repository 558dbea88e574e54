// A build without the CUDA backend (src/cuda/backend.cu replaces this file when built).
#include "hmla/ops/backend.h"

namespace hmla {
const Backend* cuda_backend() { return nullptr; }
}  // namespace hmla
