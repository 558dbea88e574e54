// Standard output as a checked channel (stdout.h): flushes C++'s and C's streams and turns a
// failed write into an IoError naming the system's reason.
#include "stdout.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "hmla/core/error.h"

namespace hmla::app {

void flush_stdout() {
  errno = 0;
  std::cout.flush();
  const bool ok = std::fflush(stdout) == 0 && std::cout.good() && !std::ferror(stdout);
  const int err = errno;
  HMLA_CHECK(ok, IoError, "standard output: a write failed (", err != 0 ? std::strerror(err) : "stream error",
             "); the output is incomplete");
}

}  // namespace hmla::app
