// Corpus readers (corpus.h): argument expansion, a chunked byte source (plain or zstd), line
// splitting, and the two document rules (separator lines; JSON Lines parsed by simdjson's DOM
// parser, which validates a whole line, so a truncated line is invalid even when its key is intact).
#include "hmla/text/corpus.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <simdjson.h>

#include "hmla/core/error.h"
#include "hmla/io/paths.h"

namespace hmla::text {

namespace fs = std::filesystem;

bool megatron_prefix(const std::string& arg, std::string& prefix);

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

bool is_regular(const std::string& p) {
  struct stat sb {};
  return ::stat(p.c_str(), &sb) == 0 && S_ISREG(sb.st_mode);
}

uint64_t file_size(const std::string& p) {
  struct stat sb {};
  return ::stat(p.c_str(), &sb) == 0 ? uint64_t(sb.st_size) : 0;
}

void add_file(const std::string& path, std::vector<CorpusInput>& out) {
  std::string prefix;
  if ((ends_with(path, ".idx") || ends_with(path, ".bin")) && megatron_prefix(path, prefix)) {
    for (const CorpusInput& c : out)
      if (c.kind == InputKind::megatron && c.path == prefix) return;  // its other half came first
    out.push_back({prefix, InputKind::megatron, false, file_size(prefix + ".bin")});
    return;
  }
  CorpusInput c{path, InputKind::text, ends_with(path, ".zst"), file_size(path)};
  if (ends_with(path, ".jsonl") || ends_with(path, ".jsonl.zst")) c.kind = InputKind::jsonl;
  out.push_back(c);
}

void add_directory(const std::string& dir, std::vector<CorpusInput>& out) {
  std::vector<std::string> files;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.empty() && name[0] == '.') {  // hidden: hmla's own temporaries among them
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file(ec)) files.push_back(it->path().string());
  }
  HMLA_CHECK(!ec, IoError, dir, ": cannot list the directory (", ec.message(), ")");
  std::sort(files.begin(), files.end());
  for (const std::string& f : files) add_file(f, out);
}

void add_argument(const std::string& arg, std::vector<CorpusInput>& out, bool from_glob) {
  std::error_code ec;
  const fs::file_type t = fs::status(arg, ec).type();
  std::string prefix;
  if (t == fs::file_type::directory) return add_directory(arg, out);
  if (t == fs::file_type::not_found && megatron_prefix(arg, prefix))
    return out.push_back({prefix, InputKind::megatron, false, file_size(prefix + ".bin")});
  if (t == fs::file_type::not_found && !from_glob && arg.find_first_of("*?[") != std::string::npos) {
    glob_t g{};
    const int rc = ::glob(arg.c_str(), GLOB_NOSORT, nullptr, &g);
    std::vector<std::string> matches(g.gl_pathv, g.gl_pathv + (rc == 0 ? g.gl_pathc : 0));
    ::globfree(&g);
    HMLA_CHECK(!matches.empty(), ConfigError, "prepare-data: ", arg, " matches no file");
    std::sort(matches.begin(), matches.end());  // byte order, whatever the locale
    for (const std::string& m : matches) add_argument(m, out, true);
    return;
  }
  HMLA_CHECK(t != fs::file_type::not_found, ConfigError, "prepare-data: ", arg,
             " does not exist (name a file, a directory, a glob or a Megatron PREFIX with PREFIX.bin and PREFIX.idx)");
  ::close(io::open_input_file(arg));  // a FIFO, device node or socket: IoError before anything is read
  add_file(arg, out);
}

// Bytes of a file in chunks, decompressed when it is zstd.
class ByteSource {
 public:
  ByteSource(const CorpusInput& in, CorpusCounts& counts)
      : path_(in.path), counts_(counts), fd_(io::open_input_file(in.path)) {
    if (in.zstd) {
      dctx_ = ZSTD_createDCtx();
      HMLA_CHECK(dctx_, IoError, path_, ": cannot create a zstd decoder");
      raw_.resize(ZSTD_DStreamInSize());
    }
  }
  ~ByteSource() {
    ::close(fd_);
    if (dctx_) ZSTD_freeDCtx(dctx_);
  }
  ByteSource(const ByteSource&) = delete;
  ByteSource& operator=(const ByteSource&) = delete;

  // Fills buf with up to n bytes; 0 at the end.
  size_t read(char* buf, size_t n) {
    if (!dctx_) return read_raw(buf, n);
    for (;;) {
      if (in_.pos == in_.size) {
        const size_t k = read_raw(raw_.data(), raw_.size());
        if (k == 0) {
          HMLA_CHECK(frame_done_, IoError, path_, ": truncated zstd data (the last frame ends early)");
          return 0;
        }
        in_ = {raw_.data(), k, 0};
      }
      ZSTD_outBuffer out{buf, n, 0};
      const size_t rc = ZSTD_decompressStream(dctx_, &out, &in_);
      HMLA_CHECK(!ZSTD_isError(rc), IoError, path_, ": corrupt zstd data (", ZSTD_getErrorName(rc), ")");
      frame_done_ = rc == 0;
      if (out.pos > 0) return out.pos;
    }
  }

 private:
  size_t read_raw(char* buf, size_t n) {
    for (;;) {
      const ssize_t k = ::read(fd_, buf, n);
      if (k < 0 && errno == EINTR) continue;
      HMLA_CHECK(k >= 0, IoError, path_, ": read error (", std::strerror(errno), ")");
      counts_.bytes_read += uint64_t(k);
      return size_t(k);
    }
  }
  std::string path_;
  CorpusCounts& counts_;
  int fd_;
  ZSTD_DCtx* dctx_ = nullptr;
  std::vector<char> raw_;
  ZSTD_inBuffer in_{nullptr, 0, 0};
  bool frame_done_ = true;  // no frame begun: an empty .zst file is empty
};

// Calls line(text without '\n') for every line, as std::getline splits: a last line without a
// newline still counts, an empty file has none.
void for_each_line(ByteSource& src, const std::function<void(std::string_view)>& line) {
  std::vector<char> buf(1 << 20);
  std::string carry;
  for (size_t n; (n = src.read(buf.data(), buf.size())) > 0;) {
    std::string_view chunk(buf.data(), n);
    for (size_t nl; (nl = chunk.find('\n')) != std::string_view::npos; chunk.remove_prefix(nl + 1)) {
      if (carry.empty()) {
        line(chunk.substr(0, nl));
      } else {
        carry.append(chunk.substr(0, nl));
        line(carry);
        carry.clear();
      }
    }
    carry.append(chunk);
  }
  if (!carry.empty()) line(carry);
}

}  // namespace

bool megatron_prefix(const std::string& arg, std::string& prefix) {
  std::string p = arg;
  if (ends_with(p, ".idx") || ends_with(p, ".bin")) p.resize(p.size() - 4);
  if (!is_regular(p + ".idx") || !is_regular(p + ".bin")) return false;
  prefix = p;
  return true;
}

std::vector<CorpusInput> expand_inputs(const std::vector<std::string>& args) {
  std::vector<CorpusInput> out;
  for (const std::string& a : args) add_argument(a, out, false);
  return out;
}

void read_documents(const CorpusInput& in, const CorpusOptions& opt, CorpusCounts& counts,
                    const std::function<void(std::string&&)>& doc) {
  HMLA_CHECK(in.kind != InputKind::megatron, ConfigError, in.path, ": a Megatron dataset holds token ids, not text");
  ByteSource src(in, counts);
  if (in.kind == InputKind::text) {
    std::string d;
    for_each_line(src, [&](std::string_view line) {
      if (line == opt.separator) {
        doc(std::move(d));
        d.clear();
      } else {
        d.append(line).push_back('\n');
      }
    });
    doc(std::move(d));
    return;
  }
  simdjson::dom::parser parser;
  int64_t number = 0;
  auto skip = [&](int64_t& counter, const std::string& why) {
    HMLA_CHECK(!opt.strict, IoError, in.path, ":", number, ": ", why, " (--strict)");
    ++counter;
  };
  for_each_line(src, [&](std::string_view line) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) return;
    simdjson::dom::element root;
    if (parser.parse(line.data(), line.size(), true).get(root) != simdjson::SUCCESS || !root.is_object())
      return skip(counts.lines_invalid, "not a JSON object");
    simdjson::dom::element value;
    if (root[opt.text_key].get(value) != simdjson::SUCCESS)
      return skip(counts.lines_missing_key, "no \"" + opt.text_key + "\" member");
    std::string_view text;
    if (value.get(text) != simdjson::SUCCESS)
      return skip(counts.lines_not_string, "\"" + opt.text_key + "\" is not a string");
    doc(std::string(text));
  });
}

}  // namespace hmla::text
