// A backend that forwards every question and op to another one: a test derives from it and
// overrides one entry to plant a deliberately wrong kernel (with ScopedBackendOverride), so that
// a harness shows it rejects what it is there to reject.
#pragma once
#include "hmla/ops/backend.h"

namespace hmla::testing {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(const Backend& inner) : Backend(inner.device()), inner_(inner) {}
  const char* name() const override { return inner_.name(); }
  DType compute_dtype() const override { return inner_.compute_dtype(); }
#define HMLA_FORWARD_PLANS(P) \
  Plan plan(Op op, const P& p) const override { return inner_.plan(op, p); }
  HMLA_PARAMS_LIST(HMLA_FORWARD_PLANS)
#undef HMLA_FORWARD_PLANS
#define HMLA_FORWARD_ENTRY(ret, name, P) \
  ret name(const P& p) const override { return inner_.name(p); }
  HMLA_OP_LIST(HMLA_FORWARD_ENTRY)
#undef HMLA_FORWARD_ENTRY

 protected:
  const Backend& inner_;
};

}  // namespace hmla::testing
