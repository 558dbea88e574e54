// Tokenizers: text -> token ids and back. Two kinds behind one interface: the byte tokenizer
// (pad 0, bos 1, eos 2, byte b -> b + 3; the demo's, and the default) and a Hugging Face
// tokenizer.json of the byte-level BPE kind DeepSeek-V3.2 and GLM-5 ship (docs/tokenizer.md says
// which components are supported; any other is a ConfigError naming it).
// encode and decode are const and thread-safe: prepare-data calls one tokenizer from many threads.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace hmla::text {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Appends the ids of `text` to out. add_special: the post-processor's special tokens (a bos,
  // for instance) as tokenizers' encode(add_special_tokens=True) adds them; the byte tokenizer
  // has none. Text that is not valid UTF-8 is read as Python's bytes.decode("utf-8",
  // errors="replace") reads it (each maximal invalid subpart one U+FFFD).
  virtual void encode(std::string_view text, bool add_special, std::vector<int32_t>& out) const = 0;
  // The text of ids (skip_special: leave out special tokens, as tokenizers' decode does).
  virtual std::string decode(std::span<const int32_t> ids, bool skip_special) const = 0;
  virtual int64_t vocab_size() const = 0;  // one past the largest id it can produce
  // The id a document ends with (prepare-data appends it to every document); -1 for a tokenizer
  // loaded without one (load_tokenizer's eos_required = false).
  virtual int32_t eos_id() const = 0;
  // Ids generation stops at (eos, and pad where there is one).
  virtual bool is_stop(int32_t id) const = 0;
  // One line for logs, run records and reports: the kind, its file and vocabulary size.
  virtual std::string describe() const = 0;
  // A stable identity of what it encodes: "bytes" for the byte tokenizer, else the FNV-1a 64 hash
  // of the tokenizer.json bytes and of the chosen eos ("fnv1a:<hex>").
  virtual std::string fingerprint() const = 0;

  std::vector<int32_t> encode(std::string_view text, bool add_special = false) const {
    std::vector<int32_t> ids;
    encode(text, add_special, ids);
    return ids;
  }
};

std::unique_ptr<Tokenizer> byte_tokenizer();

// What a run records of the tokenizer that made its data (hmla-run.json, hmla report): its
// describe(), fingerprint() and the vocabulary size its token files record.
struct TokenizerRecord {
  std::string describe = "bytes+3; pad 0, bos 1, eos 2", fingerprint = "bytes";
  int64_t vocab_size = 259;
};

// A Hugging Face tokenizer: `path` is a tokenizer.json or a directory holding one (a checkpoint
// directory, with its tokenizer_config.json and config.json beside it). The eos is `eos_token`
// when given, else tokenizer_config.json's eos_token, else config.json's eos_token_id; none of
// them is a ConfigError saying so when `eos_required`, else eos_id() is -1 (a caller that only
// encodes and decodes needs no eos). Bad files are IoErrors naming the file and what is wrong.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path, const std::optional<std::string>& eos_token = {},
                                          bool eos_required = true);

// The tokenizer a checkpoint directory's model reads: its tokenizer.json when present, else the
// byte tokenizer.
std::unique_ptr<Tokenizer> checkpoint_tokenizer(const std::string& checkpoint_dir);

}  // namespace hmla::text
