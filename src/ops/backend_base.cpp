// The Backend base class's op entries: unsupported, a clear error. Its own library
// (hmla_backend) so that every backend's library can link it, whatever the link order.
#include <string>

#include "hmla/core/error.h"
#include "hmla/ops/backend.h"

namespace hmla {

namespace {
[[noreturn]] void unsupported(const Backend& b, const char* op) {
  throw ShapeError(std::string(op) + ": the " + b.name() + " backend does not run this op");
}
}  // namespace

#define HMLA_UNSUPPORTED(ret, name, P) \
  ret Backend::name(const P&) const { unsupported(*this, #name); }
HMLA_OP_LIST(HMLA_UNSUPPORTED)
#undef HMLA_UNSUPPORTED

}  // namespace hmla
