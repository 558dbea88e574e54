// CUDA runtime types the backend owns through RAII: a stream and a cuBLASLt handle, plus the
// error check every CUDA call goes through. Kernels launch on hmla's current stream.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "hmla/core/allocator.h"
#include "hmla/core/cuda.h"
#include "hmla/core/error.h"

// kernel<<<grid, block, smem, stream>>>(args...), spelled so that the SIMT emulator
// (tests/cuda/emu) can run the same launch on the CPU.
#ifndef HMLA_LAUNCH
#define HMLA_LAUNCH(kernel, grid, block, smem, stream, ...) kernel<<<grid, block, smem, stream>>>(__VA_ARGS__)
#endif

namespace hmla::cuda {

inline void check(cudaError_t e, const char* what) {
  HMLA_CHECK(e == cudaSuccess, Error, what, ": ", cudaGetErrorString(e));
}
inline void check(cublasStatus_t s, const char* what) {
  HMLA_CHECK(s == CUBLAS_STATUS_SUCCESS, Error, what, ": cuBLAS status ", int(s));
}
// After a launch: the launch error now, and (with HMLA_CUDA_SYNC_CHECK=1) the kernel's own.
// Counts the launch (cuda_counters).
void check_launch(const char* kernel);
// The counters' storage (device.cu): every sync, copy and launch of hmla adds to it.
CudaCounters& counters();

class Stream {
 public:
  Stream() { check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~Stream() {
    if (s_) cudaStreamDestroy(s_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }
  void sync() const {
    ++counters().syncs;
    check(cudaStreamSynchronize(s_), "cudaStreamSynchronize");
  }

 private:
  cudaStream_t s_ = nullptr;
};

// The products' handle (gemm.cu).
class BlasLt {
 public:
  BlasLt() { check(cublasLtCreate(&h_), "cublasLtCreate"); }
  ~BlasLt() {
    if (h_) cublasLtDestroy(h_);
  }
  BlasLt(const BlasLt&) = delete;
  BlasLt& operator=(const BlasLt&) = delete;
  cublasLtHandle_t get() const { return h_; }

 private:
  cublasLtHandle_t h_ = nullptr;
};

// The stream and cuBLASLt handle of this thread's device work (created on first use).
Stream& current_stream();
BlasLt& blaslt();

// A device buffer of n T for the duration of one op, through the caching allocator (a steady
// training step allocates nothing new). host() reads n values back (the stream's work first).
template <class T>
class Scratch {
 public:
  explicit Scratch(int64_t n) : bytes_(size_t(std::max<int64_t>(n, 1)) * sizeof(T)) {
    p_ = static_cast<T*>(allocator(Device::cuda).allocate(bytes_));
  }
  ~Scratch() { allocator(Device::cuda).deallocate(p_, bytes_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  T* get() const { return p_; }
  std::vector<T> host(int64_t n) const {
    std::vector<T> v(size_t(std::max<int64_t>(n, 0)));
    if (n > 0) device_copy(v.data(), Device::cpu, p_, Device::cuda, size_t(n) * sizeof(T));
    return v;
  }

 private:
  size_t bytes_;
  T* p_ = nullptr;
};

}  // namespace hmla::cuda
