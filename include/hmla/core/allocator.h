// One allocator per device; every library allocation goes through it, and it keeps exact live
// and peak byte counters (bytes as requested, not rounded), so memory figures are deterministic.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace hmla {

enum class Device : uint8_t { cpu, cuda };
const char* device_name(Device d);

class Allocator {
 public:
  virtual ~Allocator() = default;
  void* allocate(size_t bytes);
  void deallocate(void* p, size_t bytes);
  size_t live_bytes() const { return live_.load(); }
  size_t peak_bytes() const { return peak_.load(); }
  void reset_peak() { peak_.store(live_.load()); }  // peak restarts from what is live now

 protected:
  virtual void* raw_allocate(size_t bytes) = 0;
  virtual void raw_deallocate(void* p, size_t bytes) = 0;

 private:
  std::atomic<size_t> live_{0};
  std::atomic<size_t> peak_{0};
};

// The process-wide allocator of a device. Throws hmla::Error for a device this build lacks.
Allocator& allocator(Device d);

// Registers the CUDA allocator (called by the CUDA backend's static initialiser).
void register_allocator(Device d, Allocator* a);

}  // namespace hmla
