// Tensor views, copies and dtype helpers. Device copies other than CPU<->CPU go through the
// CUDA backend's copy hook (src/cuda), so this file needs nothing but the standard library.
#include "hmla/core/tensor.h"

#include <algorithm>
#include <cmath>

#include <cstring>
#include <utility>
#include <sstream>

namespace hmla {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::f64: return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::f64: return "f64";
  }
  return "?";
}

float bf16_to_f32(bf16 x) {
  uint32_t u = static_cast<uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

bf16 f32_to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu)) return bf16{uint16_t((u >> 16) | 0x40)};  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return bf16{static_cast<uint16_t>(u >> 16)};
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s)
    HMLA_CHECK(!__builtin_mul_overflow(n, d, &n), ShapeError, "shape ", shape_str(s), " has more than 2^63 elements");
  return n;
}

Shape kernel_strides(const Tensor& t) {
  const Shape canonical = contiguous_strides(t.shape());
  Shape st = t.strides();
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) == 1) st[size_t(d)] = canonical[size_t(d)];
  return st;
}

bool kernel_strides_ok(const Tensor& t) {
  if (t.dim() == 0) return true;
  const Shape st = kernel_strides(t);
  const int64_t width = t.size(-1), last = t.dim() - 1;
  if (width > 1 && st[size_t(last)] != 1) return false;
  for (int64_t d = 1; d < last; ++d)
    if (st[size_t(d)] < std::max<int64_t>(width, 1) || st[size_t(d)] >= (int64_t(1) << 31)) return false;
  return true;
}

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    st[i] = acc;
    acc *= shape[i];
  }
  return st;
}

Storage::Storage(size_t bytes, Device device) : bytes_(bytes), device_(device) {
  data_ = allocator(device).allocate(bytes);
}
Storage::~Storage() {
  if (!keep_) allocator(device_).deallocate(data_, bytes_);
}

Tensor Tensor::wrap(void* data, const Shape& shape, const Shape& strides, DType dtype, Device device,
                    std::shared_ptr<void> keep) {
  HMLA_CHECK(keep != nullptr, ShapeError, "wrap: external memory needs an owner to keep it alive");
  HMLA_CHECK(shape.size() == strides.size(), ShapeError, "wrap: shape ", shape_str(shape), " and strides ",
             shape_str(strides), " differ in rank");
  int64_t extent = 1;  // one past the furthest element, in elements
  for (size_t d = 0; d < shape.size(); ++d) {
    HMLA_CHECK(shape[d] >= 0 && strides[d] >= 0, ShapeError, "wrap: shape ", shape_str(shape), " strides ",
               shape_str(strides), ": negative entries");
    if (shape[d] == 0) extent = 0;
    if (extent > 0) extent += (shape[d] - 1) * strides[d];
  }
  Tensor t;
  t.shape_ = shape;
  t.strides_ = strides;
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(data, size_t(extent) * dtype_size(dtype), device, std::move(keep));
  return t;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape)
    HMLA_CHECK(d >= 0, ShapeError, "negative dimension in shape ", shape_str(shape));
  Tensor t;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  int64_t bytes = 0;
  HMLA_CHECK(!__builtin_mul_overflow(shape_numel(shape), int64_t(dtype_size(dtype)), &bytes), ShapeError, "shape ",
             shape_str(shape), " of ", dtype_name(dtype), " has more than 2^63 bytes");
  t.storage_ = std::make_shared<Storage>(size_t(bytes), device);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_zero();
  return t;
}

void* Tensor::raw_data() const {
  HMLA_CHECK(defined(), ShapeError, "access to an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(dtype_size(dtype_));
}

bool Tensor::is_contiguous() const {
  int64_t acc = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] != 1 && strides_[i] != acc) return false;
    acc *= shape_[i];
  }
  return true;
}

Tensor Tensor::view(const Shape& shape) const {
  HMLA_CHECK(is_contiguous(), ShapeError, "view of a non-contiguous tensor ", shape_str(shape_));
  Shape s = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      HMLA_CHECK(infer < 0, ShapeError, "view ", shape_str(shape), ": at most one -1");
      infer = static_cast<int64_t>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) s[infer] = known == 0 ? 0 : numel() / known;
  HMLA_CHECK(shape_numel(s) == numel(), ShapeError, "cannot view ", shape_str(shape_), " as ",
             shape_str(shape));
  Tensor t = *this;
  t.shape_ = s;
  t.strides_ = contiguous_strides(s);
  return t;
}

Tensor Tensor::bitcast(DType dtype) const {
  HMLA_CHECK(dtype_size(dtype) == dtype_size(dtype_), ShapeError, "bitcast of a ", dtype_name(dtype_), " tensor to ",
             dtype_name(dtype), ": the element sizes differ");
  Tensor t = *this;
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end) const {
  d = wrap(d);
  HMLA_CHECK(d >= 0 && d < dim() && 0 <= start && start <= end && end <= shape_[d], ShapeError,
             "slice [", start, ", ", end, ") of dimension ", d, " of ", shape_str(shape_));
  Tensor t = *this;
  t.offset_ += start * strides_[d];
  t.shape_[d] = end - start;
  return t;
}

Tensor Tensor::select(int64_t d, int64_t i) const {
  d = wrap(d);
  HMLA_CHECK(d >= 0 && d < dim() && 0 <= i && i < shape_[d], ShapeError, "select ", i,
             " of dimension ", d, " of ", shape_str(shape_));
  Tensor t = *this;
  t.offset_ += i * strides_[d];
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  d0 = wrap(d0);
  d1 = wrap(d1);
  HMLA_CHECK(d0 >= 0 && d0 < dim() && d1 >= 0 && d1 < dim(), ShapeError, "transpose ", d0, ", ", d1, " of ",
             shape_str(shape_));
  Tensor t = *this;
  std::swap(t.shape_[d0], t.shape_[d1]);
  std::swap(t.strides_[d0], t.strides_[d1]);
  return t;
}

namespace {
// Strided element-wise copy on the CPU, recursing over dimensions; the innermost contiguous run
// is one memcpy.
void copy_strided(char* dst, const Shape& dst_st, const char* src, const Shape& src_st,
                  const Shape& shape, size_t esize, size_t d) {
  if (d == shape.size()) {
    std::memcpy(dst, src, esize);
    return;
  }
  if (d + 1 == shape.size() && dst_st[d] == 1 && src_st[d] == 1) {
    std::memcpy(dst, src, esize * shape[d]);
    return;
  }
  for (int64_t i = 0; i < shape[d]; ++i)
    copy_strided(dst + i * dst_st[d] * esize, dst_st, src + i * src_st[d] * esize, src_st, shape,
                 esize, d + 1);
}
}  // namespace

void Tensor::copy_from(const Tensor& src) {
  HMLA_CHECK(src.shape_ == shape_ && src.dtype_ == dtype_, ShapeError, "copy ",
             dtype_name(src.dtype_), shape_str(src.shape_), " into ", dtype_name(dtype_),
             shape_str(shape_));
  if (numel() == 0) return;
  if (device() == Device::cpu && src.device() == Device::cpu) {
    copy_strided(static_cast<char*>(raw_data()), strides_, static_cast<const char*>(src.raw_data()),
                 src.strides_, shape_, dtype_size(dtype_), 0);
    return;
  }
  if (device() == src.device()) {  // within one device: its allocator's strided copy
    Shape shape, ds, ss;  // size-1 dimensions dropped
    for (size_t d = 0; d < shape_.size(); ++d)
      if (shape_[d] != 1) shape.push_back(shape_[d]), ds.push_back(strides_[d]), ss.push_back(src.strides_[d]);
    if (shape.empty()) shape = ds = ss = {1};
    HMLA_CHECK(int(shape.size()) <= Allocator::kMaxStridedDims, ShapeError, "a copy on ", device_name(device()),
               " of ", shape_str(shape_), ": at most ", Allocator::kMaxStridedDims, " dimensions of size > 1");
    allocator(device()).copy_strided(raw_data(), ds.data(), src.raw_data(), ss.data(), shape.data(),
                                     int(shape.size()), dtype_size(dtype_));
    return;
  }
  if (!src.is_contiguous()) return copy_from(src.clone());  // contiguous on its own device first
  if (!is_contiguous()) return copy_from(src.to(device()));  // then strided on this device
  device_copy(raw_data(), device(), src.raw_data(), src.device(), nbytes());
}

Tensor Tensor::clone() const { return to(device()); }

Tensor Tensor::to(Device device) const {
  Tensor t = empty(shape_, dtype_, device);
  t.copy_from(*this);
  return t;
}

void Tensor::fill_zero() {
  HMLA_CHECK(is_contiguous(), ShapeError, "fill_zero of a non-contiguous tensor");
  if (numel() == 0) return;
  if (device() == Device::cpu) std::memset(raw_data(), 0, nbytes());
  else allocator(device()).zero(raw_data(), nbytes());
}

int64_t first_non_finite(const Tensor& t) {
  HMLA_CHECK(t.dtype() == DType::f32 && t.device() == Device::cpu && t.is_contiguous(), ShapeError,
             "first_non_finite needs a contiguous f32 CPU tensor");
  const float* x = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isfinite(x[i])) return i;
  return -1;
}

}  // namespace hmla
