// Input and output path checks, plain names and flock-based locks (include/hmla/io/paths.h). The
// output checks look at the path itself (symlink_status), never through it: a rename over a
// symlink replaces the link, and opening a FIFO or device node writes into whatever is behind it.
// Inputs are checked on the opened descriptor (fstat), so nothing can swap the file in between.
#include "hmla/io/paths.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "hmla/core/error.h"

namespace hmla::io {

namespace fs = std::filesystem;

namespace {

std::string named(const std::string& what, const std::string& path) {
  return what.empty() ? path : what + " " + path;
}

// Why a path of this type may not be written, or "" when it may.
const char* refusal(fs::file_type t) {
  switch (t) {
    case fs::file_type::regular:
    case fs::file_type::not_found: return "";
    case fs::file_type::symlink:
      return "is a symbolic link (writing would replace the link, not write its target)";
    case fs::file_type::directory: return "is a directory";
    case fs::file_type::fifo: return "is a FIFO";
    case fs::file_type::block:
    case fs::file_type::character: return "is a device node";
    case fs::file_type::socket: return "is a socket";
    default: return "is not a regular file";
  }
}

fs::file_type type_of(mode_t m) {
  if (S_ISREG(m)) return fs::file_type::regular;
  if (S_ISDIR(m)) return fs::file_type::directory;
  if (S_ISFIFO(m)) return fs::file_type::fifo;
  if (S_ISCHR(m)) return fs::file_type::character;
  if (S_ISBLK(m)) return fs::file_type::block;
  if (S_ISSOCK(m)) return fs::file_type::socket;
  return fs::file_type::unknown;
}

}  // namespace

int open_input_file(const std::string& path) {
  HMLA_CHECK(!path.empty(), IoError, "an input path is empty: name the file to read");
  // O_NONBLOCK: opening a FIFO without a writer returns at once instead of waiting for one.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  const int open_err = errno;
  struct stat sb {};
  const bool stated = fd >= 0 ? ::fstat(fd, &sb) == 0 : ::stat(path.c_str(), &sb) == 0;  // a socket fails to open
  const int err = fd >= 0 ? errno : open_err;
  if (fd < 0 || !stated || !S_ISREG(sb.st_mode)) {
    if (fd >= 0) ::close(fd);
    HMLA_CHECK(stated && (fd >= 0 || !S_ISREG(sb.st_mode)), IoError, path, ": cannot ",
               fd < 0 ? "open for reading (" : "inspect it (", std::strerror(err), ")");
    const fs::file_type t = type_of(sb.st_mode);
    throw IoError(path + ": " + (t == fs::file_type::unknown ? "is not a regular file" : refusal(t)) +
                  "; hmla reads only regular files (nothing was read)");
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // a regular file's reads block as usual
  return fd;
}

void check_output_file(const std::string& path, const std::string& what) {
  HMLA_CHECK(!path.empty(), IoError, what.empty() ? "output path" : what, " is empty: name the file to write");
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(path, ec);
  HMLA_CHECK(!ec || st.type() == fs::file_type::not_found, IoError, named(what, path), ": cannot inspect it (",
             ec.message(), ")");
  const std::string why = refusal(st.type());
  HMLA_CHECK(why.empty(), IoError, named(what, path), ": ", why,
             "; hmla writes only to a regular file or a new path (nothing was written)");
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  HMLA_CHECK(fs::is_directory(dir, ec), IoError, named(what, path), ": directory ", dir.string(), " does not exist");
  HMLA_CHECK(::access(dir.c_str(), W_OK) == 0, IoError, named(what, path), ": directory ", dir.string(),
             " is not writable (", std::strerror(errno), ")");
}

bool is_plain_name(const std::string& name, size_t max_length) {
  if (name.empty() || name.size() > max_length || name[0] == '.' || name.find("..") != std::string::npos) return false;
  for (unsigned char c : name)
    if (c >= 0x80 || !(std::isalnum(c) || c == '_' || c == '.' || c == '-')) return false;
  return true;
}

std::string plain_name_rule(size_t max_length) {
  return "1 to " + std::to_string(max_length) +
         " characters of A-Z a-z 0-9 _ . -, not starting with '.' and without '..'";
}

void check_path_name(const std::string& name, const std::string& what, size_t max_length) {
  HMLA_CHECK(is_plain_name(name, max_length), IoError, what, " '", name, "' is not a plain name (",
             plain_name_rule(max_length), ")");
}

FileLock& FileLock::operator=(FileLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    o.fd_ = -1;
  }
  return *this;
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

namespace {

// Takes the lock on `fd` (LOCK_EX or LOCK_SH) without waiting; when another process holds it,
// closes `fd` and throws an IoError that names the holder (the line it wrote into the file).
void lock_or_throw(int fd, int op, const std::string& path, const std::string& what) {
  if (::flock(fd, op | LOCK_NB) == 0) return;
  const int err = errno;
  char buf[512] = {};
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  ::close(fd);
  std::string who(buf, n > 0 ? size_t(n) : 0);
  who.erase(who.find_last_not_of(" \n") + 1);
  HMLA_CHECK(err == EWOULDBLOCK, IoError, path, ": cannot lock (", std::strerror(err), ")");
  if (who.empty()) who = "another process";
  else if (!names_live_process(who)) who = "another process, starting up (the lock file still names " + who + ")";
  throw IoError(what + " is in use by " + who + "; wait for it to end or choose another directory (nothing was changed)");
}

}  // namespace

FileLock FileLock::acquire(const std::string& path, const std::string& what) {
  // No O_TRUNC: the holder's line must survive until we own the lock (and announce ourselves).
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  HMLA_CHECK(fd >= 0, IoError, path, ": cannot open the lock file (", std::strerror(errno), ")");
  struct stat sb {};
  if (::fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    ::close(fd);
    throw IoError(path + ": the lock file is not a regular file");
  }
  lock_or_throw(fd, LOCK_EX, path, what);
  return FileLock(fd, path);
}

void FileLock::check_free(const std::string& path, const std::string& what) {
  // O_NONBLOCK: a FIFO planted at the lock's path must not hang the check (acquire refuses it).
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return;  // missing (free) or unusable: acquire reports the latter
  lock_or_throw(fd, LOCK_SH, path, what);  // shared: two probes never refuse each other
  ::close(fd);  // releases the probe's lock
}

void FileLock::announce(const std::string& holder) {
  HMLA_CHECK(fd_ >= 0, Error, "internal: announce without holding the lock on ", path_);
  const std::string line = holder + "\n";
  HMLA_CHECK(::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, line.data(), line.size(), 0) == ssize_t(line.size()), IoError,
             path_, ": cannot write the lock holder (", std::strerror(errno), ")");
}

std::string process_identity() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "?");
  char when[32] = "?";
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  if (::gmtime_r(&now, &tm)) std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return "pid " + std::to_string(::getpid()) + " on host " + host + " since " + when;
}

bool names_live_process(const std::string& identity) {
  long pid = 0;
  char host[256] = {}, here[256] = {};
  if (std::sscanf(identity.c_str(), "pid %ld on host %255s", &pid, host) != 2 || pid <= 0) return true;
  if (::gethostname(here, sizeof(here) - 1) != 0 || std::strcmp(host, here) != 0) return true;  // cannot tell
  return ::kill(pid_t(pid), 0) == 0 || errno != ESRCH;
}

}  // namespace hmla::io
