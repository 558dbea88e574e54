// CPU allocator: 64-byte aligned (cache line, AVX-512 vector) blocks with exact byte counters.
#include "hmla/core/allocator.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "hmla/core/error.h"

namespace hmla {

const char* device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

void* Allocator::allocate(size_t bytes) {
  void* p = raw_allocate(bytes);
  size_t live = live_.fetch_add(bytes) + bytes;
  size_t peak = peak_.load();
  while (live > peak && !peak_.compare_exchange_weak(peak, live)) {
  }
  return p;
}

void Allocator::deallocate(void* p, size_t bytes) {
  if (!p) return;
  raw_deallocate(p, bytes);
  live_.fetch_sub(bytes);
}

void Allocator::copy_strided(void*, const int64_t*, const void*, const int64_t*, const int64_t*, int, size_t) {
  throw Error("this device's allocator has no strided copy");
}
void Allocator::zero(void*, size_t) { throw Error("this device's allocator cannot zero memory"); }

namespace {

class CpuAllocator final : public Allocator {
 protected:
  void* raw_allocate(size_t bytes) override {
    constexpr size_t align = 64;
    size_t rounded = (bytes + align - 1) / align * align;
    void* p = std::aligned_alloc(align, rounded == 0 ? align : rounded);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void raw_deallocate(void* p, size_t) override { std::free(p); }

 public:
  void copy(void* dst, Device, const void* src, Device, size_t bytes) override { std::memcpy(dst, src, bytes); }
};

Allocator* g_cuda = nullptr;

}  // namespace

void register_allocator(Device d, Allocator* a) {
  HMLA_CHECK(d == Device::cuda, Error, "only the CUDA allocator can be registered");
  g_cuda = a;
}

Allocator& allocator(Device d) {
  static CpuAllocator cpu;
  if (d == Device::cpu) return cpu;
  HMLA_CHECK(g_cuda != nullptr, Error,
             "device cuda: this build of hmla has no CUDA backend (rebuild with nvcc on PATH)");
  return *g_cuda;
}

void device_copy(void* dst, Device dd, const void* src, Device sd, size_t bytes) {
  allocator(dd != Device::cpu ? dd : sd).copy(dst, dd, src, sd, bytes);
}

}  // namespace hmla
