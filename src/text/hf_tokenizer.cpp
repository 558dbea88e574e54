// A Hugging Face tokenizer.json of the byte-level BPE kind (DeepSeek-V3/V3.2, GLM-4.5/GLM-5): added
// tokens (a byte trie, leftmost-longest), NF* normalizers (ICU), Split/ByteLevel pre-tokenizers (PCRE2,
// UTF + UCP, JIT), BPE by merge rank (a heap over a linked list, a per-thread word cache), the
// TemplateProcessing post-processor and the ByteLevel decoder. docs/tokenizer.md lists what is refused.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "hmla/core/error.h"
#include "hmla/io/json_strict.h"
#include "hmla/io/safetensors.h"
#include "hmla/text/tokenizer.h"
#include "hmla/text/utf8.h"
#include "unicode_recent.h"

namespace hmla::text {

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr int64_t kMaxId = (int64_t(1) << 24) - 1;  // 16.7M ids: far above any released vocabulary
constexpr size_t kCacheWordBytes = 256, kCacheEntries = 1 << 18;

// GPT-2's byte <-> character table: printable Latin-1 bytes keep their code point, the others take
// 256, 257, ... in byte order.
struct ByteMap {
  std::array<char32_t, 256> to_char{};
  std::array<int16_t, 324> to_byte{};
  ByteMap() {
    to_byte.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      to_char[b] = char32_t(keep ? b : next++);
      to_byte[to_char[b]] = int16_t(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

void append_utf8(std::string& s, char32_t c) {
  if (c < 0x80) {
    s.push_back(char(c));
  } else if (c < 0x800) {
    s.push_back(char(0xC0 | (c >> 6)));
    s.push_back(char(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    s.push_back(char(0xE0 | (c >> 12)));
    s.push_back(char(0x80 | ((c >> 6) & 0x3F)));
    s.push_back(char(0x80 | (c & 0x3F)));
  } else {
    s.push_back(char(0xF0 | (c >> 18)));
    s.push_back(char(0x80 | ((c >> 12) & 0x3F)));
    s.push_back(char(0x80 | ((c >> 6) & 0x3F)));
    s.push_back(char(0x80 | (c & 0x3F)));
  }
}

// The code point at s[i] of valid UTF-8 and its length.
char32_t decode_at(std::string_view s, size_t i, size_t& len) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return len = 1, c;
  if (c < 0xE0) return len = 2, char32_t(c & 0x1F) << 6 | (s[i + 1] & 0x3F);
  if (c < 0xF0) return len = 3, char32_t(c & 0x0F) << 12 | char32_t(s[i + 1] & 0x3F) << 6 | (s[i + 2] & 0x3F);
  len = 4;
  return char32_t(c & 0x07) << 18 | char32_t(s[i + 1] & 0x3F) << 12 | char32_t(s[i + 2] & 0x3F) << 6 |
         (s[i + 3] & 0x3F);
}
// The code point that ends at s[..end) (valid UTF-8, end > 0).
char32_t decode_before(std::string_view s, size_t end, size_t& len) {
  size_t b = end - 1;
  while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
  return decode_at(s, b, len);
}

bool is_space(char32_t c) { return u_isUWhiteSpace(UChar32(c)); }  // Rust's char::is_whitespace
bool is_word(char32_t c) {  // Rust's char::is_alphanumeric, or '_'
  if (c == '_') return true;
  const int8_t t = u_charType(UChar32(c));
  return u_hasBinaryProperty(UChar32(c), UCHAR_ALPHABETIC) || t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER ||
         t == U_OTHER_NUMBER;
}

// ---- PCRE2 ----------------------------------------------------------------------------------------

// Per-thread match state (match data and JIT stack are not shareable across threads).
struct MatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 << 10, 8 << 20, nullptr);
  pcre2_match_context* ctx = pcre2_match_context_create(nullptr);
  MatchState() { pcre2_jit_stack_assign(ctx, nullptr, stack); }
  ~MatchState() {
    pcre2_match_context_free(ctx);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(data);
  }
};
MatchState& match_state() {
  thread_local MatchState m;
  return m;
}

class Regex {
 public:
  // Two compilations: the file's pattern, and (when they differ) the pattern with the code points
  // of Unicode 15.0-16.0 folded in (unicode_recent.h). The wide one is several times slower on
  // every text, so it runs only on pieces that hold such a code point; elsewhere both match alike.
  // The file's pattern compiles first, so that its errors name its own offsets.
  Regex(const std::string& pattern, const std::string& file) : narrow_(pattern, file) {
    if (const std::string w = with_recent_unicode(pattern); w != pattern) wide_ = std::make_unique<Code>(w, file);
  }
  bool widened() const { return wide_ != nullptr; }

  // The first match in s at or after `from`: [b, e); false when there is none.
  bool find(std::string_view s, size_t from, size_t& b, size_t& e, bool wide) const {
    const Code& c = wide && wide_ ? *wide_ : narrow_;
    MatchState& m = match_state();
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    const int rc = c.jit ? pcre2_jit_match(c.code, subject, s.size(), from, 0, m.data, m.ctx)
                         : pcre2_match(c.code, subject, s.size(), from, PCRE2_NO_UTF_CHECK, m.data, m.ctx);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    HMLA_CHECK(rc >= 0, IoError, "pre_tokenizer regex: PCRE2 match error ", rc, " (a text too deep for the regex)");
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.data);
    b = ov[0];
    e = ov[1];
    return true;
  }

 private:
  struct Code {
    pcre2_code* code = nullptr;
    bool jit = false;
    Code(const std::string& pattern, const std::string& file) {
      int err = 0;
      PCRE2_SIZE at = 0;
      code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                           &err, &at, nullptr);
      PCRE2_UCHAR msg[256];
      if (code == nullptr) pcre2_get_error_message(err, msg, sizeof msg);
      HMLA_CHECK(code != nullptr, IoError, file, ": pre_tokenizer regex ", json(pattern).dump(),
                 " does not compile at offset ", at, ": ", reinterpret_cast<const char*>(msg));
      jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
    }
    ~Code() { pcre2_code_free(code); }
    Code(const Code&) = delete;
    Code& operator=(const Code&) = delete;
  };
  Code narrow_;
  std::unique_ptr<Code> wide_;
};

// GPT-2's pre-tokenizer regex (ByteLevel's use_regex).
const char* const kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// ---- JSON access with file-naming errors ----------------------------------------------------------

struct Reader {
  std::string file;
  const json& at(const json& o, const char* key, const std::string& where) const {
    HMLA_CHECK(o.is_object(), IoError, file, ": ", where, " is not an object");
    auto it = o.find(key);
    HMLA_CHECK(it != o.end(), IoError, file, ": ", where, " has no '", key, "'");
    return *it;
  }
  std::string str(const json& o, const char* key, const std::string& where) const {
    const json& v = at(o, key, where);
    HMLA_CHECK(v.is_string(), IoError, file, ": ", where, ".", key, " is not a string");
    return v.get<std::string>();
  }
  bool flag(const json& o, const char* key, bool dflt) const {
    auto it = o.find(key);
    if (it == o.end() || it->is_null()) return dflt;
    HMLA_CHECK(it->is_boolean(), IoError, file, ": '", key, "' is not a boolean");
    return it->get<bool>();
  }
  std::string opt_str(const json& o, const char* key) const {
    auto it = o.find(key);
    if (it == o.end() || it->is_null()) return {};
    HMLA_CHECK(it->is_string(), IoError, file, ": '", key, "' is not a string");
    return it->get<std::string>();
  }
  int32_t id(const json& v, const std::string& what) const {
    HMLA_CHECK(v.is_number_integer(), IoError, file, ": ", what, " has id ", v.dump(), ", not an integer");
    const int64_t i = v.is_number_unsigned() ? int64_t(std::min<uint64_t>(v.get<uint64_t>(), uint64_t(kMaxId) + 1))
                                             : v.get<int64_t>();
    HMLA_CHECK(i >= 0 && i <= kMaxId, IoError, file, ": ", what, " has id ", v.dump(), ", outside [0, ", kMaxId, "]");
    return int32_t(i);
  }
};

// ---- the tokenizer --------------------------------------------------------------------------------

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct Step {  // one pre-tokenizer stage applied to every piece of the previous one
  enum Kind { kSplit, kPrefixSpace } kind = kSplit;
  std::unique_ptr<Regex> regex;  // else `literal`
  std::string literal;
  Behavior behavior = Behavior::Isolated;
  bool invert = false;
};

struct AddedToken {
  int32_t id = 0;
  std::string content, decoded;  // decoded: what decode writes (tokenizers writes a normalized token normalized)
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

// Added-token contents: a byte trie matched leftmost-longest.
class Trie {
 public:
  bool empty() const { return nodes_.size() == 1; }
  void add(std::string_view s, int32_t token) {
    int32_t n = 0;
    for (unsigned char c : s) {
      auto& kids = nodes_[n].kids;
      auto it = std::find_if(kids.begin(), kids.end(), [c](auto& k) { return k.first == c; });
      if (it == kids.end()) {
        nodes_.push_back({});
        nodes_[n].kids.emplace_back(c, int32_t(nodes_.size() - 1));
        n = int32_t(nodes_.size() - 1);
      } else {
        n = it->second;
      }
    }
    nodes_[n].token = token;
    first_[static_cast<unsigned char>(s[0])] = true;
  }
  // The longest token starting at s[i]: its length (0 when none) and index.
  size_t longest(std::string_view s, size_t i, int32_t& token) const {
    if (!first_[static_cast<unsigned char>(s[i])]) return 0;
    int32_t n = 0;
    size_t best = 0;
    for (size_t j = i; j < s.size(); ++j) {
      const auto c = static_cast<unsigned char>(s[j]);
      const auto& kids = nodes_[n].kids;
      auto it = std::find_if(kids.begin(), kids.end(), [c](auto& k) { return k.first == c; });
      if (it == kids.end()) break;
      n = it->second;
      if (nodes_[n].token >= 0) best = j + 1 - i, token = nodes_[n].token;
    }
    return best;
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> kids;
    int32_t token = -1;
  };
  std::vector<Node> nodes_{1};
  std::array<bool, 256> first_{};
};

struct Segment {
  size_t b, e;
  int32_t token;  // index into added_, or -1 for text
};

struct Sym {
  int32_t id, prev, next;
  bool alive;
};
struct Cand {
  int32_t rank, pos;
  bool operator<(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }  // min-heap
};

struct Scratch {  // per thread, per depth of the pre-tokenizer chain
  std::vector<std::vector<std::pair<size_t, size_t>>> pieces;
  std::vector<std::vector<std::pair<std::pair<size_t, size_t>, bool>>> splits;
  std::vector<std::string> prefixed;
  std::vector<Sym> syms;
  std::vector<Cand> heap;
  std::vector<int32_t> word;
  std::vector<Segment> segs, segs2;
};
Scratch& scratch(size_t depth) {
  thread_local Scratch s;
  if (s.pieces.size() < depth) {
    s.pieces.resize(depth);
    s.splits.resize(depth);
    s.prefixed.resize(depth);
  }
  return s;
}

struct WordCache {
  uint64_t owner = 0;
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, Hash, std::equal_to<>> map;
  std::vector<int32_t> ids;
  void reset(uint64_t who) {
    owner = who;
    map.clear();
    ids.clear();
  }
};

std::atomic<uint64_t> g_serial{0};

uint64_t fnv1a(std::string_view s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

class HfTokenizer final : public Tokenizer {
 public:
  HfTokenizer(const std::string& path, const std::optional<std::string>& eos_token, bool eos_required);
  using Tokenizer::encode;
  void encode(std::string_view text, bool add_special, std::vector<int32_t>& out) const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t eos_id() const override { return eos_; }
  bool is_stop(int32_t id) const override { return id == eos_; }
  std::string describe() const override {
    return "hf-bpe " + file_ + "; vocab " + std::to_string(vocab_size_) + ", eos " +
           (eos_ < 0 ? std::string("none") : eos_text_ + " (" + std::to_string(eos_) + ")");
  }
  std::string fingerprint() const override { return fingerprint_; }

 private:
  void load_normalizer(const json& n, const Reader& r);
  void load_pre_tokenizer(const json& p, const Reader& r, bool last);
  void load_model(const json& m, const Reader& r);
  void load_post_processor(const json& p, const Reader& r);
  void load_decoder(const json& d, const Reader& r);
  void resolve_eos(const std::string& path, const std::optional<std::string>& eos_token, bool required);
  int32_t token_id(std::string_view tok) const;

  std::string normalize(std::string_view s) const;
  void split_added(std::string_view s, const Trie& trie, std::vector<Segment>& segs) const;
  void encode_text(std::string_view s, std::vector<int32_t>& out) const;
  void pre_tokenize(std::string_view piece, size_t depth, std::vector<int32_t>& out) const;
  void split_piece(const Step& st, std::string_view s, std::vector<std::pair<size_t, size_t>>& pieces,
                   std::vector<std::pair<std::pair<size_t, size_t>, bool>>& marks) const;
  void bpe(std::string_view word, std::vector<int32_t>& out) const;
  void bpe_uncached(std::string_view word, std::vector<int32_t>& out) const;

  std::string file_;
  uint64_t serial_ = ++g_serial;
  // normalizer
  std::vector<const UNormalizer2*> normalizers_;
  // added tokens
  std::vector<AddedToken> added_;
  std::unordered_map<int32_t, int32_t> added_by_id_;  // id -> index into added_
  Trie raw_trie_, normalized_trie_;
  // pre-tokenizer
  std::vector<Step> steps_;
  bool byte_level_ = false;
  // model
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::unordered_map<uint64_t, uint64_t> merges_;  // (left << 32 | right) -> (rank << 32 | merged id)
  std::array<int32_t, 256> byte_ids_{};            // byte-level: the id of each byte's character, or -1
  std::unordered_map<std::string, int32_t> raw_vocab_;  // byte-level ignore_merges: token bytes -> id
  bool ignore_merges_ = false, byte_fallback_ = false, fuse_unk_ = false;
  std::string prefix_, suffix_;
  int32_t unk_ = -1;
  std::array<int32_t, 256> fallback_ids_{};
  // post-processor and decoder
  std::vector<int32_t> special_before_, special_after_;
  bool byte_level_decoder_ = false;
  // identity
  int64_t vocab_size_ = 0;
  int32_t eos_ = -1;
  std::string eos_text_, fingerprint_, bytes_;
};

// ---- loading --------------------------------------------------------------------------------------

HfTokenizer::HfTokenizer(const std::string& path, const std::optional<std::string>& eos_token, bool eos_required) {
  std::error_code ec;
  file_ = fs::is_directory(path, ec) ? (fs::path(path) / "tokenizer.json").string() : path;
  HMLA_CHECK(fs::exists(file_, ec), IoError, file_, ": no such file (a tokenizer.json or a directory holding one)");
  bytes_ = io::read_file(file_, io::kMaxJsonBytes);
  const json spec = io::parse_json(bytes_, file_);
  const Reader r{file_};
  HMLA_CHECK(spec.is_object(), IoError, file_, ": not a tokenizer.json (the top level is not an object)");
  try {
    for (const char* k : {"truncation", "padding"})
      if (auto it = spec.find(k); it != spec.end())
        HMLA_CHECK(it->is_null(), ConfigError, file_, ": ", k,
                   " is set; hmla supports tokenizer.json files without it");
    load_model(r.at(spec, "model", "the file"), r);
    if (auto it = spec.find("added_tokens"); it != spec.end() && !it->is_null()) {
      HMLA_CHECK(it->is_array(), IoError, file_, ": added_tokens is not a list");
      for (size_t i = 0; i < it->size(); ++i) {
        const json& t = (*it)[i];
        const std::string where = "added_tokens[" + std::to_string(i) + "]";
        AddedToken a;
        a.id = r.id(r.at(t, "id", where), where);
        a.content = r.str(t, "content", where);
        HMLA_CHECK(!a.content.empty(), IoError, file_, ": ", where, " has an empty content");
        HMLA_CHECK(text::is_valid_utf8(a.content), IoError, file_, ": ", where, " is not valid UTF-8");
        a.single_word = r.flag(t, "single_word", false);
        a.lstrip = r.flag(t, "lstrip", false);
        a.rstrip = r.flag(t, "rstrip", false);
        a.normalized = r.flag(t, "normalized", !r.flag(t, "special", false));
        a.special = r.flag(t, "special", false);
        HMLA_CHECK(added_by_id_.emplace(a.id, int32_t(added_.size())).second, IoError, file_, ": ", where, " id ",
                   a.id, " appears twice in added_tokens");
        vocab_size_ = std::max<int64_t>(vocab_size_, int64_t(a.id) + 1);
        added_.push_back(std::move(a));
      }
    }
    // A hostile file's few huge ids must not cost a table of 2^24 entries.
    const int64_t tokens = int64_t(vocab_.size() + added_.size());
    HMLA_CHECK(vocab_size_ <= 4 * tokens + 1024, IoError, file_, ": ids reach ", vocab_size_ - 1, " for ", tokens,
               " tokens (ids must be about dense)");
    load_normalizer(spec.value("normalizer", json()), r);
    for (size_t i = 0; i < added_.size(); ++i) {
      AddedToken& a = added_[i];
      a.decoded = a.normalized && !normalizers_.empty() ? normalize(a.content) : a.content;
      if (!a.decoded.empty()) (a.normalized ? normalized_trie_ : raw_trie_).add(a.decoded, int32_t(i));
    }
    const json pre = spec.value("pre_tokenizer", json());
    if (!pre.is_null()) load_pre_tokenizer(pre, r, true);
    byte_ids_.fill(-1);
    if (byte_level_) {
      for (int b = 0; b < 256; ++b) {
        std::string ch;
        append_utf8(ch, byte_map().to_char[b]);
        if (auto it = vocab_.find(ch); it != vocab_.end()) byte_ids_[b] = it->second;
      }
      if (ignore_merges_)
        for (const auto& [tok, id] : vocab_) {
          std::string raw;
          bool all = true;
          for (size_t i = 0; i < tok.size() && all;) {
            size_t cl = 0;
            const char32_t c = decode_at(tok, i, cl);
            all = c < byte_map().to_byte.size() && byte_map().to_byte[c] >= 0;
            if (all) raw.push_back(char(byte_map().to_byte[c]));
            i += cl;
          }
          if (all) raw_vocab_.emplace(std::move(raw), id);
        }
    }
    load_post_processor(spec.value("post_processor", json()), r);
    load_decoder(spec.value("decoder", json()), r);
  } catch (const json::exception& e) {
    HMLA_CHECK(false, IoError, file_, ": ", e.what());
  }
  resolve_eos(file_, eos_token, eos_required);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(fnv1a(eos_text_, fnv1a(std::string_view("\0", 1), fnv1a(bytes_)))));
  fingerprint_ = std::string("fnv1a:") + hex;
  bytes_.clear();
  bytes_.shrink_to_fit();
}

void HfTokenizer::load_normalizer(const json& n, const Reader& r) {
  if (n.is_null()) return;
  const std::string type = r.str(n, "type", "normalizer");
  UErrorCode st = U_ZERO_ERROR;
  if (type == "Sequence") {
    const json& list = r.at(n, "normalizers", "normalizer");
    HMLA_CHECK(list.is_array(), IoError, file_, ": normalizer.normalizers is not a list");
    for (const json& x : list) load_normalizer(x, r);
    return;
  }
  const UNormalizer2* u = type == "NFC"    ? unorm2_getNFCInstance(&st)
                          : type == "NFKC" ? unorm2_getNFKCInstance(&st)
                          : type == "NFD"  ? unorm2_getNFDInstance(&st)
                          : type == "NFKD" ? unorm2_getNFKDInstance(&st)
                                           : nullptr;
  HMLA_CHECK(!(u == nullptr && U_SUCCESS(st)), ConfigError, file_, ": normalizer ", type,
             " is not supported (hmla reads Sequence, NFC, NFKC, NFD and NFKD)");
  HMLA_CHECK(U_SUCCESS(st), ConfigError, file_, ": ICU has no ", type, " normalizer: ", u_errorName(st));
  normalizers_.push_back(u);
}

void HfTokenizer::load_pre_tokenizer(const json& p, const Reader& r, bool last) {
  const std::string type = r.str(p, "type", "pre_tokenizer");
  HMLA_CHECK(!byte_level_, ConfigError, file_, ": pre_tokenizer ", type,
             " after ByteLevel is not supported (ByteLevel must come last)");
  if (type == "Sequence") {
    const json& list = r.at(p, "pretokenizers", "pre_tokenizer");
    HMLA_CHECK(list.is_array(), IoError, file_, ": pre_tokenizer.pretokenizers is not a list");
    for (size_t i = 0; i < list.size(); ++i) load_pre_tokenizer(list[i], r, last && i + 1 == list.size());
  } else if (type == "Split") {
    Step st;
    const json& pat = r.at(p, "pattern", "Split");
    if (pat.is_object() && pat.contains("Regex")) {
      st.regex = std::make_unique<Regex>(r.str(pat, "Regex", "Split.pattern"), file_);
    } else {
      st.literal = r.str(pat, "String", "Split.pattern");
      HMLA_CHECK(!st.literal.empty(), IoError, file_, ": Split.pattern.String is empty");
    }
    const std::string b = r.str(p, "behavior", "Split");
    st.behavior = b == "Removed"              ? Behavior::Removed
                  : b == "Isolated"           ? Behavior::Isolated
                  : b == "MergedWithPrevious" ? Behavior::MergedWithPrevious
                  : b == "MergedWithNext"     ? Behavior::MergedWithNext
                  : b == "Contiguous"         ? Behavior::Contiguous
                                              : throw IoError(file_ + ": Split behavior '" + b + "' is unknown");
    st.invert = r.flag(p, "invert", false);
    steps_.push_back(std::move(st));
  } else if (type == "ByteLevel") {
    HMLA_CHECK(last, ConfigError, file_, ": a ByteLevel pre_tokenizer before others is not supported");
    if (r.flag(p, "add_prefix_space", true)) {
      Step st;
      st.kind = Step::kPrefixSpace;
      steps_.push_back(std::move(st));
    }
    if (r.flag(p, "use_regex", true)) {
      Step st;
      st.regex = std::make_unique<Regex>(kGpt2Regex, file_);
      steps_.push_back(std::move(st));
    }
    byte_level_ = true;
  } else {
    HMLA_CHECK(false, ConfigError, file_, ": pre_tokenizer ", type,
               " is not supported (hmla reads Sequence, Split and ByteLevel)");
  }
}

void HfTokenizer::load_model(const json& m, const Reader& r) {
  const std::string type = m.contains("type") ? r.str(m, "type", "model") : "BPE";
  HMLA_CHECK(type == "BPE", ConfigError, file_, ": model ", type, " is not supported (hmla reads BPE)");
  if (auto it = m.find("dropout"); it != m.end() && !it->is_null())
    HMLA_CHECK(false, ConfigError, file_, ": model.dropout is ", it->dump(), "; hmla supports only null (no dropout)");
  const json& vocab = r.at(m, "vocab", "model");
  HMLA_CHECK(vocab.is_object(), IoError, file_, ": model.vocab is not an object");
  vocab_.reserve(vocab.size());
  int64_t top = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it)
    top = std::max<int64_t>(top, r.id(it.value(), "model.vocab token " + json(it.key()).dump()));
  HMLA_CHECK(top < 4 * int64_t(vocab.size()) + 1024, IoError, file_, ": model.vocab ids reach ", top, " for ",
             vocab.size(), " tokens (ids must be about dense)");
  id_to_token_.resize(size_t(top + 1));
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const int32_t id = r.id(it.value(), "model.vocab token " + json(it.key()).dump());
    HMLA_CHECK(id_to_token_[id].empty(), IoError, file_, ": model.vocab id ", id, " appears twice (",
               json(id_to_token_[id]).dump(), " and ", json(it.key()).dump(), ")");
    HMLA_CHECK(!it.key().empty(), IoError, file_, ": model.vocab has an empty token");
    id_to_token_[id] = it.key();
    vocab_.emplace(it.key(), id);
  }
  vocab_size_ = std::max<int64_t>(vocab_size_, int64_t(id_to_token_.size()));
  ignore_merges_ = r.flag(m, "ignore_merges", false);
  byte_fallback_ = r.flag(m, "byte_fallback", false);
  fuse_unk_ = r.flag(m, "fuse_unk", false);
  prefix_ = r.opt_str(m, "continuing_subword_prefix");
  suffix_ = r.opt_str(m, "end_of_word_suffix");
  if (const std::string unk = r.opt_str(m, "unk_token"); !unk.empty()) {
    auto it = vocab_.find(unk);
    HMLA_CHECK(it != vocab_.end(), IoError, file_, ": model.unk_token ", json(unk).dump(), " is not in the vocabulary");
    unk_ = it->second;
  }
  fallback_ids_.fill(-1);
  if (byte_fallback_)
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      if (auto it = vocab_.find(name); it != vocab_.end()) fallback_ids_[b] = it->second;
    }
  const json& merges = r.at(m, "merges", "model");
  HMLA_CHECK(merges.is_array(), IoError, file_, ": model.merges is not a list");
  merges_.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& x = merges[i];
    std::string a, b;
    if (x.is_string()) {
      const std::string s = x.get<std::string>();
      const size_t sp = s.find(' ');
      HMLA_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos, IoError, file_, ": merges[", i,
                 "] ", x.dump(), " is not two tokens separated by one space");
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else {
      HMLA_CHECK(x.is_array() && x.size() == 2 && x[0].is_string() && x[1].is_string(), IoError, file_, ": merges[",
                 i, "] ", x.dump().substr(0, 80), " is not a pair of tokens");
      a = x[0].get<std::string>(), b = x[1].get<std::string>();
    }
    auto ia = vocab_.find(a), ib = vocab_.find(b);
    HMLA_CHECK(ia != vocab_.end(), IoError, file_, ": merges[", i, "] names ", json(a).dump(),
               ", which is not in the vocabulary");
    HMLA_CHECK(ib != vocab_.end(), IoError, file_, ": merges[", i, "] names ", json(b).dump(),
               ", which is not in the vocabulary");
    std::string joined = a;
    joined += !prefix_.empty() && b.rfind(prefix_, 0) == 0 ? b.substr(prefix_.size()) : b;
    auto ij = vocab_.find(joined);
    HMLA_CHECK(ij != vocab_.end(), IoError, file_, ": merges[", i, "] makes ", json(joined).dump(),
               ", which is not in the vocabulary");
    const uint64_t key = uint64_t(uint32_t(ia->second)) << 32 | uint32_t(ib->second);
    merges_.emplace(key, uint64_t(i) << 32 | uint32_t(ij->second));  // the first of a repeated pair wins
  }
}

void HfTokenizer::load_post_processor(const json& p, const Reader& r) {
  if (p.is_null()) return;
  const std::string type = r.str(p, "type", "post_processor");
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    const json& list = r.at(p, "processors", "post_processor");
    HMLA_CHECK(list.is_array(), IoError, file_, ": post_processor.processors is not a list");
    for (const json& x : list) load_post_processor(x, r);
    return;
  }
  HMLA_CHECK(type == "TemplateProcessing", ConfigError, file_, ": post_processor ", type,
             " is not supported (hmla reads ByteLevel, TemplateProcessing and Sequence)");
  HMLA_CHECK(special_before_.empty() && special_after_.empty(), ConfigError, file_,
             ": more than one TemplateProcessing post_processor is not supported");
  const json& single = r.at(p, "single", "TemplateProcessing");
  const json& specials = r.at(p, "special_tokens", "TemplateProcessing");
  HMLA_CHECK(single.is_array(), IoError, file_, ": TemplateProcessing.single is not a list");
  bool seen_a = false;
  for (const json& item : single) {
    if (item.is_object() && item.contains("Sequence")) {
      HMLA_CHECK(!seen_a, ConfigError, file_, ": TemplateProcessing.single names the sequence twice");
      seen_a = true;
      continue;
    }
    const std::string name = r.str(r.at(item, "SpecialToken", "TemplateProcessing.single item"), "id", "SpecialToken");
    const json& spec = r.at(specials, name.c_str(), "TemplateProcessing.special_tokens");
    const json& ids = r.at(spec, "ids", "special token " + name);
    HMLA_CHECK(ids.is_array(), IoError, file_, ": special token ", name, " ids is not a list");
    for (const json& id : ids) {
      const int32_t v = r.id(id, "TemplateProcessing special token " + name);
      HMLA_CHECK(v < vocab_size_, IoError, file_, ": TemplateProcessing special token ", name, " has id ", v,
                 ", which no token has");
      (seen_a ? special_after_ : special_before_).push_back(v);
    }
  }
  HMLA_CHECK(seen_a, ConfigError, file_, ": TemplateProcessing.single has no sequence ($A)");
}

void HfTokenizer::load_decoder(const json& d, const Reader& r) {
  if (d.is_null()) return;
  const std::string type = r.str(d, "type", "decoder");
  if (type == "Sequence") {
    const json& list = r.at(d, "decoders", "decoder");
    HMLA_CHECK(list.is_array(), IoError, file_, ": decoder.decoders is not a list");
    for (const json& x : list) load_decoder(x, r);
    return;
  }
  HMLA_CHECK(type == "ByteLevel", ConfigError, file_, ": decoder ", type,
             " is not supported (hmla reads ByteLevel and Sequence of ByteLevel)");
  byte_level_decoder_ = true;
}

int32_t HfTokenizer::token_id(std::string_view tok) const {
  for (const AddedToken& a : added_)
    if (a.content == tok) return a.id;
  auto it = vocab_.find(std::string(tok));
  return it == vocab_.end() ? -1 : it->second;
}

void HfTokenizer::resolve_eos(const std::string& file, const std::optional<std::string>& eos_token, bool required) {
  const fs::path dir = fs::path(file).parent_path();
  std::error_code ec;
  if (eos_token) {
    eos_text_ = *eos_token;
    eos_ = token_id(eos_text_);
    HMLA_CHECK(eos_ >= 0, ConfigError, "--eos-token ", json(eos_text_).dump(), ": not a token of ", file);
  } else if (const fs::path tc = dir / "tokenizer_config.json"; fs::exists(tc, ec) && [&] {
               const json c = io::load_json(tc.string());
               const json e = c.is_object() ? c.value("eos_token", json()) : json();
               if (e.is_string()) eos_text_ = e.get<std::string>();
               else if (e.is_object() && e.contains("content") && e["content"].is_string())
                 eos_text_ = e["content"].get<std::string>();
               else return false;
               return true;
             }()) {
    eos_ = token_id(eos_text_);
    HMLA_CHECK(eos_ >= 0, IoError, tc.string(), ": eos_token ", json(eos_text_).dump(), " is not a token of ", file);
  } else if (const fs::path cc = dir / "config.json"; fs::exists(cc, ec) && [&] {
               const json c = io::load_json(cc.string());
               json e = c.is_object() ? c.value("eos_token_id", json()) : json();
               if (e.is_array() && !e.empty()) e = e[0];
               if (!e.is_number_integer()) return false;
               eos_ = Reader{cc.string()}.id(e, "eos_token_id");
               return true;
             }()) {
    HMLA_CHECK(eos_ < vocab_size_, IoError, cc.string(), ": eos_token_id ", eos_, " is not an id of ", file);
    if (auto it = added_by_id_.find(eos_); it != added_by_id_.end()) eos_text_ = added_[it->second].content;
    else eos_text_ = eos_ < int32_t(id_to_token_.size()) ? id_to_token_[eos_] : "";
  } else {  // none: eos_id() is -1, and the fingerprint hashes an empty eos text
    HMLA_CHECK(!required, ConfigError, file, ": no eos token (no tokenizer_config.json eos_token or config.json ",
               "eos_token_id beside it): pass --eos-token");
  }
}

// ---- encoding -------------------------------------------------------------------------------------

std::string HfTokenizer::normalize(std::string_view s) const {
  std::string cur(s);
  if (std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; })) return cur;
  for (const UNormalizer2* n : normalizers_) {
    UErrorCode st = U_ZERO_ERROR;
    int32_t len16 = 0;
    std::u16string in(cur.size(), u'\0');
    u_strFromUTF8(reinterpret_cast<UChar*>(in.data()), int32_t(in.size()), &len16, cur.data(), int32_t(cur.size()),
                  &st);
    HMLA_CHECK(U_SUCCESS(st), IoError, "normalizer: ", u_errorName(st));
    in.resize(size_t(len16));
    std::u16string outs(in.size() * 3 + 16, u'\0');
    st = U_ZERO_ERROR;
    int32_t n16 = unorm2_normalize(n, reinterpret_cast<const UChar*>(in.data()), len16,
                                   reinterpret_cast<UChar*>(outs.data()), int32_t(outs.size()), &st);
    if (st == U_BUFFER_OVERFLOW_ERROR) {
      outs.assign(size_t(n16), u'\0');
      st = U_ZERO_ERROR;
      n16 = unorm2_normalize(n, reinterpret_cast<const UChar*>(in.data()), len16, reinterpret_cast<UChar*>(outs.data()),
                             int32_t(outs.size()), &st);
    }
    HMLA_CHECK(U_SUCCESS(st), IoError, "normalizer: ", u_errorName(st));
    cur.assign(size_t(n16) * 3, '\0');
    int32_t n8 = 0;
    st = U_ZERO_ERROR;
    u_strToUTF8(cur.data(), int32_t(cur.size()), &n8, reinterpret_cast<const UChar*>(outs.data()), n16, &st);
    HMLA_CHECK(U_SUCCESS(st), IoError, "normalizer: ", u_errorName(st));
    cur.resize(size_t(n8));
  }
  return cur;
}

// tokenizers' AddedVocabulary rule: leftmost-longest matches; a single_word token must not touch a
// word character on either side; lstrip/rstrip take the whitespace beside a match into it.
void HfTokenizer::split_added(std::string_view s, const Trie& trie, std::vector<Segment>& segs) const {
  segs.clear();
  size_t done = 0, i = 0;
  while (i < s.size()) {
    int32_t t = -1;
    const size_t len = trie.empty() ? 0 : trie.longest(s, i, t);
    if (len == 0) {
      ++i;
      continue;
    }
    size_t start = i, stop = i + len;
    i = stop;
    const AddedToken& a = added_[t];
    size_t cl = 0;
    if (a.single_word && ((start > 0 && is_word(decode_before(s, start, cl))) ||
                          (stop < s.size() && is_word(decode_at(s, stop, cl)))))
      continue;
    if (a.lstrip)
      while (start > done && is_space(decode_before(s, start, cl))) start -= cl;
    if (a.rstrip)
      while (stop < s.size() && is_space(decode_at(s, stop, cl))) stop += cl;
    i = stop;
    if (start > done) segs.push_back({done, start, -1});
    segs.push_back({start, stop, t});
    done = stop;
  }
  if (done < s.size()) segs.push_back({done, s.size(), -1});
}

void HfTokenizer::encode(std::string_view text, bool add_special, std::vector<int32_t>& out) const {
  std::string fixed;
  if (!is_valid_utf8(text)) {
    fixed = replace_invalid_utf8(text);
    text = fixed;
  }
  if (add_special) out.insert(out.end(), special_before_.begin(), special_before_.end());
  std::vector<Segment> segs;
  split_added(text, raw_trie_, segs);
  for (const Segment& g : segs) {
    if (g.token >= 0) {
      out.push_back(added_[g.token].id);
      continue;
    }
    const std::string_view part = text.substr(g.b, g.e - g.b);
    if (normalizers_.empty()) {
      encode_text(part, out);
    } else {
      const std::string norm = normalize(part);
      encode_text(norm, out);
    }
  }
  if (add_special) out.insert(out.end(), special_after_.begin(), special_after_.end());
}

void HfTokenizer::encode_text(std::string_view s, std::vector<int32_t>& out) const {
  if (normalized_trie_.empty()) return pre_tokenize(s, 0, out);
  std::vector<Segment> segs;
  split_added(s, normalized_trie_, segs);
  for (const Segment& g : segs) {
    if (g.token >= 0) out.push_back(added_[g.token].id);
    else pre_tokenize(s.substr(g.b, g.e - g.b), 0, out);
  }
}

void HfTokenizer::split_piece(const Step& st, std::string_view s, std::vector<std::pair<size_t, size_t>>& pieces,
                              std::vector<std::pair<std::pair<size_t, size_t>, bool>>& marks) const {
  marks.clear();
  pieces.clear();
  size_t prev = 0, from = 0, b = 0, e = 0;
  const bool wide = st.regex && st.regex->widened() && has_recent_code_point(s);
  while (from <= s.size()) {
    if (st.regex) {
      if (!st.regex->find(s, from, b, e, wide)) break;
    } else {
      b = s.find(st.literal, from);
      if (b == std::string_view::npos) break;
      e = b + st.literal.size();
    }
    if (e == b) {  // an empty match splits nothing
      size_t cl = 1;
      if (b < s.size()) decode_at(s, b, cl);
      from = b + cl;
      continue;
    }
    if (b > prev) marks.push_back({{prev, b}, st.invert});
    marks.push_back({{b, e}, !st.invert});
    prev = from = e;
  }
  if (prev < s.size()) marks.push_back({{prev, s.size()}, st.invert});
  switch (st.behavior) {
    case Behavior::Removed:
      for (auto& [r, m] : marks)
        if (!m) pieces.push_back(r);
      break;
    case Behavior::Isolated:
      for (auto& [r, m] : marks) pieces.push_back(r);
      break;
    case Behavior::MergedWithPrevious: {
      bool prev_match = false;
      for (auto& [r, m] : marks) {
        if (m && !prev_match && !pieces.empty()) pieces.back().second = r.second;
        else pieces.push_back(r);
        prev_match = m;
      }
      break;
    }
    case Behavior::MergedWithNext: {
      bool prev_match = false;
      for (size_t k = marks.size(); k-- > 0;) {
        auto& [r, m] = marks[k];
        if (m && !prev_match && !pieces.empty()) pieces.back().first = r.first;
        else pieces.push_back(r);
        prev_match = m;
      }
      std::reverse(pieces.begin(), pieces.end());
      break;
    }
    case Behavior::Contiguous: {
      bool prev_match = false;
      for (auto& [r, m] : marks) {
        if (m == prev_match && !pieces.empty()) pieces.back().second = r.second;
        else pieces.push_back(r);
        prev_match = m;
      }
      break;
    }
  }
}

void HfTokenizer::pre_tokenize(std::string_view piece, size_t depth, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (depth == steps_.size()) return bpe(piece, out);
  Scratch& sc = scratch(steps_.size());
  const Step& st = steps_[depth];
  if (st.kind == Step::kPrefixSpace) {
    if (piece[0] == ' ') return pre_tokenize(piece, depth + 1, out);
    std::string& buf = sc.prefixed[depth];
    buf.assign(1, ' ');
    buf.append(piece);
    return pre_tokenize(buf, depth + 1, out);
  }
  auto& pieces = sc.pieces[depth];
  split_piece(st, piece, pieces, sc.splits[depth]);
  for (size_t k = 0; k < pieces.size(); ++k) {  // by index: deeper levels leave this depth's vector alone
    const auto [b, e] = sc.pieces[depth][k];
    pre_tokenize(piece.substr(b, e - b), depth + 1, out);
  }
}

void HfTokenizer::bpe(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() > kCacheWordBytes) return bpe_uncached(word, out);
  thread_local WordCache cache;
  if (cache.owner != serial_ || cache.map.size() >= kCacheEntries) cache.reset(serial_);
  if (auto it = cache.map.find(word); it != cache.map.end()) {
    out.insert(out.end(), cache.ids.begin() + it->second.first,
               cache.ids.begin() + it->second.first + it->second.second);
    return;
  }
  const size_t at = out.size();
  bpe_uncached(word, out);
  const auto off = uint32_t(cache.ids.size());
  cache.ids.insert(cache.ids.end(), out.begin() + at, out.end());
  cache.map.emplace(std::string(word), std::make_pair(off, uint32_t(out.size() - at)));
}

void HfTokenizer::bpe_uncached(std::string_view word, std::vector<int32_t>& out) const {
  Scratch& sc = scratch(steps_.size());
  std::vector<int32_t>& ids = sc.word;
  ids.clear();
  // The fast path: byte-level words whose every byte has its own token.
  const bool simple = byte_level_ && prefix_.empty() && suffix_.empty() &&
                      std::all_of(word.begin(), word.end(),
                                  [&](char c) { return byte_ids_[static_cast<unsigned char>(c)] >= 0; });
  if (simple) {
    if (ignore_merges_)
      if (auto it = raw_vocab_.find(std::string(word)); it != raw_vocab_.end()) return out.push_back(it->second);
    for (char c : word) ids.push_back(byte_ids_[static_cast<unsigned char>(c)]);
  }
  // Else the word as the model sees it: byte-level characters, or the text itself.
  std::string mapped;
  if (!simple && byte_level_) {
    for (unsigned char c : word) append_utf8(mapped, byte_map().to_char[c]);
  } else if (!simple) {
    mapped.assign(word);
  }
  if (!simple && ignore_merges_)
    if (auto it = vocab_.find(mapped); it != vocab_.end()) return out.push_back(it->second);
  // An unknown symbol is held back until the next vocabulary symbol (or the word's end) and fused
  // with the unknowns that follow it under fuse_unk; byte-fallback ids do not release it (tokenizers' order).
  bool unk_held = false;
  std::string sym;
  for (size_t i = 0; i < mapped.size();) {
    size_t cl = 0;
    decode_at(mapped, i, cl);
    sym.clear();
    if (i > 0) sym += prefix_;
    sym.append(mapped, i, cl);
    if (i + cl == mapped.size()) sym += suffix_;
    i += cl;
    if (auto it = vocab_.find(sym); it != vocab_.end()) {
      if (unk_held) ids.push_back(unk_);
      unk_held = false;
      ids.push_back(it->second);
      continue;
    }
    if (byte_fallback_ && std::all_of(sym.begin(), sym.end(), [&](char c) {
          return fallback_ids_[static_cast<unsigned char>(c)] >= 0;
        })) {  // the bytes of the whole symbol, prefix and suffix included (as tokenizers)
      for (char c : sym) ids.push_back(fallback_ids_[static_cast<unsigned char>(c)]);
      continue;
    }
    if (unk_ < 0) continue;  // no unk token: the symbol is dropped
    if (unk_held && !fuse_unk_) ids.push_back(unk_);
    unk_held = true;
  }
  if (unk_held) ids.push_back(unk_);
  // Merges by rank (leftmost on ties), over a linked list of symbols.
  const auto n = int32_t(ids.size());
  auto& syms = sc.syms;
  auto& heap = sc.heap;
  syms.resize(size_t(n));
  heap.clear();
  for (int32_t k = 0; k < n; ++k) syms[k] = {ids[k], k - 1, k + 1 < n ? k + 1 : -1, true};
  auto rank_of = [&](int32_t a, int32_t b, int32_t& merged) -> int32_t {
    auto it = merges_.find(uint64_t(uint32_t(a)) << 32 | uint32_t(b));
    if (it == merges_.end()) return -1;
    merged = int32_t(uint32_t(it->second));
    return int32_t(it->second >> 32);
  };
  int32_t merged = 0;
  for (int32_t k = 0; k + 1 < n; ++k)
    if (const int32_t r = rank_of(syms[k].id, syms[k + 1].id, merged); r >= 0) heap.push_back({r, k});
  std::make_heap(heap.begin(), heap.end());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const Cand c = heap.back();
    heap.pop_back();
    Sym& left = syms[c.pos];
    if (!left.alive || left.next < 0) continue;
    Sym& right = syms[left.next];
    if (rank_of(left.id, right.id, merged) != c.rank) continue;  // stale: a neighbour merged first
    left.id = merged;
    right.alive = false;
    left.next = right.next;
    if (left.next >= 0) syms[left.next].prev = c.pos;
    if (left.prev >= 0)
      if (const int32_t r = rank_of(syms[left.prev].id, left.id, merged); r >= 0) {
        heap.push_back({r, left.prev});
        std::push_heap(heap.begin(), heap.end());
      }
    if (left.next >= 0)
      if (const int32_t r = rank_of(left.id, syms[left.next].id, merged); r >= 0) {
        heap.push_back({r, c.pos});
        std::push_heap(heap.begin(), heap.end());
      }
  }
  for (int32_t k = 0; k >= 0 && k < n; k = syms[k].next) out.push_back(syms[k].id);
}

// ---- decoding -------------------------------------------------------------------------------------

std::string HfTokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  bool first = true;
  for (int32_t id : ids) {
    std::string_view tok;
    if (auto it = added_by_id_.find(id); it != added_by_id_.end()) {
      if (skip_special && added_[it->second].special) continue;
      tok = added_[it->second].decoded;
    } else if (id >= 0 && size_t(id) < id_to_token_.size() && !id_to_token_[id].empty()) {
      tok = id_to_token_[id];
    } else {
      continue;  // no token has this id
    }
    if (!byte_level_decoder_) {  // no decoder: tokens joined by spaces
      if (!first) bytes.push_back(' ');
      bytes.append(tok);
      first = false;
      continue;
    }
    // A token all of byte-level characters is those bytes; any other is its own text.
    const size_t at = bytes.size();
    bool all = true;
    for (size_t i = 0; i < tok.size() && all;) {
      size_t cl = 0;
      const char32_t c = decode_at(tok, i, cl);
      all = c < byte_map().to_byte.size() && byte_map().to_byte[c] >= 0;
      if (all) bytes.push_back(char(byte_map().to_byte[c]));
      i += cl;
    }
    if (!all) bytes.resize(at), bytes.append(tok);
  }
  return replace_invalid_utf8(bytes);
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path, const std::optional<std::string>& eos_token,
                                          bool eos_required) {
  return std::make_unique<HfTokenizer>(path, eos_token, eos_required);
}

}  // namespace hmla::text
