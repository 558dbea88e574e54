// safetensors: 8-byte little-endian header length, a JSON header {name: {dtype, shape,
// data_offsets}, "__metadata__": {str: str}}, then the data block. Header lengths are bounded
// (100 MiB) and every offset is checked against the data block before any copy.
#include "hmla/io/safetensors.h"
#include "hmla/io/json_strict.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "hmla/core/size_check.h"
#include "hmla/io/paths.h"

namespace hmla::io {

namespace {

using nlohmann::json;

const char* st_dtype(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::f64: break;  // device scalars only: refused by serialize_safetensors
  }
  return "?";
}

bool parse_dtype(const std::string& s, DType& t) {
  if (s == "F32") t = DType::f32;
  else if (s == "BF16") t = DType::bf16;
  else if (s == "I32") t = DType::i32;
  else if (s == "I64") t = DType::i64;
  else return false;
  return true;
}

// The F8 types of the safetensors format. hmla reads F8_E4M3 (the FP8 weights of DeepSeek-V3.2 and
// V4, torch.float8_e4m3fn) and F8_E8M0 (V4's power-of-two block scales, torch.float8_e8m0fnu) and
// refuses the others by name: their codes mean different numbers.
bool is_f8(const std::string& s) { return s.rfind("F8_", 0) == 0; }
// The one-byte types a checkpoint's quantized weights travel in (kept as stored, checkpoint_forms.h
// dequantizes them): F8_E4M3 and F8_E8M0, I8 (DeepSeek-V4's packed FP4 experts, two e2m1 codes a
// byte) and U8 (e8m0 scales saved as bytes).
bool is_quantized(const std::string& s) { return s == "F8_E4M3" || s == "F8_E8M0" || s == "I8" || s == "U8"; }

constexpr uint64_t kMaxHeader = kMaxJsonBytes;

// The format's __metadata__: a flat map of strings to strings (what every other reader assumes;
// a nested value would be dropped or misread by them).
void read_metadata(const json& m, const std::string& what, Metadata* out) {
  HMLA_CHECK(m.is_object(), IoError, what, ": __metadata__ must be an object of strings");
  for (auto it = m.begin(); it != m.end(); ++it) {
    HMLA_CHECK(it->is_string(), IoError, what, ": __metadata__ '", it.key(), "' must be a string, got ",
               it->dump().substr(0, 60), " (safetensors metadata maps strings to strings)");
    if (out) (*out)[it.key()] = it->get<std::string>();
  }
}

}  // namespace

std::string read_file(const std::string& path, uint64_t max_bytes) {
  const int fd = open_input_file(path);
  struct stat sb {};
  ::fstat(fd, &sb);  // open_input_file stated it already
  std::string out;
  auto fail = [&](const std::string& why) {
    ::close(fd);
    throw IoError(path + ": " + why);
  };
  if (uint64_t(sb.st_size) > max_bytes)
    fail(std::to_string(sb.st_size) + " bytes, more than the " + format_bytes(double(max_bytes)) +
         " hmla reads from such a file");
  out.resize(size_t(sb.st_size));
  size_t done = 0;
  for (;;) {  // to the end of the file, which may have grown since fstat
    if (done == out.size()) {
      if (out.size() >= max_bytes) {
        char probe;
        const ssize_t n = ::read(fd, &probe, 1);
        if (n == 0) break;
        if (n > 0) fail("grew past the " + format_bytes(double(max_bytes)) + " hmla reads from such a file");
        if (errno == EINTR) continue;
        fail(std::string("read error (") + std::strerror(errno) + ")");
      }
      out.resize(std::min<uint64_t>(max_bytes, std::max<size_t>(out.size() * 2, 1 << 16)));
    }
    const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(std::string("read error (") + std::strerror(errno) + ")");
    if (n == 0) break;
    done += size_t(n);
  }
  ::close(fd);
  out.resize(done);
  return out;
}

StoredTensor stored_tensor(const Tensor& t) {
  const Tensor c = (t.is_contiguous() && t.device() == Device::cpu) ? t : t.to(Device::cpu);
  return {st_dtype(t.dtype()), t.shape(), std::string(static_cast<const char*>(c.raw_data()), c.nbytes())};
}

TensorMap parse_safetensors(const std::string& bytes, const std::string& what, Metadata* metadata, StoredMap* fp8) {
  HMLA_CHECK(bytes.size() >= 8, IoError, what, ": truncated safetensors file (", bytes.size(),
             " bytes, the header length alone needs 8)");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  HMLA_CHECK(n <= kMaxHeader, IoError, what, ": header length ", n, " exceeds 100 MiB");
  HMLA_CHECK(n <= bytes.size() - 8, IoError, what, ": header length ", n, " runs past the end of the ",
             bytes.size(), "-byte file (truncated?)");
  const json header = parse_json(bytes.substr(8, n), what + ": header");
  HMLA_CHECK(header.is_object(), IoError, what, ": the header must be a JSON object");
  const uint64_t data_size = bytes.size() - 8 - n;
  const char* data = bytes.data() + 8 + n;

  struct Span {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Span> spans;
  TensorMap out;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      read_metadata(*it, what, metadata);
      continue;
    }
    const json& e = *it;
    HMLA_CHECK(e.is_object() && e.contains("dtype") && e.contains("shape") &&
                   e.contains("data_offsets"),
               IoError, what, ": tensor '", name, "' needs dtype, shape and data_offsets");
    HMLA_CHECK(e["dtype"].is_string(), IoError, what, ": tensor '", name, "': dtype is not a string");
    DType dt = DType::i32;  // the quantized types: 1 byte an element, kept in `fp8`
    const std::string dts = e["dtype"].get<std::string>();
    const bool f8 = is_quantized(dts);
    HMLA_CHECK(!is_f8(dts) || f8, IoError, what, ": tensor '", name, "' has dtype ", dts,
               "; of the FP8 types hmla reads only F8_E4M3 (e4m3 weights) and F8_E8M0 (their block scales), as "
               "DeepSeek-V3.2 and V4 store them");
    HMLA_CHECK(!f8 || fp8 || dts == "U8" || dts == "I8", IoError, what, ": tensor '", name, "' is ", dts,
               ", which hmla reads only as a model checkpoint's quantized weight or its block scales");
    HMLA_CHECK(f8 || parse_dtype(dts, dt), IoError, what, ": tensor '", name, "' has unsupported dtype ",
               e["dtype"].dump(), " (hmla reads F32, BF16, I32, I64, and F8_E4M3 weights)");
    HMLA_CHECK(!f8 || fp8, IoError, what, ": tensor '", name, "' has unsupported dtype ", e["dtype"].dump(),
               " (hmla reads F32, BF16, I32, I64, and F8_E4M3 weights)");
    const uint64_t elem = f8 ? 1 : dtype_size(dt);
    HMLA_CHECK(e["shape"].is_array() && e["shape"].size() <= 8, IoError, what, ": tensor '", name,
               "': shape must be an array of at most 8 dimensions");
    Shape shape;
    uint64_t numel = 1;
    for (const json& d : e["shape"]) {
      HMLA_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0), IoError,
                 what, ": tensor '", name, "': dimensions must be non-negative integers");
      uint64_t v = d.get<uint64_t>();
      HMLA_CHECK(v <= data_size && (v == 0 || numel <= data_size / v), IoError, what, ": tensor '",
                 name, "': shape ", e["shape"].dump(), " is larger than the file's data");
      numel *= v;
      shape.push_back(static_cast<int64_t>(v));
    }
    const json& off = e["data_offsets"];
    HMLA_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() &&
                   off[1].is_number_unsigned(),
               IoError, what, ": tensor '", name, "': data_offsets must be two non-negative integers");
    uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
    HMLA_CHECK(b <= en && en <= data_size, IoError, what, ": tensor '", name, "': data_offsets [", b,
               ", ", en, "] outside the ", data_size, "-byte data block (truncated file?)");
    HMLA_CHECK(en - b == numel * elem, IoError, what, ": tensor '", name, "': ", en - b,
               " bytes of data for shape ", shape_str(shape), " of ", dts, " (needs ", numel * elem, ")");
    spans.push_back({b, en, name});
    if (f8) {
      (*fp8)[name] = StoredTensor{dts, shape, std::string(data + b, en - b)};
      continue;
    }
    Tensor t = Tensor::empty(shape, dt);
    if (en > b) std::memcpy(t.raw_data(), data + b, en - b);
    out.emplace(name, std::move(t));
  }
  std::sort(spans.begin(), spans.end(), [](const Span& x, const Span& y) { return x.begin < y.begin; });
  for (size_t i = 1; i < spans.size(); ++i)
    HMLA_CHECK(spans[i].begin >= spans[i - 1].end, IoError, what, ": tensors '", spans[i - 1].name,
               "' and '", spans[i].name, "' overlap in the data block");
  return out;
}

TensorMap load_safetensors(const std::string& path, Metadata* metadata, StoredMap* fp8) {
  return parse_safetensors(read_file(path), path, metadata, fp8);
}

TensorMap load_checkpoint_tensors(const std::string& path, StoredMap* fp8) {
  namespace fs = std::filesystem;
  fs::path p(path);
  if (fs::is_directory(p)) {
    if (fs::exists(p / "model.safetensors.index.json"))
      return load_checkpoint_tensors((p / "model.safetensors.index.json").string(), fp8);
    HMLA_CHECK(fs::exists(p / "model.safetensors"), IoError, path,
               ": neither model.safetensors nor model.safetensors.index.json is there");
    return load_safetensors((p / "model.safetensors").string(), nullptr, fp8);
  }
  if (p.extension() != ".json") return load_safetensors(path, nullptr, fp8);
  const json index = load_json(path);
  HMLA_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(), IoError,
             path, ": a sharded index needs a \"weight_map\" object");
  std::map<std::string, std::vector<std::string>> by_shard;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    HMLA_CHECK(it->is_string(), IoError, path, ": weight_map entry '", it.key(), "' must name a file");
    const std::string shard = it->get<std::string>();
    HMLA_CHECK(shard.find('/') == std::string::npos && shard != ".." && !shard.empty(), IoError, path,
               ": shard '", shard, "' must be a file name in the index's directory");
    by_shard[shard].push_back(it.key());
  }
  TensorMap out;
  for (const auto& [shard, names] : by_shard) {
    const std::string shard_path = (p.parent_path() / shard).string();
    StoredMap f8;
    TensorMap m = load_safetensors(shard_path, nullptr, fp8 ? &f8 : nullptr);
    for (const std::string& name : names) {
      auto it = m.find(name);
      auto st = f8.find(name);
      HMLA_CHECK(it != m.end() || st != f8.end(), IoError, path, ": tensor '", name, "' is listed in ", shard,
                 " but not stored there");
      if (it != m.end()) out[name] = it->second;
      else (*fp8)[name] = st->second;
    }
  }
  return out;
}

std::string serialize_safetensors(const TensorMap& tensors, const std::map<std::string, std::string>& metadata,
                                  const StoredMap& stored) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    HMLA_CHECK(t.defined(), IoError, "safetensors: tensor '", name, "' is undefined");
    HMLA_CHECK(t.dtype() != DType::f64, IoError, "safetensors: tensor '", name,
               "' is f64, which hmla stores in no file (f32, bf16, i32 and i64 are)");
    header[name] = {{"dtype", st_dtype(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  for (const auto& [name, t] : stored) {
    HMLA_CHECK(!tensors.count(name) && name != "__metadata__", IoError, "safetensors: tensor '", name,
               "' is given twice");
    header[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // align the data block to 8 bytes
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((uint64_t(h.size()) >> (8 * i)) & 0xff);
  out += h;
  out.reserve(out.size() + offset);
  for (const auto& [name, t] : tensors) {
    Tensor c = (t.is_contiguous() && t.device() == Device::cpu) ? t : t.to(Device::cpu);
    out.append(static_cast<const char*>(c.raw_data()), c.nbytes());
  }
  for (const auto& [name, t] : stored) out += t.bytes;
  return out;
}

namespace {

namespace fs = std::filesystem;

// Creates `tmp` for writing, never through an existing entry (O_EXCL | O_NOFOLLOW): a stale
// temporary of an earlier process with the same pid is removed first, whatever it is. The writer
// holds an flock on it until it is renamed, so that remove_stale_temporaries can tell it is live.
int create_temporary(const fs::path& tmp) {
  const int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  int fd = ::open(tmp.c_str(), flags, 0644);
  if (fd < 0 && errno == EEXIST) {
    std::error_code ec;
    fs::remove(tmp, ec);
    fd = ::open(tmp.c_str(), flags, 0644);
  }
  HMLA_CHECK(fd >= 0, IoError, tmp.string(), ": cannot open for writing (", std::strerror(errno), ")");
  ::flock(fd, LOCK_EX | LOCK_NB);  // a fresh file: nobody else can hold it
  return fd;
}

bool pid_is_dead(long pid) { return ::kill(pid_t(pid), 0) != 0 && errno == ESRCH; }

// A writer killed between creating and renaming its temporary leaves `.<name>.tmp.<pid>` beside
// the target; the next writer of that target removes it. Only a regular file whose pid no longer
// exists here and that no process holds locked (a writer on another host of a shared directory
// holds its lock) is removed: never a live writer's file, never anything the name did not come from.
void remove_stale_temporaries(const fs::path& dir, const std::string& name) {
  const std::string prefix = "." + name + ".tmp.";
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    if (n.size() <= prefix.size() || n.size() > prefix.size() + 9 || n.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string digits = n.substr(prefix.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos || digits[0] == '0') continue;
    const long pid = std::stol(digits);
    if (pid == long(::getpid()) || !pid_is_dead(pid)) continue;
    const int fd = ::open(it->path().c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat sb {};
    if (::fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && ::flock(fd, LOCK_EX | LOCK_NB) == 0)
      ::unlink(it->path().c_str());
    ::close(fd);
  }
}

bool write_all(int fd, const std::string& bytes) {
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += size_t(n);
  }
  return true;
}

// The rename is durable only once the directory entry is on disk. EINVAL: a file system that
// cannot sync directories (nothing more can be done there).
void sync_directory(const fs::path& dir, const std::string& path) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  const bool synced = fd >= 0 && (::fsync(fd) == 0 || errno == EINVAL);
  const int err = errno;
  if (fd >= 0) ::close(fd);
  HMLA_CHECK(synced, IoError, path, ": written, but its directory ", dir.string(), " could not be synced (",
             std::strerror(err), "); a power loss now could still lose it");
}

}  // namespace

void write_file_atomic(const std::string& path, const std::string& bytes) {
  check_output_file(path, "");  // every writer refuses FIFOs, symlinks, devices and directories
  fs::path target(path);
  fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  remove_stale_temporaries(dir, target.filename().string());
  std::string name = target.filename().string();
  name.insert(0, 1, '.');
  name.append(".tmp.").append(std::to_string(::getpid()));
  const fs::path tmp = dir / name;
  const int fd = create_temporary(tmp);
  // fsync before the rename: without it a power loss can leave the new name on an empty or
  // partial file, losing the old contents the temporary was there to protect.
  const bool written = write_all(fd, bytes) && ::fsync(fd) == 0;
  const int write_errno = errno;
  const int lock = ::dup(fd);  // holds the temporary's lock through the rename (the lock is the file's)
  const bool closed = ::close(fd) == 0;  // NFS and quotas may report a failed write only here
  if (!written || !closed) {
    const std::string why = std::strerror(written ? errno : write_errno);
    std::error_code ec;
    fs::remove(tmp, ec);
    if (lock >= 0) ::close(lock);
    throw IoError(tmp.string() + ": write failed (" + why + "); " + path + " is unchanged");
  }
  std::error_code ec;
  fs::rename(tmp, target, ec);
  if (lock >= 0) ::close(lock);
  if (ec) {
    fs::remove(tmp, ec);
    throw IoError(path + ": cannot rename the temporary file into place; the old file is unchanged");
  }
  sync_directory(dir, path);
}

std::string safetensors_header(const std::map<std::string, TensorEntry>& entries, const Metadata& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, e] : entries) {
    header[name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {offset, offset + e.nbytes}}};
    offset += e.nbytes;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // align the data block to 8 bytes, as serialize_safetensors does
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((uint64_t(h.size()) >> (8 * i)) & 0xff);
  return out + h;
}

AtomicFile::AtomicFile(const std::string& path) : path_(path) {
  check_output_file(path, "");
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  remove_stale_temporaries(dir, target.filename().string());
  std::string name = target.filename().string();
  name.insert(0, 1, '.');
  name.append(".tmp.").append(std::to_string(::getpid()));
  tmp_ = (dir / name).string();
  fd_ = create_temporary(tmp_);
}

AtomicFile::~AtomicFile() {
  if (fd_ < 0) return;
  ::close(fd_);
  std::error_code ec;
  fs::remove(tmp_, ec);
}

void AtomicFile::write(const void* data, size_t n) {
  HMLA_CHECK(fd_ >= 0, IoError, path_, ": written after it was committed");
  const auto* p = static_cast<const char*>(data);
  for (size_t done = 0; done < n;) {
    const ssize_t k = ::write(fd_, p + done, n - done);
    if (k < 0 && errno == EINTR) continue;
    HMLA_CHECK(k > 0, IoError, tmp_, ": write failed (", std::strerror(errno), "); ", path_, " is unchanged");
    done += size_t(k);
  }
}

void AtomicFile::commit() {
  HMLA_CHECK(fd_ >= 0, IoError, path_, ": committed twice");
  const bool synced = ::fsync(fd_) == 0;
  const int err = errno;
  const int lock = ::dup(fd_);  // holds the temporary's lock through the rename
  const bool closed = ::close(fd_) == 0;
  fd_ = -1;
  std::error_code ec;
  if (!synced || !closed) {
    fs::remove(tmp_, ec);
    if (lock >= 0) ::close(lock);
    throw IoError(tmp_ + ": write failed (" + std::strerror(synced ? errno : err) + "); " + path_ + " is unchanged");
  }
  fs::rename(tmp_, path_, ec);
  if (lock >= 0) ::close(lock);
  if (ec) {
    fs::remove(tmp_, ec);
    throw IoError(path_ + ": cannot rename the temporary file into place; the old file is unchanged");
  }
  const fs::path target(path_);
  sync_directory(target.has_parent_path() ? target.parent_path() : fs::path("."), path_);
}

void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata, const StoredMap& stored) {
  write_file_atomic(path, serialize_safetensors(tensors, metadata, stored));
}

}  // namespace hmla::io
