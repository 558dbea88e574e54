// CUDA device plumbing: the caching device allocator (behind the same live/peak counters as the
// CPU one) with the device's copies and synchronisation, and the RAII stream and cuBLASLt handle
// of runtime.h.
#include <cuda_runtime.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <string>

#include "hmla/core/allocator.h"
#include "hmla/core/cuda.h"
#include "hmla/core/error.h"
#include "runtime.h"
#include "strided.cuh"

namespace hmla {

namespace cuda {

CudaCounters& counters() {
  static CudaCounters c;
  return c;
}

void check_launch(const char* kernel) {
  ++counters().launches;
  check(cudaGetLastError(), kernel);
  static const bool sync = [] {
    const char* v = std::getenv("HMLA_CUDA_SYNC_CHECK");
    return v && v[0] == '1';
  }();
  if (sync) check(cudaStreamSynchronize(current_stream().get()), kernel);
}

Stream& current_stream() {
  thread_local Stream s;
  return s;
}

BlasLt& blaslt() {
  thread_local BlasLt h;
  return h;
}

}  // namespace cuda

namespace {

using cuda::check;
void check_cuda(cudaError_t e, const char* what) { check(e, what); }

// Freed blocks are kept by size and handed out again (a training step allocates the same sizes
// every step), so steady-state steps call cudaMalloc not at all. A request takes the smallest
// cached block of at least its (512-byte rounded) size and at most twice it; when cudaMalloc
// fails, the cache is released and the call retried once. The base class counts requested bytes.
class CudaAllocator final : public Allocator {
 public:
  ~CudaAllocator() override { release_locked(); }  // the cache (live blocks are their tensors')

 protected:
  void* raw_allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    const size_t size = (bytes + 511) / 512 * 512;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.lower_bound(size);
    if (it != free_.end() && it->first <= 2 * size) {
      void* p = it->second;
      free_.erase(it);
#ifdef HMLA_CUDA_EMULATE
      emu::set_live(p, true);  // initcheck: a block handed out again reads as NaN, not as its last tensor
#endif
      return p;
    }
    void* p = nullptr;
    if (cudaMalloc(&p, size) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky allocation error
      release_locked();
      if (cudaMalloc(&p, size) != cudaSuccess) {
        cudaGetLastError();
        throw std::bad_alloc();
      }
    }
    sizes_[p] = size;
    return p;
  }
  void raw_deallocate(void* p, size_t) override {
    std::lock_guard<std::mutex> lock(mu_);
    free_.emplace(sizes_.at(p), p);
#ifdef HMLA_CUDA_EMULATE
    emu::set_live(p, false);  // a kernel reading a freed tensor reads NaN; the schedule replay skips it
#endif
  }

 public:
  // Copies are ordered on hmla's stream, so a block the caching allocator hands out again is
  // never written while an earlier kernel on the stream still reads it (the stream is
  // non-blocking: plain cudaMemcpy on the legacy stream would order none of this). Only a
  // read-back waits, for the host reads its bytes next. An upload from pageable host memory (all
  // hmla has) is staged before cudaMemcpyAsync returns, so the host may reuse its buffer at once,
  // and a device-to-device copy is just stream work.
  void copy(void* dst, Device dd, const void* src, Device sd, size_t bytes) override {
    cudaMemcpyKind kind = dd == Device::cpu ? cudaMemcpyDeviceToHost
                          : sd == Device::cpu ? cudaMemcpyHostToDevice
                                              : cudaMemcpyDeviceToDevice;
    cudaStream_t st = cuda::current_stream().get();
    CudaCounters& c = cuda::counters();
    (kind == cudaMemcpyDeviceToHost ? c.d2h_bytes : kind == cudaMemcpyHostToDevice ? c.h2d_bytes : c.d2d_bytes) +=
        int64_t(bytes);
    check_cuda(cudaMemcpyAsync(dst, src, bytes, kind, st), "cudaMemcpyAsync");
    if (kind == cudaMemcpyDeviceToHost) {
      ++c.syncs;
      check_cuda(cudaStreamSynchronize(st), "cudaStreamSynchronize after a read-back");
    }
  }
  void synchronize() override { cuda::current_stream().sync(); }
  int64_t capacity() const override {
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      cudaGetLastError();
      return -1;
    }
    return int64_t(total);
  }
  void copy_strided(void* dst, const int64_t* dst_strides, const void* src, const int64_t* src_strides,
                    const int64_t* shape, int dims, size_t esize) override {
    const cuda::Strided4 g = cuda::strided4(shape, dst_strides, src_strides, dims);
    switch (esize) {  // elements moved as unsigned words of their size
      case 2: return cuda::strided_map(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), g);
      case 4: return cuda::strided_map(static_cast<uint32_t*>(dst), static_cast<const uint32_t*>(src), g);
      case 8: return cuda::strided_map(static_cast<uint64_t*>(dst), static_cast<const uint64_t*>(src), g);
      default: throw Error("strided copy of " + std::to_string(esize) + "-byte elements");
    }
  }
  void zero(void* p, size_t bytes) override {
    check_cuda(cudaMemsetAsync(p, 0, bytes, cuda::current_stream().get()), "cudaMemsetAsync");
  }

 private:
  void release_locked() {
    for (auto& [size, p] : free_) {
      cudaFree(p);
      sizes_.erase(p);
    }
    free_.clear();
  }
  std::mutex mu_;
  std::multimap<size_t, void*> free_;  // cached blocks by size
  std::map<void*, size_t> sizes_;      // every block this allocator made, by address
};

struct Registrar {
  Registrar() {
    static CudaAllocator a;
    register_allocator(Device::cuda, &a);
  }
} registrar;

}  // namespace

bool cuda_built() { return true; }

CudaCounters cuda_counters() { return cuda::counters(); }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

int cuda_select_device(int world_rank) {
  int local = world_rank;
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* s = std::getenv(v)) {
      local = std::atoi(s);
      break;
    }
  const int n = cuda_device_count();
  HMLA_CHECK(n > 0, Error, "no CUDA device is visible to rank ", world_rank);
  check_cuda(cudaSetDevice(local % n), "cudaSetDevice");
  return local % n;
}

std::string cuda_device_name(int device) {
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  return prop.name;
}

}  // namespace hmla
