// What hmla may read and write, and where: every file it reads is a regular file (never a FIFO or
// device node that would block or never end), every file it writes is a regular file or a new
// path (never a FIFO, symlink, device node or directory that happens to sit at the user's --out),
// names that become path components stay one plain component, and an exclusive lock (flock)
// marks a file as one process's. write_file_atomic and save_safetensors check their target themselves, so every
// writer, including a new command's, refuses what it does not own.
#pragma once
#include <string>
#include <utility>

namespace hmla::io {

// Opens `path` for reading (a descriptor the caller closes) when it is a regular file or a symlink
// to one; IoError "<path> is a FIFO; hmla reads only regular files" for a FIFO, directory, device
// node or socket, decided before any read: a FIFO without a writer blocks forever, a directory
// reads as empty, /dev/zero never ends. io::read_file, and so every input hmla reads, opens here.
int open_input_file(const std::string& path);

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
// file itself stays (deleting a lock file races with the next locker). The holder writes a line
// naming itself into it (announce) once it starts changing what the lock guards, so that taking
// the lock for a run that is then refused changes nothing; a refused locker reports that line.
class FileLock {
 public:
  FileLock() = default;  // holds nothing
  // Creates `path` if needed and takes the lock without waiting. Throws IoError naming the
  // current holder when another process holds it; `what` names the guarded thing for the user.
  static FileLock acquire(const std::string& path, const std::string& what);
  // Throws the same IoError as acquire when another process holds the lock on `path`; creates
  // and writes nothing (a missing file is free), so a caller can report a busy directory first.
  static void check_free(const std::string& path, const std::string& what);
  // Replaces the file's content with `holder` (one line); the lock must be held.
  void announce(const std::string& holder);
  FileLock(FileLock&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }
  FileLock& operator=(FileLock&& o) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock();
  bool held() const { return fd_ >= 0; }

 private:
  FileLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

// "pid 1234 on host h since 2025-01-31T12:00:00Z": who this process is, for lock files.
std::string process_identity();
// False when `identity` (as process_identity writes it) names a process of this host that no
// longer exists: a lock file still naming its previous holder while a new one starts up.
bool names_live_process(const std::string& identity);

}  // namespace hmla::io
