// One allocator per device; every library allocation goes through it, and it keeps exact live
// and peak byte counters (bytes as requested, not rounded), so memory figures are deterministic.
// A device's allocator is also its memory's other half: copies to, from and within it, and
// waiting for the work queued on it (the backend of src/ops adds the compute half).
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

  // Copies `bytes` contiguous bytes where one side is this allocator's device (dd or sd);
  // returns once the bytes have landed. The CPU's is memcpy.
  virtual void copy(void* dst, Device dd, const void* src, Device sd, size_t bytes) = 0;
  // Waits for every operation queued on the device.
  virtual void synchronize() {}
  // The device's memory in bytes, -1 when unknown (the CPU's budget is the machine's: size_check).
  virtual int64_t capacity() const { return -1; }
  // Within this device: dst[i] = src[i] over `shape` (dims <= kMaxStridedDims, strides in
  // elements of esize bytes), and zeroing contiguous bytes. The CPU's Tensor does both itself;
  // the base versions throw.
  static constexpr int kMaxStridedDims = 4;
  virtual void copy_strided(void* dst, const int64_t* dst_strides, const void* src, const int64_t* src_strides,
                            const int64_t* shape, int dims, size_t esize);
  virtual void zero(void* p, size_t bytes);

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

// A copy of `bytes` contiguous bytes between any two devices, by the allocator of the device
// that is not the CPU (memcpy when both are).
void device_copy(void* dst, Device dd, const void* src, Device sd, size_t bytes);

}  // namespace hmla
