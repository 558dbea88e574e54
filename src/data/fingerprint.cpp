// The data fingerprint (fingerprint.h): FNV-1a 64 over the four arrays' bytes, in order, with the
// sets' sizes written out beside the hash. Sets read in place hash their documents' ids as the
// concatenation would hold them, so a Megatron dataset and its prepare-data output agree.
#include "hmla/data/fingerprint.h"

#include <algorithm>
#include <cstdio>
#include <vector>

namespace hmla {

void FingerprintHasher::add(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h_ = (h_ ^ p[i]) * 0x100000001b3ull;
}

std::string FingerprintHasher::hex() const {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h_));
  return buf;
}

std::string FingerprintHasher::finish(int64_t train_tokens, int64_t train_docs, int64_t held_tokens,
                                      int64_t held_docs) const {
  return std::to_string(train_tokens) + " tokens in " + std::to_string(train_docs) + " documents, " +
         std::to_string(held_tokens) + " tokens in " + std::to_string(held_docs) + " documents, hash " + hex();
}

std::string data_fingerprint(const TokenSet& train, const TokenSet& heldout) {
  FingerprintHasher h;
  std::vector<int32_t> buf;
  for (const TokenSet* t : {&train, &heldout}) {
    if (t->view) {  // the ids as the concatenation of the documents would hold them
      for (int64_t d = 0; d < t->docs(); ++d) {
        const int64_t len = t->doc_offsets[d + 1] - t->doc_offsets[d];
        for (int64_t at = 0; at < len; at += 1 << 20) {
          const int64_t n = std::min<int64_t>(1 << 20, len - at);
          buf.resize(size_t(n));
          t->copy_doc(d, at, n, buf.data());
          h.add(buf.data(), size_t(n) * sizeof(int32_t));
        }
      }
    } else {
      h.add(t->tokens.data(), t->tokens.size() * sizeof(int32_t));
    }
    h.add(t->doc_offsets.data(), t->doc_offsets.size() * sizeof(int64_t));
  }
  auto count = [](const TokenSet& t) { return t.view ? t.size() : int64_t(t.tokens.size()); };
  return h.finish(count(train), train.docs(), count(heldout), heldout.docs());
}

}  // namespace hmla
