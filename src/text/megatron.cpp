// Megatron indexed datasets (megatron.h): the .idx read and checked whole, the .bin mapped.
#include "hmla/text/megatron.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <limits>

#include "hmla/core/error.h"
#include "hmla/io/paths.h"
#include "hmla/io/safetensors.h"

namespace hmla::text {

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kHeader = 9 + 8 + 1 + 8 + 8;

// Element size of a dtype code; 0 for the float codes (6 f64, 7 f32) and unknown ones.
int element_size(int code) {
  switch (code) {
    case 1: case 2: return 1;
    case 3: case 8: return 2;
    case 4: return 4;
    case 5: return 8;
    default: return 0;
  }
}

template <class T>
T get(const std::string& b, size_t at) {
  T v;
  std::memcpy(&v, b.data() + at, sizeof v);
  return v;
}

template <class T>
void widen(const void* src, int64_t n, int32_t* out) {
  const T* p = static_cast<const T*>(src);
  for (int64_t i = 0; i < n; ++i) out[i] = int32_t(p[i]);
}

template <class T>
int64_t scan_max(const void* src, int64_t n, const std::string& what) {
  const T* p = static_cast<const T*>(src);
  int64_t m = -1;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = int64_t(p[i]);
    HMLA_CHECK(v >= 0 && v <= std::numeric_limits<int32_t>::max(), IoError, what, ": token ", i, " is ", v,
               ": ids must be from 0 to 2^31 - 1");
    m = std::max(m, v);
  }
  return m;
}

}  // namespace

MegatronDataset MegatronDataset::open(const std::string& prefix) {
  const std::string idx = prefix + ".idx", bin = prefix + ".bin";
  MegatronDataset d;
  d.prefix_ = prefix;
  struct stat sb {};
  const int fd = io::open_input_file(bin);
  ::fstat(fd, &sb);
  const uint64_t bin_bytes = uint64_t(sb.st_size);
  const uint64_t idx_size = [&] {
    struct stat si {};
    return ::stat(idx.c_str(), &si) == 0 ? uint64_t(si.st_size) : 0;
  }();
  auto fail = [&](const std::string& why) {
    ::close(fd);
    throw IoError(idx + ": " + why);
  };
  if (idx_size < kHeader) fail("truncated (" + std::to_string(idx_size) + " bytes; the header alone is 34)");
  // The arrays take 20 bytes a sequence at least: the bound keeps a lying count from allocating.
  const std::string b = io::read_file(idx, kHeader + 20 * (bin_bytes + 1) + 8 * (bin_bytes + 2));
  if (b.size() < kHeader) fail("truncated (" + std::to_string(b.size()) + " bytes; the header alone is 34)");
  if (std::memcmp(b.data(), kMagic, 9) != 0) fail("not a Megatron index (bad magic; expected \"MMIDIDX\\0\\0\")");
  const uint64_t version = get<uint64_t>(b, 9);
  if (version != 1) fail("version " + std::to_string(version) + ", hmla reads version 1");
  d.code_ = static_cast<unsigned char>(b[17]);
  d.elem_ = element_size(d.code_);
  if (d.code_ == 6 || d.code_ == 7)
    fail("dtype code " + std::to_string(d.code_) + " is a float type; token ids are integers");
  if (d.elem_ == 0) fail("unknown dtype code " + std::to_string(d.code_) + " (1 to 8)");
  const uint64_t seqs = get<uint64_t>(b, 18), docs = get<uint64_t>(b, 26);
  const uint64_t limit = uint64_t(1) << 40;
  if (seqs > limit || docs > limit) fail("sequence count " + std::to_string(seqs) + " or document count " +
                                         std::to_string(docs) + " is implausible");
  const uint64_t want = kHeader + 4 * seqs + 8 * seqs + 8 * docs;
  if (b.size() != want)
    fail(std::to_string(b.size()) + " bytes, but " + std::to_string(seqs) + " sequences and " + std::to_string(docs) +
         " document indices need " + std::to_string(want) + (b.size() < want ? " (truncated)" : ""));
  if (docs < 2) fail(std::to_string(docs) + " document indices: need at least 2 (0 and the sequence count)");
  d.pointers_.resize(seqs + 1);
  uint64_t expect = 0;
  for (uint64_t i = 0; i < seqs; ++i) {
    const int32_t len = get<int32_t>(b, kHeader + 4 * i);
    const int64_t ptr = get<int64_t>(b, kHeader + 4 * seqs + 8 * i);
    if (len < 0) fail("sequence " + std::to_string(i) + " has length " + std::to_string(len));
    if (uint64_t(ptr) != expect)
      fail("sequence " + std::to_string(i) + " points at byte " + std::to_string(ptr) +
           ", but the lengths before it x " + std::to_string(d.elem_) + " bytes put it at " + std::to_string(expect));
    d.pointers_[i] = ptr;
    expect += uint64_t(len) * uint64_t(d.elem_);
  }
  d.pointers_[seqs] = int64_t(expect);
  if (expect != bin_bytes)
    fail("the sequences hold " + std::to_string(expect) + " bytes, but " + bin + " has " + std::to_string(bin_bytes));
  d.doc_index_.resize(docs);
  for (uint64_t i = 0; i < docs; ++i) {
    const int64_t v = get<int64_t>(b, kHeader + 12 * seqs + 8 * i);
    if ((i == 0 && v != 0) || (i > 0 && v <= d.doc_index_[i - 1]))
      fail("document index " + std::to_string(i) + " is " + std::to_string(v) +
           ": they must rise strictly from 0 to the sequence count");
    d.doc_index_[i] = v;
  }
  if (uint64_t(d.doc_index_.back()) != seqs)
    fail("the document indices end at " + std::to_string(d.doc_index_.back()) + ", not at the sequence count " +
         std::to_string(seqs));
  for (int64_t k = 0; k < d.docs(); ++k)
    if (d.pointers_[d.doc_index_[k + 1]] == d.pointers_[d.doc_index_[k]])
      fail("document " + std::to_string(k) + " is empty (hmla's documents hold at least one token)");
  d.tokens_ = int64_t(bin_bytes / uint64_t(d.elem_));
  void* p = ::mmap(nullptr, bin_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  HMLA_CHECK(p != MAP_FAILED, IoError, bin, ": cannot map the file (", std::strerror(errno), ")");
  d.map_ = std::shared_ptr<const void>(p, [bin_bytes](const void* q) { ::munmap(const_cast<void*>(q), bin_bytes); });
  return d;
}

std::string MegatronDataset::dtype_name() const {
  static const char* names[] = {"?", "uint8", "int8", "int16", "int32", "int64", "float64", "float32", "uint16"};
  return names[code_];
}

void MegatronDataset::copy(int64_t begin, int64_t n, int32_t* out) const {
  const char* base = static_cast<const char*>(map_.get()) + begin * elem_;
  switch (code_) {
    case 1: return widen<uint8_t>(base, n, out);
    case 2: return widen<int8_t>(base, n, out);
    case 3: return widen<int16_t>(base, n, out);
    case 4: return widen<int32_t>(base, n, out);
    case 5: return widen<int64_t>(base, n, out);
    case 8: return widen<uint16_t>(base, n, out);
  }
}

int64_t MegatronDataset::max_id() const {
  const std::string what = prefix_ + ".bin";
  const void* p = map_.get();
  switch (code_) {
    case 1: return scan_max<uint8_t>(p, tokens_, what);
    case 2: return scan_max<int8_t>(p, tokens_, what);
    case 3: return scan_max<int16_t>(p, tokens_, what);
    case 4: return scan_max<int32_t>(p, tokens_, what);
    case 5: return scan_max<int64_t>(p, tokens_, what);
    default: return scan_max<uint16_t>(p, tokens_, what);
  }
}

}  // namespace hmla::text
