// The CPU-only build's answers about CUDA (src/cuda/device.cu replaces this file when built).
#include <string>

#include "hmla/core/cuda.h"
#include "hmla/core/error.h"

namespace hmla {
bool cuda_built() { return false; }
int cuda_device_count() { return 0; }
CudaCounters cuda_counters() { return {}; }
std::string cuda_device_name(int) { throw Error("this build of hmla has no CUDA backend"); }
int cuda_select_device(int) { throw Error("this build of hmla has no CUDA backend"); }
ScopedCudaStream::ScopedCudaStream(uintptr_t) {
  throw Error("a CUDA stream was given to a build of hmla without the CUDA backend: rebuild with -DHMLA_CUDA=ON");
}
ScopedCudaStream::~ScopedCudaStream() = default;
}  // namespace hmla
