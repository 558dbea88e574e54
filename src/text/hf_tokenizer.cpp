// A Hugging Face tokenizer.json (byte-level BPE). Placeholder until the implementation lands.
#include "hmla/core/error.h"
#include "hmla/text/tokenizer.h"

namespace hmla::text {

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path, const std::optional<std::string>&) {
  HMLA_CHECK(false, ConfigError, path, ": Hugging Face tokenizers are not supported yet");
  return nullptr;
}

}  // namespace hmla::text
