// The run directory of `hmla train` (docs/programme.md, "Run directory"): a run owns its --out
// and nothing else. A directory is an hmla run when it holds hmla-run.json, written when a run
// begins (or, for runs from before that marker, a checkpoints/latest). A run starts only in a
// new or empty directory (or one whose run never reached a checkpoint), resumes only an hmla
// run, never holds its own inputs, and keeps hmla-run.lock locked (flock) for its whole life.
#pragma once
#include <filesystem>
#include <string>

#include "hmla/io/paths.h"
#include "hmla/text/tokenizer.h"
#include "hmla/train/programme.h"

namespace hmla {

inline constexpr const char* kRunMarker = "hmla-run.json";
inline constexpr const char* kRunLock = "hmla-run.lock";

// A run directory in two steps, so that a run refused by any check (here or later, in the
// trainer) leaves the disk as it was, and the directory is created last.
class RunDir {
 public:
  RunDir() = default;  // claims nothing (the ranks other than 0)
  // Checks, changing nothing, that `out` may hold this run (fresh, or resumed with `resume`). A
  // resume also takes the lock now, so that the checkpoint is read under it, and checks again
  // (only a run from before the lock file gets one, empty). Refusals are ConfigError/IoError; a
  // held lock is reported first, naming its holder.
  static RunDir claim(const Programme& pr, const std::string& out, bool resume);
  // When every check of the run has passed, before its first write: creates a new directory,
  // takes the lock if not yet held (checking again under it: another run may have got there
  // first), writes this process into the lock file, marks the directory (kRunMarker) and removes
  // the temporary checkpoint directories a killed run left. The lock lasts until destruction.
  // The marker records where the run started (`device`, the build, BLAS) and what made its data.
  void begin(Device device = Device::cpu, const text::TokenizerRecord& tokenizer = {});

 private:
  std::string out_, programme_;
  bool resume_ = false;
  io::FileLock lock_;
};

// Whether `dir` is an hmla run: it holds kRunMarker (a regular file) or, for a run from before
// the marker, a checkpoints/latest. The rule --resume and `hmla report RUN_DIR` go by.
bool is_run_directory(const std::filesystem::path& dir);

// The checkpoint `ckroot/latest` names: its content must be one plain name (io::is_plain_name)
// and a directory of that name must exist under ckroot, so `latest` never leads outside the run.
std::filesystem::path latest_checkpoint(const std::filesystem::path& ckroot);

}  // namespace hmla
