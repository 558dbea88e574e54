// The CPU backend: every op in f32 on host memory, through the kernels and plans of cpu_kernels.h
// (each family's plan in its kernel file).
#include "hmla/ops/backend.h"

#include "cpu_kernels.h"

namespace hmla {

namespace {

class CpuBackend final : public Backend {
 public:
  CpuBackend() : Backend(Device::cpu) {}
  const char* name() const override { return "cpu"; }

#define HMLA_CPU_PLAN(P) HMLA_FORWARD_PLAN(cpu, P)
  HMLA_PARAMS_LIST(HMLA_CPU_PLAN)
#undef HMLA_CPU_PLAN
#define HMLA_CPU_ENTRY(ret, name, P) HMLA_FORWARD(cpu, ret, name, P)
  HMLA_OP_LIST(HMLA_CPU_ENTRY)
#undef HMLA_CPU_ENTRY
};

}  // namespace

const Backend& cpu_backend() {
  static const CpuBackend b;
  return b;
}

}  // namespace hmla
