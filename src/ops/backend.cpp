// The backend registry: the CPU backend always, the CUDA one where the build has it.
#include "hmla/ops/backend.h"

#include "hmla/core/error.h"

namespace hmla {

namespace {
const Backend* g_override[2] = {nullptr, nullptr};  // by Device: ScopedBackendOverride's
}  // namespace

ScopedBackendOverride::ScopedBackendOverride(const Backend& b) : device_(b.device()) {
  HMLA_CHECK(!g_override[int(device_)], Error, "a backend override of ", device_name(device_), " is already in place");
  g_override[int(device_)] = &b;
}
ScopedBackendOverride::~ScopedBackendOverride() { g_override[int(device_)] = nullptr; }

const Backend& backend(Device d) {
  if (const Backend* o = g_override[int(d)]) return *o;
  if (d == Device::cpu) return cpu_backend();
  const Backend* b = cuda_backend();
  HMLA_CHECK(b != nullptr, Error, "device cuda: this build of hmla has no CUDA backend (rebuild with nvcc on PATH)");
  return *b;
}

Device device_of(const char* what, std::initializer_list<const Tensor*> ts) {
  Device dev = Device::cpu;
  bool first = true;
  for (const Tensor* t : ts) {
    if (!t->defined()) continue;
    if (first) dev = t->device();
    HMLA_CHECK(t->device() == dev, ShapeError, what, ": every tensor must be on one device (", device_name(dev), " and ",
               device_name(t->device()), ")");
    first = false;
  }
  return dev;
}

}  // namespace hmla
