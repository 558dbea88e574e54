// What the CUDA backend reports about the machine. Without a CUDA build or a device, hmla runs
// on the CPU alone and these say so.
#pragma once
#include <cstdint>
#include <string>

namespace hmla {

bool cuda_built();            // compiled with the CUDA backend
int cuda_device_count();      // 0 without a driver or a device
std::string cuda_device_name(int device);
// Makes this process's device the GPU of its rank among the ranks on its node (Open MPI, MPICH/PMI
// or Slurm's local rank, else `world_rank`), modulo the devices; returns it. Call before anything
// is allocated on the device (the trainer does; NCCL's communicator uses the same device).
int cuda_select_device(int world_rank);

// What hmla's device work has cost the host so far in this process, counted in hmla's own calls
// (so alike on a GPU and in the SIMT emulator): host synchronisations (a stream sync, and a copy
// that waits for the stream), bytes copied host to device, device to host and device to device,
// and kernel launches (hmla's kernels and cuBLASLt products). All zero in a build without CUDA.
struct CudaCounters {
  int64_t syncs = 0, h2d_bytes = 0, d2h_bytes = 0, d2d_bytes = 0, launches = 0;
  int64_t uploads = 0;  // host-to-device copies (h2d_bytes is their total)
  CudaCounters operator-(const CudaCounters& o) const {
    return {syncs - o.syncs, h2d_bytes - o.h2d_bytes, d2h_bytes - o.d2h_bytes, d2d_bytes - o.d2d_bytes,
            launches - o.launches, uploads - o.uploads};
  }
};
CudaCounters cuda_counters();

// Makes `stream` (a cudaStream_t as an integer, 0 the legacy default stream) this thread's current
// stream for the object's lifetime, then restores the previous one (scopes nest): every kernel,
// cuBLASLt product, memset and copy hmla issues on this thread goes to it, and the caching
// allocator orders its blocks' reuse across streams (docs/cuda.md, "Streams"). Without a scope hmla
// uses a non-blocking stream of its own per thread. hmla.torch opens one around each call on
// torch's current stream, so hmla's work is ordered like any torch op. The caller keeps the stream
// alive through the scope. A build without CUDA refuses it (Error).
class ScopedCudaStream {
 public:
  explicit ScopedCudaStream(uintptr_t stream);
  ~ScopedCudaStream();
  ScopedCudaStream(const ScopedCudaStream&) = delete;
  ScopedCudaStream& operator=(const ScopedCudaStream&) = delete;

 private:
  bool had_previous_ = false;
  uintptr_t previous_ = 0;
};

}  // namespace hmla
