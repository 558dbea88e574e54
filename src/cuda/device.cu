// CUDA device plumbing: the caching device allocator (behind the same live/peak counters as the
// CPU one, its blocks' reuse ordered across streams by events), the device's copies (uploads
// through pinned staging buffers), the thread's current stream (ScopedCudaStream) and the RAII
// stream and cuBLASLt handle of runtime.h.
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

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

namespace {
// The innermost open ScopedCudaStream of this thread (set: whether one is open; 0 is a stream).
struct StreamOverride {
  bool set = false;
  cudaStream_t stream = nullptr;
};
thread_local StreamOverride g_override;
}  // namespace

StreamRef current_stream() {
  if (g_override.set) return StreamRef(g_override.stream);
  thread_local Stream own;
  return StreamRef(own.get());
}

BlasLt& blaslt() {
  thread_local BlasLt h;
  return h;
}

}  // namespace cuda

ScopedCudaStream::ScopedCudaStream(uintptr_t stream)
    : had_previous_(cuda::g_override.set), previous_(reinterpret_cast<uintptr_t>(cuda::g_override.stream)) {
  cuda::g_override = {true, reinterpret_cast<cudaStream_t>(stream)};
}
ScopedCudaStream::~ScopedCudaStream() {
  cuda::g_override = {had_previous_, reinterpret_cast<cudaStream_t>(previous_)};
}

namespace {

using cuda::check;
void check_cuda(cudaError_t e, const char* what) { check(e, what); }

// cudaEventQuery's answer: done, or not yet (which is no error, though the runtime would report it
// again from cudaGetLastError: check_launch must not see it).
bool event_done(cudaEvent_t e) {
  const cudaError_t r = cudaEventQuery(e);
  if (r == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  check(r, "cudaEventQuery");
  return true;
}

// Uploads through pinned staging buffers. cudaMemcpyAsync from pageable memory (all a caller
// hands hmla) is staged by the driver, which may first wait for the stream to reach the copy: a
// hidden host synchronisation per upload. Here the host bytes go into a free pinned buffer
// (memcpy: the caller may reuse its memory at once), the copy from it is stream work, and an event
// recorded after it says when the buffer may be written again. A buffer is taken again only once
// its event completed (queried, no wait); only when all kStageBuffers are in flight does the host
// wait for the oldest (counted as a sync: it does not happen in a steady step, whose uploads are a
// few micro-batches between read-backs). Uploads larger than a buffer go in kStageBytes chunks.
class Staging {
 public:
  ~Staging() {  // at exit: whatever is in flight completes first
    for (auto& b : all_) {
      cudaEventSynchronize(b->done);
      cudaEventDestroy(b->done);
      cudaFreeHost(b->host);
    }
  }
  void upload(void* dst, const void* src, size_t bytes, cudaStream_t st) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t off = 0; off < bytes; off += cuda::kStageBytes) {
      const size_t n = std::min(cuda::kStageBytes, bytes - off);
      Buffer& b = acquire();
      std::memcpy(b.host, static_cast<const char*>(src) + off, n);
      check(cudaMemcpyAsync(static_cast<char*>(dst) + off, b.host, n, cudaMemcpyHostToDevice, st), "cudaMemcpyAsync");
      check(cudaEventRecord(b.done, st), "cudaEventRecord after a staged upload");
      busy_.push_back(&b);
    }
  }

 private:
  struct Buffer {
    void* host = nullptr;  // kStageBytes pinned
    cudaEvent_t done = nullptr;
  };
  Buffer& acquire() {
    if (idle_.empty()) reclaim();
    if (idle_.empty() && all_.size() < cuda::kStageBuffers) grow();
    if (idle_.empty()) {  // every buffer in flight: wait for the oldest
      ++cuda::counters().syncs;
      check(cudaEventSynchronize(busy_.front()->done), "cudaEventSynchronize on a staging buffer");
      idle_.push_back(busy_.front());
      busy_.pop_front();
    }
    Buffer* b = idle_.back();
    idle_.pop_back();
    return *b;
  }
  void reclaim() {  // the buffers whose copies completed (streams complete out of order)
    for (auto it = busy_.begin(); it != busy_.end();)
      if (event_done((*it)->done)) {
        idle_.push_back(*it);
        it = busy_.erase(it);
      } else {
        ++it;
      }
  }
  void grow() {
    auto b = std::make_unique<Buffer>();
    check(cudaMallocHost(&b->host, cuda::kStageBytes), "cudaMallocHost for an upload's staging buffer");
    check(cudaEventCreateWithFlags(&b->done, cudaEventDisableTiming), "cudaEventCreate");
    idle_.push_back(b.get());
    all_.push_back(std::move(b));
  }
  std::mutex mu_;
  std::vector<std::unique_ptr<Buffer>> all_;
  std::deque<Buffer*> busy_;   // copies issued, oldest first
  std::vector<Buffer*> idle_;  // free to write
};

// Freed blocks are kept by size and handed out again (a training step allocates the same sizes
// every step), so steady-state steps call cudaMalloc not at all. A request takes the smallest
// cached block of at least its (512-byte rounded) size and at most twice it; when cudaMalloc
// fails, the cache is released and the call retried once. The base class counts requested bytes.
//
// Reuse across streams. Work on one stream runs in issue order, so a block freed by work on the
// current stream may be handed out again at once to later work on that stream: whatever wrote or
// read it is ahead in the queue. Work on another stream is not behind it. So at deallocation an
// event is recorded on the freeing stream (the current stream of the freeing thread: the stream
// of the block's last use, as the caller promises, like torch's caching allocator's allocation
// stream), and a request from a different stream makes its stream wait for that event
// (cudaStreamWaitEvent: device-side, no host wait) before the block is written again. Outputs
// hmla.torch hands to torch are freed from torch's deleter under the stream of the call that made
// them (python/src/hmla_torch.cpp).
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
      order_after_free(blocks_.at(p));
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
    blocks_[p].size = size;
    return p;
  }
  void raw_deallocate(void* p, size_t) override {
    std::lock_guard<std::mutex> lock(mu_);
    Block& b = blocks_.at(p);
    record_free(b);
    free_.emplace(b.size, p);
#ifdef HMLA_CUDA_EMULATE
    emu::set_live(p, false);  // a kernel reading a freed tensor reads NaN; the schedule replay skips it
#endif
  }

 public:
  // Copies are ordered on the current stream, so a block the caching allocator hands out again is
  // never written while an earlier kernel on the stream still reads it (the stream is
  // non-blocking: plain cudaMemcpy on the legacy stream would order none of this). Only a
  // read-back waits, for the host reads its bytes next. An upload goes through a pinned staging
  // buffer (Staging), so the host may reuse its memory at once and nothing waits; a
  // device-to-device copy is just stream work. The single entry for every copy.
  void copy(void* dst, Device dd, const void* src, Device sd, size_t bytes) override {
    cudaMemcpyKind kind = dd == Device::cpu ? cudaMemcpyDeviceToHost
                          : sd == Device::cpu ? cudaMemcpyHostToDevice
                                              : cudaMemcpyDeviceToDevice;
    cudaStream_t st = cuda::current_stream().get();
    CudaCounters& c = cuda::counters();
    (kind == cudaMemcpyDeviceToHost ? c.d2h_bytes : kind == cudaMemcpyHostToDevice ? c.h2d_bytes : c.d2d_bytes) +=
        int64_t(bytes);
    if (kind == cudaMemcpyHostToDevice) {
      ++c.uploads;
      return staging_.upload(dst, src, bytes, st);
    }
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
  struct Block {
    size_t size = 0;
    cudaEvent_t freed = nullptr;  // recorded on `freed_on` when the block was last freed
    cudaStream_t freed_on = nullptr;
  };
  // The point of the freeing stream's work after the block's last use. Deallocation cannot throw:
  // if no event can be recorded, the host waits for the stream instead (counted).
  void record_free(Block& b) {
    b.freed_on = cuda::current_stream().get();
    if (!b.freed && cudaEventCreateWithFlags(&b.freed, cudaEventDisableTiming) != cudaSuccess) b.freed = nullptr;
    if (b.freed && cudaEventRecord(b.freed, b.freed_on) == cudaSuccess) return;
    cudaGetLastError();
    ++cuda::counters().syncs;
    cudaStreamSynchronize(b.freed_on);
    b.freed_on = nullptr;  // no event to wait for: the work is done
  }
  // A block handed to the current stream: after its last use, when that was on another stream.
  void order_after_free(const Block& b) {
    cudaStream_t st = cuda::current_stream().get();
    if (b.freed && b.freed_on != st) check_cuda(cudaStreamWaitEvent(st, b.freed, 0), "cudaStreamWaitEvent");
  }
  void release_locked() {
    for (auto& [size, p] : free_) {
      cudaFree(p);
      if (cudaEvent_t e = blocks_.at(p).freed) cudaEventDestroy(e);
      blocks_.erase(p);
    }
    free_.clear();
  }
  std::mutex mu_;
  std::multimap<size_t, void*> free_;  // cached blocks by size
  std::map<void*, Block> blocks_;      // every block this allocator made, by address
  Staging staging_;
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
