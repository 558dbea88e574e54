// prepare-data's writer (prepare.h): inputs read as documents (text/corpus.h) or a Megatron
// dataset's ids, tokenized in batches on several threads and emitted in input order, spilled to
// unnamed temporaries, then hashed and assembled into the two token files, each written atomically.
#include "hmla/data/prepare.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <memory>
#include <optional>
#include <ostream>
#include <sstream>
#include <thread>

#include "hmla/data/fingerprint.h"
#include "hmla/io/paths.h"
#include "hmla/io/safetensors.h"
#include "hmla/text/corpus.h"
#include "hmla/text/megatron.h"

namespace hmla {

namespace {

namespace fs = std::filesystem;

// prepare-data's --out: a new path or a directory whose token files may be replaced.
void check_output_dir(const fs::path& out) {
  std::error_code ec;
  const fs::file_type t = fs::status(out, ec).type();
  if (t == fs::file_type::not_found) return;
  HMLA_CHECK(t == fs::file_type::directory, IoError, "prepare-data: --out ", out.string(),
             " exists and is not a directory (nothing was written)");
  for (const char* f : {"train.safetensors", "heldout.safetensors"})
    io::check_output_file((out / f).string(), "prepare-data: --out");
}

// An unnamed temporary in `dir` (O_TMPFILE: it vanishes with the process, however it ends),
// written through a buffer and read back from the start.
class Spill {
 public:
  explicit Spill(const fs::path& dir) {
    fd_ = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd_ < 0) {  // a file system without O_TMPFILE: a named file, unlinked at once
      std::string name = (dir / (".prepare-data.spill.XXXXXX")).string();
      fd_ = ::mkostemp(name.data(), O_CLOEXEC);
      if (fd_ >= 0) ::unlink(name.c_str());
    }
    HMLA_CHECK(fd_ >= 0, IoError, "prepare-data: cannot create a temporary file in ", dir.string(), " (",
               std::strerror(errno), ")");
  }
  ~Spill() { ::close(fd_); }
  Spill(const Spill&) = delete;
  Spill& operator=(const Spill&) = delete;
  void write(const void* p, size_t n) {
    const auto* c = static_cast<const char*>(p);
    buf_.insert(buf_.end(), c, c + n);
    if (buf_.size() >= (1 << 20)) flush();
  }
  void flush() {
    for (size_t done = 0; done < buf_.size();) {
      const ssize_t k = ::write(fd_, buf_.data() + done, buf_.size() - done);
      if (k < 0 && errno == EINTR) continue;
      HMLA_CHECK(k > 0, IoError, "prepare-data: writing a temporary file failed (", std::strerror(errno), ")");
      done += size_t(k);
    }
    size_ += buf_.size();
    buf_.clear();
  }
  uint64_t size() const { return size_ + buf_.size(); }
  // Calls f(chunk, n) over the whole content, in order.
  void replay(const std::function<void(const char*, size_t)>& f) {
    flush();
    std::vector<char> chunk(1 << 20);
    for (uint64_t at = 0; at < size_;) {
      const ssize_t k = ::pread(fd_, chunk.data(), std::min<uint64_t>(chunk.size(), size_ - at), off_t(at));
      if (k < 0 && errno == EINTR) continue;
      HMLA_CHECK(k > 0, IoError, "prepare-data: reading a temporary file back failed (", std::strerror(errno), ")");
      f(chunk.data(), size_t(k));
      at += uint64_t(k);
    }
  }

 private:
  int fd_ = -1;
  std::vector<char> buf_;
  uint64_t size_ = 0;
};

// One output set on its way to disk: tokens and document ends, each in its own spill.
struct SetWriter {
  explicit SetWriter(const fs::path& dir) : tokens(dir), offsets(dir) {
    const int64_t zero = 0;
    offsets.write(&zero, sizeof zero);
  }
  void add(const int32_t* ids, int64_t n) {
    tokens.write(ids, size_t(n) * sizeof(int32_t));
    count += n;
    ++docs;
    offsets.write(&count, sizeof count);
  }
  Spill tokens, offsets;
  int64_t count = 0, docs = 0;
};

void write_set(const std::string& path, SetWriter& w, const io::Metadata& metadata) {
  const std::map<std::string, io::TensorEntry> entries{
      {"doc_offsets", {"I64", {w.docs + 1}, uint64_t(w.docs + 1) * sizeof(int64_t)}},
      {"tokens", {"I32", {w.count}, uint64_t(w.count) * sizeof(int32_t)}}};
  io::AtomicFile f(path);
  const std::string header = io::safetensors_header(entries, metadata);
  f.write(header.data(), header.size());
  w.offsets.replay([&](const char* p, size_t n) { f.write(p, n); });  // "doc_offsets" < "tokens"
  w.tokens.replay([&](const char* p, size_t n) { f.write(p, n); });
  f.commit();
}

bool blank(const std::string& text) { return text.find_first_not_of(" \t\r\n") == std::string::npos; }

// The progress line (a terminal only) and the summary line.
class Progress {
 public:
  Progress(bool on, uint64_t total) : on_(on && ::isatty(2)), total_(total), start_(clock::now()) {}
  void update(uint64_t bytes, int64_t docs, int64_t tokens, bool force = false) {
    if (!on_) return;
    const auto now = clock::now();
    if (!force && now - last_ < std::chrono::milliseconds(250)) return;
    last_ = now;
    const double s = seconds(), mbs = bytes / 1e6 / std::max(s, 1e-9);
    std::fprintf(stderr, "\rprepare-data: %.1f MB/s, %lld documents, %lld tokens", mbs, (long long)docs,
                 (long long)tokens);
    if (total_ > 0 && bytes > 0 && bytes <= total_)
      std::fprintf(stderr, ", %.0f%%, ETA %.0f s   ", 100.0 * bytes / total_, s * (total_ - bytes) / bytes);
    std::fflush(stderr);
    shown_ = true;
  }
  void end() {
    if (shown_) std::fprintf(stderr, "\n");
  }
  double seconds() const { return std::chrono::duration<double>(clock::now() - start_).count(); }

 private:
  using clock = std::chrono::steady_clock;
  bool on_, shown_ = false;
  uint64_t total_;
  clock::time_point start_, last_{};
};

// Documents in input order, tokenized in batches on up to `threads` threads; `emit` sees every
// document's ids in order, so the output is the same for any thread count.
class Batcher {
 public:
  Batcher(const text::Tokenizer& tok, int threads, std::function<void(const int32_t*, int64_t)> emit)
      : tok_(tok), threads_(std::max(1, threads)), emit_(std::move(emit)) {}
  void add(std::string&& doc) {
    bytes_ += doc.size();
    docs_.push_back(std::move(doc));
    if (bytes_ >= kBatchBytes || docs_.size() >= kBatchDocs) run();
  }
  void run() {
    if (docs_.empty()) return;
    const size_t n = docs_.size(), parts = std::min<size_t>(size_t(threads_), n);
    // Buffers kept from batch to batch and sized up front (the byte tokenizer's ids exactly:
    // one per byte and the eos), so that memory stays what the first batches took.
    ids_.resize(size_t(threads_));
    ends_.resize(size_t(threads_));
    auto& ids = ids_;
    auto& ends = ends_;
    // Contiguous slices of about equal bytes: slice k gets the documents whose start lies in its share.
    std::vector<size_t> cut(parts + 1, n);
    cut[0] = 0;
    uint64_t acc = 0;
    size_t k = 1;
    for (size_t i = 0; i < n && k < parts; ++i) {
      if (acc >= bytes_ * k / parts) cut[k++] = i;
      acc += docs_[i].size();
    }
    for (; k < parts; ++k) cut[k] = n;
    auto work = [&](size_t p) {
      ids[p].clear();
      ends[p].clear();
      uint64_t want = 0;
      for (size_t i = cut[p]; i < cut[p + 1]; ++i) want += docs_[i].size() + 2;
      ids[p].reserve(want);
      ends[p].reserve(cut[p + 1] - cut[p]);
      for (size_t i = cut[p]; i < cut[p + 1]; ++i) {
        tok_.encode(docs_[i], true, ids[p]);
        ids[p].push_back(tok_.eos_id());
        ends[p].push_back(int64_t(ids[p].size()));
      }
    };
    std::vector<std::thread> pool;
    std::vector<std::exception_ptr> errors(parts);
    for (size_t p = 1; p < parts; ++p)
      pool.emplace_back([&, p] {
        try {
          work(p);
        } catch (...) {
          errors[p] = std::current_exception();
        }
      });
    try {
      work(0);
    } catch (...) {
      errors[0] = std::current_exception();
    }
    for (std::thread& t : pool) t.join();
    for (const auto& e : errors)
      if (e) std::rethrow_exception(e);
    for (size_t p = 0; p < parts; ++p)
      for (size_t j = 0; j < ends[p].size(); ++j) {
        const int64_t b = j ? ends[p][j - 1] : 0;
        emit_(ids[p].data() + b, ends[p][j] - b);
      }
    docs_.clear();
    bytes_ = 0;
  }

 private:
  static constexpr uint64_t kBatchBytes = 4 << 20;
  static constexpr size_t kBatchDocs = 1 << 16;
  const text::Tokenizer& tok_;
  int threads_;
  std::function<void(const int32_t*, int64_t)> emit_;
  std::vector<std::string> docs_;
  uint64_t bytes_ = 0;
  std::vector<std::vector<int32_t>> ids_;
  std::vector<std::vector<int64_t>> ends_;
};

}  // namespace

PrepareSummary prepare_data(const PrepareOptions& o) {
  HMLA_CHECK(!o.inputs.empty(), ConfigError, "prepare-data: give at least one input (a file, directory, glob or "
             "Megatron prefix)");
  HMLA_CHECK(o.heldout_every >= 2, ConfigError, "prepare-data: --heldout-every must be >= 2");
  HMLA_CHECK(!o.out_dir.empty(), ConfigError, "prepare-data: --out is empty: name the output directory");
  HMLA_CHECK(o.threads >= 1 && o.threads <= 1024, ConfigError, "prepare-data: --threads ", o.threads,
             ": it must be from 1 to 1024");
  const std::unique_ptr<text::Tokenizer> bytes = o.tokenizer ? nullptr : text::byte_tokenizer();
  const text::Tokenizer& tok = o.tokenizer ? *o.tokenizer : *bytes;
  const std::vector<text::CorpusInput> inputs = text::expand_inputs(o.inputs);
  HMLA_CHECK(!inputs.empty(), ConfigError, "prepare-data: the inputs hold no files");
  {  // a rerun over a directory that holds --out would read its own token files as text
    std::error_code e1;
    const fs::path out_abs = fs::weakly_canonical(fs::absolute(o.out_dir), e1);
    for (const text::CorpusInput& c : inputs) {
      std::error_code e2;
      const fs::path in_abs = fs::weakly_canonical(fs::absolute(c.path), e2);
      const auto [o_end, i_end] = std::mismatch(out_abs.begin(), out_abs.end(), in_abs.begin(), in_abs.end());
      HMLA_CHECK(e1 || e2 || o_end != out_abs.end(), ConfigError, "prepare-data: input ", c.path, " lies in --out ",
                 o.out_dir, "; leave the output directory out of the inputs");
    }
  }
  const auto first_megatron = std::find_if(inputs.begin(), inputs.end(), [](const text::CorpusInput& c) {
    return c.kind == text::InputKind::megatron;
  });
  const bool megatron = first_megatron != inputs.end();
  HMLA_CHECK(!megatron || inputs.size() == 1, ConfigError, "prepare-data: a Megatron dataset (", first_megatron->path,
             ") holds token ids: convert it alone, not with other inputs");
  // Validate first: the Megatron index whole and its ids, and the output directory, before
  // anything is created.
  std::optional<text::MegatronDataset> mds;
  int64_t vocab = tok.vocab_size();
  if (megatron) {
    HMLA_CHECK(!o.tokenizer, ConfigError, "prepare-data: ", inputs[0].path,
               " is a Megatron dataset: its ids are taken as stored, so --tokenizer does not apply");
    mds = text::MegatronDataset::open(inputs[0].path);
    const int64_t top = mds->max_id();
    HMLA_CHECK(o.vocab_size == 0 || top < o.vocab_size, IoError, inputs[0].path, ".bin: id ", top,
               " is not below --vocab-size ", o.vocab_size);
    vocab = o.vocab_size ? o.vocab_size : top + 1;
  }
  uint64_t total = 0;
  for (const text::CorpusInput& c : inputs) total += c.bytes;
  const fs::path out(o.out_dir);
  check_output_dir(out);
  std::error_code ec;
  const bool created = !fs::exists(out, ec);
  fs::create_directories(out, ec);
  HMLA_CHECK(!ec, IoError, "prepare-data: --out ", o.out_dir, ": cannot create the directory (", ec.message(), ")");
  PrepareSummary sum;
  try {
    SetWriter train(out), held(out);
    int64_t n = 0;
    auto emit = [&](const int32_t* ids, int64_t len) { (++n % o.heldout_every ? train : held).add(ids, len); };
    Progress progress(o.progress, total);
    text::CorpusCounts counts;
    auto tick = [&] { progress.update(counts.bytes_read, n, train.count + held.count); };
    if (mds) {
      std::vector<int32_t> ids;
      for (int64_t d = 0; d < mds->docs(); ++d) {
        const int64_t b = mds->doc_begin(d), len = mds->doc_begin(d + 1) - b;
        ids.resize(size_t(len));
        mds->copy(b, len, ids.data());
        emit(ids.data(), len);
        counts.bytes_read += uint64_t(len * mds->elem_size());
        tick();
      }
    } else {
      Batcher batcher(tok, o.threads, emit);
      text::CorpusOptions co{o.separator, o.text_key, o.strict};
      for (const text::CorpusInput& c : inputs)
        text::read_documents(c, co, counts, [&](std::string&& doc) {
          if (blank(doc)) return;
          batcher.add(std::move(doc));
          tick();
        });
      batcher.run();
    }
    progress.update(counts.bytes_read, n, train.count + held.count, true);
    progress.end();
    HMLA_CHECK(train.docs > 0 && held.docs > 0, ConfigError, "prepare-data: found ", n,
               " documents; need enough for both a training and a held-out set");
    FingerprintHasher h;
    for (SetWriter* w : {&train, &held}) {
      w->tokens.replay([&](const char* p, size_t k) { h.add(p, k); });
      w->offsets.replay([&](const char* p, size_t k) { h.add(p, k); });
    }
    const std::string fingerprint = h.finish(train.count, train.docs, held.count, held.docs);
    io::Metadata meta{{"tokenizer", tok.describe()}, {kFingerprintKey, fingerprint}};
    if (mds) {
      meta["tokenizer"] = "Megatron indexed dataset " + mds->prefix() + " (" + mds->dtype_name() + "), ids as stored";
      meta["tokenizer_fingerprint"] = "megatron";
      meta["vocab_size"] = std::to_string(vocab);
    } else if (tok.fingerprint() != "bytes") {  // byte-tokenizer files stay bit for bit as before
      meta["tokenizer_fingerprint"] = tok.fingerprint();
      meta["vocab_size"] = std::to_string(vocab);
    }
    // Two renames, one after the other: a run killed between them leaves a new train.safetensors
    // beside the old heldout.safetensors, which load_token_data refuses (their fingerprints differ).
    write_set((out / "train.safetensors").string(), train, meta);
    write_set((out / "heldout.safetensors").string(), held, meta);
    sum = {train.docs, held.docs, train.count, held.count, counts.bytes_read, counts.skipped(), ""};
    std::ostringstream line;
    line << "prepare-data: " << n << " documents (" << train.docs << " train, " << held.docs << " held out), "
         << train.count + held.count << " tokens from " << std::fixed << std::setprecision(1)
         << counts.bytes_read / 1e6 << " MB in " << progress.seconds() << " s";
    if (!mds && inputs.end() != std::find_if(inputs.begin(), inputs.end(), [](const text::CorpusInput& c) {
          return c.kind == text::InputKind::jsonl;
        }))
      line << "; skipped lines: " << counts.lines_invalid << " invalid JSON, " << counts.lines_missing_key
           << " without \"" << o.text_key << "\", " << counts.lines_not_string << " not a string";
    line << " -> " << o.out_dir;
    sum.line = line.str();
    if (o.log) *o.log << sum.line << "\n";
  } catch (...) {
    if (created) fs::remove(out, ec);  // only when still empty: the spills vanished with their descriptors
    throw;
  }
  return sum;
}

void prepare_data(const std::vector<std::string>& files, const std::string& out_dir, const std::string& sep,
                  int64_t heldout_every) {
  PrepareOptions o;
  o.inputs = files;
  o.out_dir = out_dir;
  o.separator = sep;
  o.heldout_every = heldout_every;
  prepare_data(o);
}

}  // namespace hmla
