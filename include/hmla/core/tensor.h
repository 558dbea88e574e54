// Tensor: a typed, strided view of a block owned by a device allocator. Views share the block
// (shared ownership); shapes and strides are 64-bit and counted in elements.
#pragma once
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "hmla/core/allocator.h"
#include "hmla/core/error.h"

namespace hmla {

// f64 is no weight or activation dtype: it holds device scalars (the training step's stats buffer,
// hmla/ops/optim.h), which no kernel but the scalar ops reads.
enum class DType : uint8_t { f32, bf16, i32, i64, f64 };
size_t dtype_size(DType t);
const char* dtype_name(DType t);

// bf16 storage type (the upper 16 bits of an IEEE f32); conversions round to nearest even.
struct bf16 {
  uint16_t bits;
};
float bf16_to_f32(bf16 x);
bf16 f32_to_bf16(float x);

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<bf16>() { return DType::bf16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::i64; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

// One allocation; freed through the allocator that made it when the last view goes.
class Storage {
 public:
  Storage(size_t bytes, Device device);
  // Memory someone else owns (a torch tensor's), kept alive by `keep`; the allocator's counters
  // do not see it.
  Storage(void* data, size_t bytes, Device device, std::shared_ptr<void> keep)
      : data_(data), bytes_(bytes), device_(device), keep_(std::move(keep)) {}
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  std::shared_ptr<void> keep_;  // set: external memory, not the allocator's
};

class Tensor {
 public:
  Tensor() = default;  // undefined: holds nothing
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu);
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu);
  template <class T>
  static Tensor from_vector(const Shape& shape, const std::vector<T>& values);
  // A strided view of external memory (zero-copy: hmla.torch's operators on torch tensors);
  // `keep` owns it for as long as any view lives. Strides in elements, non-negative.
  static Tensor wrap(void* data, const Shape& shape, const Shape& strides, DType dtype, Device device,
                     std::shared_ptr<void> keep);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::cpu; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t d) const { return shape_.at(wrap(d)); }
  int64_t stride(int64_t d) const { return strides_.at(wrap(d)); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;
  // True when both views start at the same byte of the same allocation.
  bool same_data(const Tensor& o) const { return storage_ == o.storage_ && offset_ == o.offset_; }
  bool shares_storage(const Tensor& o) const { return storage_ && storage_ == o.storage_; }

  void* raw_data() const;
  template <class T> T* data() const {
    HMLA_CHECK(dtype_ == dtype_of<T>(), ShapeError, "tensor is ", dtype_name(dtype_),
               ", accessed as ", dtype_name(dtype_of<T>()));
    return static_cast<T*>(raw_data());
  }

  // Views (no copy).
  Tensor view(const Shape& shape) const;  // contiguous tensors only; one -1 entry is inferred
  Tensor slice(int64_t d, int64_t start, int64_t end) const;  // [start, end) along d
  Tensor select(int64_t d, int64_t i) const;                  // drops dimension d
  Tensor transpose(int64_t d0, int64_t d1) const;             // swaps two dimensions (a view)
  // The same bytes read as another dtype of the same size (i32 <-> f32): one packed buffer holding
  // tensors of both (the step's device batch, uploaded in one copy).
  Tensor bitcast(DType dtype) const;

  // Copies.
  Tensor clone() const;                   // contiguous copy on the same device
  Tensor to(Device device) const;         // contiguous copy on device
  Tensor on(Device device) const { return device == this->device() ? *this : to(device); }  // no copy if there
  void copy_from(const Tensor& src);      // same shape and dtype, any strides, any devices
  void fill_zero();                       // contiguous tensors only

  template <class T> std::vector<T> to_vector() const;  // contiguous CPU copy

 private:
  int64_t wrap(int64_t d) const { return d < 0 ? d + dim() : d; }
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;  // elements
  Shape shape_, strides_;
  DType dtype_ = DType::f32;
};

Shape contiguous_strides(const Shape& shape);

// The strides every kernel takes for a strided operand [outer, mid..., width] (q, k, v of the
// attention ops, the indexer KL's q and k): the last dimension contiguous; every middle dimension
// (rows, heads) at a stride in [width, 2^31), because kernels hand it to BLAS or a tile loader as a
// leading dimension (OpenBLAS rejects ld < width; its ld is an int); the outer dimension (batch) at
// any stride, a pointer offset only. A dimension of one element takes any stride: kernel_strides
// gives it the contiguous one. Entry points refuse what this rejects; hmla.torch copies it.
bool kernel_strides_ok(const Tensor& t);
Shape kernel_strides(const Tensor& t);  // t's strides, one-element dimensions made contiguous

// Flat index of the first NaN or infinity of a contiguous f32 CPU tensor, or -1 when all are finite.
int64_t first_non_finite(const Tensor& t);

template <class T>
Tensor Tensor::from_vector(const Shape& shape, const std::vector<T>& values) {
  HMLA_CHECK(shape_numel(shape) == static_cast<int64_t>(values.size()), ShapeError, "shape ",
             shape_str(shape), " needs ", shape_numel(shape), " values, got ", values.size());
  Tensor t = empty(shape, dtype_of<T>());
  if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(T));
  return t;
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  Tensor c = (is_contiguous() && device() == Device::cpu) ? *this : to(Device::cpu);
  std::vector<T> v(static_cast<size_t>(numel()));
  if (!v.empty()) std::memcpy(v.data(), c.data<T>(), v.size() * sizeof(T));
  return v;
}

}  // namespace hmla
