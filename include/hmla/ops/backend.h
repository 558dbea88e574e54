// One backend per device (ggml's backend interface, in C++): the device's memory (its allocator,
// copies, synchronisation) and its op entries, each taking the op family's params struct. The
// entry points of include/hmla/ops validate their tensors, fill the params and dispatch(device,
// Op, params): the backend's plan for the op names the variant that runs, or why none does. A
// backend overrides the ops it runs; the others report unsupported and throw if called.
//
// Backends: the CPU (f32, always), CUDA (bf16, in CUDA builds) and the SIMT-emulated CUDA (the
// CUDA sources compiled for the CPU; tests/cuda/emu). Adding an op: docs/ops.md.
#pragma once
#include <cstddef>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "hmla/core/allocator.h"
#include "hmla/core/error.h"
#include "hmla/core/tensor.h"
#include "hmla/ops/op_list.h"  // every family header, Op, Plan

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

  // How the backend runs `op` on these params (op_list.h's Plan: a variant, or none and why): one
  // per params struct, each backend's forwarding to its kernel families' plan functions, the only
  // place a backend writes its limits and its choice of implementation. supports() is "not none".
#define HMLA_PLAN(P) \
  virtual Plan plan(Op, const P&) const { return {}; }
  HMLA_PARAMS_LIST(HMLA_PLAN)
#undef HMLA_PLAN
  template <class P>
  bool supports(Op op, const P& p) const {
    return plan(op, p).variant != Variant::none;
  }

  // Op entries, called with validated params (op_list.h; the defaults throw "does not run this
  // op"). Notable contracts: attn_sparse_check_table throws ShapeError unless every entry is -1 or
  // in [0, skv) and no row lists a key twice; the indexer KLs return kl_sum (without coeff) and
  // overwrite dqI, dkI, dw with the loss's gradients.
#define HMLA_ENTRY(ret, name, P) virtual ret name(const P& p) const;
  HMLA_OP_LIST(HMLA_ENTRY)
#undef HMLA_ENTRY

  // The entry of `op` on p (p must be op's params struct: a ShapeError otherwise).
  template <class P>
  void run(Op op, const P& p) const {
    switch (op) {
#define HMLA_RUN(ret, name, Q)                       \
  case Op::name:                                    \
    if constexpr (std::is_same_v<P, Q>) return (void)name(p); \
    break;
      HMLA_OP_LIST(HMLA_RUN)
#undef HMLA_RUN
    }
    throw ShapeError(std::string(op_name(op)) + ": called with another op's params");
  }

 private:
  Device device_;
};

// The backend of a device; throws hmla::Error naming the device when this build has none.
const Backend& backend(Device d);
inline DType compute_dtype(Device d) { return backend(d).compute_dtype(); }

// The one dispatch of every entry point: the backend of `dev` runs `op` on the validated params
// when its plan names a variant, else ShapeError "<what>: the <backend> backend does not run
// <why>" (the plan's own why when it has one).
template <class P>
void dispatch(Device dev, Op op, const P& p, const char* what, const std::string& why) {
  const Backend& be = backend(dev);
  const Plan pl = be.plan(op, p);
  if (!pl) throw ShapeError(std::string(what) + ": the " + be.name() + " backend does not run " + (pl.why.empty() ? why : pl.why));
  be.run(op, p);
}

// The one device of every defined tensor of ts (cpu when none is): ShapeError "<what>: every
// tensor must be on one device" when they differ. The entry points whose tensors are all optional.
Device device_of(const char* what, std::initializer_list<const Tensor*> ts);

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
