// CUDA runtime types the backend owns through RAII: a stream and a cuBLASLt handle, plus the
// error check every CUDA call goes through. Every kernel, product, memset and copy goes to the
// thread's current stream (current_stream(): a ScopedCudaStream's, else hmla's own).
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

// hmla's own stream of a thread (non-blocking: the legacy default stream would order it with
// every other library's work on it, and serialise it against them).
class Stream {
 public:
  Stream() { check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~Stream() {
    if (s_) cudaStreamDestroy(s_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

// The stream work goes to now (not owned): get() for the calls, sync() for a counted host wait.
class StreamRef {
 public:
  explicit StreamRef(cudaStream_t s) : s_(s) {}
  cudaStream_t get() const { return s_; }
  void sync() const {
    ++counters().syncs;
    check(cudaStreamSynchronize(s_), "cudaStreamSynchronize");
  }

 private:
  cudaStream_t s_;
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

// Uploads' pinned staging (device.cu): buffers of kStageBytes (an upload larger than one goes in
// chunks), at most kStageBuffers of them (32 MiB of pinned host memory, made as first needed): a
// steady step's uploads (a few micro-batches of ids and layouts between two read-backs) fit, so no
// upload waits; a larger one (parameters at start-up) waits for its oldest chunk's copy now and then.
inline constexpr size_t kStageBytes = size_t(1) << 20;
inline constexpr size_t kStageBuffers = 32;

// This thread's current stream: the innermost open ScopedCudaStream's, else the thread's own
// Stream (created on first use). Every call that takes a stream passes this one.
StreamRef current_stream();
// This thread's cuBLASLt handle (created on first use; a handle is not tied to a stream).
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
