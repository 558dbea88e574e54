// The backend registry: the CPU backend always, the CUDA one where the build has it.
#include "hmla/ops/backend.h"

#include "hmla/core/error.h"

namespace hmla {


const Backend& backend(Device d) {
  if (d == Device::cpu) return cpu_backend();
  const Backend* b = cuda_backend();
  HMLA_CHECK(b != nullptr, Error, "device cuda: this build of hmla has no CUDA backend (rebuild with nvcc on PATH)");
  return *b;
}

}  // namespace hmla
