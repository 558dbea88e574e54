// The run directory of `hmla train` (docs/programme.md, "Run directory"): a run owns its --out
// and nothing else. A directory is an hmla run when it holds hmla-run.json, written when a run
// claims it (or, for runs from before that marker, a checkpoints/latest). A run starts only in a
// new or empty directory (or one whose run never reached a checkpoint), resumes only an hmla
// run, never holds its own inputs, and keeps hmla-run.lock locked (flock) for its whole life.
#pragma once
#include <filesystem>
#include <string>

#include "hmla/io/paths.h"
#include "hmla/train/programme.h"

namespace hmla {

inline constexpr const char* kRunMarker = "hmla-run.json";
inline constexpr const char* kRunLock = "hmla-run.lock";

// Checks that `out` may hold this run (fresh, or resumed with `resume`), then creates it when
// new, takes its lock, checks again under the lock (another process may have got there first),
// marks it and removes the temporary checkpoint directories a killed run left behind. Every
// refusal is a ConfigError/IoError that leaves the disk as it was. The lock is held until the
// returned object is destroyed. Under MPI only rank 0 calls it (the trainer's claim_on_root).
io::FileLock claim_run_dir(const Programme& pr, const std::string& out, bool resume);

// The checkpoint `ckroot/latest` names: its content must be one plain name (io::is_plain_name)
// and a directory of that name must exist under ckroot, so `latest` never leads outside the run.
std::filesystem::path latest_checkpoint(const std::filesystem::path& ckroot);

}  // namespace hmla
