// Typed errors. Every check on user input (shapes, configs, files, CLI) throws one of these with
// a message that says what was wrong and what to do; asserts are only for internal invariants.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace hmla {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct ShapeError : Error {  // tensors that do not fit an op's contract
  using Error::Error;
};
struct LayoutError : Error {  // document layouts that are inconsistent or do not cover s
  using Error::Error;
};
struct ConfigError : Error {
  using Error::Error;
};
struct IoError : Error {  // files: missing, truncated, malformed
  using Error::Error;
};
struct DivergenceError : Error {  // a non-finite loss, gradient or weight: the run stops, unsaved
  using Error::Error;
};

namespace detail {
template <class E, class... Args>
[[noreturn]] void throw_error(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  throw E(os.str());
}
}  // namespace detail

}  // namespace hmla

// HMLA_CHECK(cond, ErrorType, message parts...): throws ErrorType(concatenated parts) if !cond.
#define HMLA_CHECK(cond, E, ...)                          \
  do {                                                    \
    if (!(cond)) ::hmla::detail::throw_error<E>(__VA_ARGS__); \
  } while (0)
