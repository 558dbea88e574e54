// CUDA device plumbing: the device allocator (cudaMalloc behind the same live/peak counters as
// the CPU one) and the cross-device copy hook used by Tensor::copy_from.
#include <cuda_runtime.h>

#include <new>
#include <string>

#include "hmla/core/allocator.h"
#include "hmla/core/cuda.h"
#include "hmla/core/error.h"

namespace hmla {

extern void (*g_device_copy)(void* dst, Device dd, const void* src, Device sd, size_t bytes);

namespace {

void check_cuda(cudaError_t e, const char* what) {
  HMLA_CHECK(e == cudaSuccess, Error, what, ": ", cudaGetErrorString(e));
}

class CudaAllocator final : public Allocator {
 protected:
  void* raw_allocate(size_t bytes) override {
    void* p = nullptr;
    if (bytes == 0) return nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) throw std::bad_alloc();
    return p;
  }
  void raw_deallocate(void* p, size_t) override { cudaFree(p); }
};

void device_copy(void* dst, Device dd, const void* src, Device sd, size_t bytes) {
  cudaMemcpyKind kind = dd == Device::cpu ? cudaMemcpyDeviceToHost
                        : sd == Device::cpu ? cudaMemcpyHostToDevice
                                            : cudaMemcpyDeviceToDevice;
  check_cuda(cudaMemcpy(dst, src, bytes, kind), "cudaMemcpy");
}

struct Registrar {
  Registrar() {
    static CudaAllocator a;
    register_allocator(Device::cuda, &a);
    g_device_copy = device_copy;
  }
} registrar;

}  // namespace

bool cuda_built() { return true; }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

std::string cuda_device_name(int device) {
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  return prop.name;
}

}  // namespace hmla
