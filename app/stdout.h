// Standard output as a checked channel: text that cannot be written (a full disk, /dev/full, a
// closed terminal) is an error with a non-zero exit, never lost with exit 0.
#pragma once

namespace hmla::app {

// Flushes std::cout and C's stdout; IoError naming the system's reason when a write failed, now
// or at any earlier write (the stream keeps its failure).
void flush_stdout();

}  // namespace hmla::app
