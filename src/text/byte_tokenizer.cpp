// The byte tokenizer: pad 0, bos 1, eos 2, byte b -> b + 3 (vocabulary 259). hmla's default and the
// demo's; its ids are what prepare-data wrote before tokenizers existed, bit for bit.
#include <filesystem>

#include "hmla/text/tokenizer.h"

namespace hmla::text {

namespace {

constexpr int32_t kPad = 0, kEos = 2, kOffset = 3, kVocab = 259;

class ByteTokenizer final : public Tokenizer {
 public:
  using Tokenizer::encode;
  void encode(std::string_view text, bool, std::vector<int32_t>& out) const override {
    out.reserve(out.size() + text.size());
    for (unsigned char c : text) out.push_back(int32_t(c) + kOffset);
  }
  std::string decode(std::span<const int32_t> ids, bool) const override {
    std::string s;
    for (int32_t id : ids)
      if (id >= kOffset && id < kVocab) s.push_back(char(id - kOffset));
    return s;
  }
  int64_t vocab_size() const override { return kVocab; }
  int32_t eos_id() const override { return kEos; }
  bool is_stop(int32_t id) const override { return id == kEos || id == kPad; }
  std::string describe() const override { return "bytes+3; pad 0, bos 1, eos 2"; }
  std::string fingerprint() const override { return "bytes"; }
};

}  // namespace

std::unique_ptr<Tokenizer> byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> checkpoint_tokenizer(const std::string& dir) {
  const std::filesystem::path f = std::filesystem::path(dir) / "tokenizer.json";
  std::error_code ec;
  if (std::filesystem::exists(f, ec)) return load_tokenizer(dir);
  return byte_tokenizer();
}

}  // namespace hmla::text
