// One backend per device (ggml's backend interface, in C++): the device's memory (its allocator,
// copies, synchronisation) and its op entries, each taking the op family's params struct. The
// entry points of include/hmla/ops validate their tensors, fill the params, ask
// `supports(params)` and call the entry of backend(device). A backend overrides the ops it runs;
// the others report unsupported and throw if called.
//
// Backends: the CPU (f32, always), CUDA (bf16, in CUDA builds) and the SIMT-emulated CUDA (the
// CUDA sources compiled for the CPU; tests/cuda/emu). Adding an op: docs/ops.md.
#pragma once
#include <cstddef>
#include <string>

#include "hmla/core/allocator.h"
#include "hmla/core/error.h"
#include "hmla/ops/attention.h"
#include "hmla/ops/indexer.h"
#include "hmla/ops/nn.h"
#include "hmla/ops/op_list.h"
#include "hmla/ops/optim.h"
#include "hmla/ops/sparse_attention.h"

namespace hmla {

class Backend {
 public:
  explicit Backend(Device d) : device_(d) {}
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  Device device() const { return device_; }
  virtual const char* name() const = 0;

  // The precision policy (DESIGN.md section 4): the dtype the attention and indexer-score kernels
  // read their operands in. The model and the trainer ask it (compute_operand,
  // compute_dtype(Device)) instead of testing the device.
  virtual DType compute_dtype() const { return DType::f32; }

  // Memory: the device's allocator (exact live/peak counters), copies and synchronisation.
  Allocator& memory() const { return allocator(device_); }
  void synchronize() const { memory().synchronize(); }

  // Whether the backend runs the op on these params (dtypes, widths, shape limits): the only place
  // a backend writes its limits. One per params struct (op_list.h).
#define HMLA_SUPPORTS(P) \
  virtual bool supports(const P&) const { return false; }
  HMLA_PARAMS_LIST(HMLA_SUPPORTS)
#undef HMLA_SUPPORTS

  // Op entries, called with validated params (op_list.h; the defaults throw "does not run this
  // op"). Notable contracts: attn_sparse_check_table throws ShapeError unless every entry is -1 or
  // in [0, skv) and no row lists a key twice; the indexer KLs return kl_sum (without coeff) and
  // overwrite dqI, dkI, dw with the loss's gradients.
#define HMLA_ENTRY(ret, name, P) virtual ret name(const P& p) const;
  HMLA_OP_LIST(HMLA_ENTRY)
#undef HMLA_ENTRY

 private:
  Device device_;
};

// The backend of a device; throws hmla::Error naming the device when this build has none.
const Backend& backend(Device d);
inline DType compute_dtype(Device d) { return backend(d).compute_dtype(); }

// The one dispatch of every entry point: the backend of `dev` runs `entry` on the validated
// params if it supports them, else ShapeError "<op>: the <backend> backend does not run <why>".
template <class P, class R>
R dispatch(Device dev, R (Backend::*entry)(const P&) const, const P& p, const char* op, const std::string& why) {
  const Backend& be = backend(dev);
  if (!be.supports(p)) throw ShapeError(std::string(op) + ": the " + be.name() + " backend does not run " + why);
  return (be.*entry)(p);
}

// Tests only: for its lifetime, `b` answers backend(b.device()) (a harness's self-test runs a
// deliberately wrong backend through the real entry points; tests/common/forwarding_backend.h).
// Not nested per device, not thread-safe.
class ScopedBackendOverride {
 public:
  explicit ScopedBackendOverride(const Backend& b);
  ~ScopedBackendOverride();
  ScopedBackendOverride(const ScopedBackendOverride&) = delete;
  ScopedBackendOverride& operator=(const ScopedBackendOverride&) = delete;

 private:
  Device device_;
};

// Each backend's instance (src/cpu/backend.cpp, src/cuda/backend.cu); the CUDA one is null in a
// build without CUDA (src/ops/no_cuda.cpp).
const Backend& cpu_backend();
const Backend* cuda_backend();

}  // namespace hmla
