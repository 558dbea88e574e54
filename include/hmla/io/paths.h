// What hmla may write and where: every file it writes is a regular file or a new path (never a
// FIFO, symlink, device node or directory that happens to sit at the user's --out), names that
// become path components stay one plain component, and an exclusive lock (flock) marks a file as
// one process's. write_file_atomic and save_safetensors check their target themselves, so every
// writer, including a new command's, refuses what it does not own.
#pragma once
#include <string>

namespace hmla::io {

// Throws IoError unless `path` is a regular file (not a symlink to one: the rename would replace
// the link) or does not exist in an existing, writable directory. `what` names the path for the
// user (e.g. "--out"). Commands call it before they compute so that a refusal costs nothing.
void check_output_file(const std::string& path, const std::string& what);

// A plain name stays one component inside its directory: 1 to max_length characters of
// [A-Za-z0-9_.-], not starting with '.' (hidden files and the temporaries hmla writes next to
// its outputs) and without "..". Phase names become checkpoint directories and
// checkpoints/latest names one; both are checked with this rule.
inline constexpr size_t kMaxNameLength = 64;
bool is_plain_name(const std::string& name, size_t max_length = kMaxNameLength);
std::string plain_name_rule(size_t max_length = kMaxNameLength);  // the rule, for messages
// Throws IoError naming `what` unless is_plain_name(name, max_length).
void check_path_name(const std::string& name, const std::string& what, size_t max_length = kMaxNameLength);

// An exclusive advisory lock (flock) on a file, held until destruction. The kernel releases it
// when the process dies however it dies, so a lock left by a dead process never blocks; the
// file itself stays (deleting a lock file races with the next locker) and holds a line naming
// the holder, which a refused locker reports.
class FileLock {
 public:
  FileLock() = default;  // holds nothing
  // Creates `path` if needed and takes the lock without waiting; on success writes `holder`
  // into the file. Throws IoError naming the current holder when another process holds it.
  static FileLock acquire(const std::string& path, const std::string& holder, const std::string& what);
  // Throws the same IoError as acquire when another process holds the lock on `path`; creates
  // and writes nothing (a missing file is free), so a caller can report a busy directory first.
  static void check_free(const std::string& path, const std::string& what);
  FileLock(FileLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  FileLock& operator=(FileLock&& o) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock();
  bool held() const { return fd_ >= 0; }

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

// "pid 1234 on host h since 2025-01-31T12:00:00Z": who this process is, for lock files.
std::string process_identity();

}  // namespace hmla::io
