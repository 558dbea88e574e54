// The identity of a prepared pair of token sets: their sizes and a 64-bit FNV-1a hash of their
// contents (train tokens, train doc_offsets, held-out tokens, held-out doc_offsets, as bytes).
// prepare-data records it in both files; load_token_data and --resume check it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "hmla/data/token_set.h"

namespace hmla {

// The metadata key both files of a prepare-data pair record the fingerprint under.
constexpr const char* kFingerprintKey = "data_fingerprint";

std::string data_fingerprint(const TokenSet& train, const TokenSet& heldout);

// The same fingerprint for a writer that streams the four arrays (train tokens, train doc_offsets,
// held-out tokens, held-out doc_offsets, in that order, as their bytes) through add().
class FingerprintHasher {
 public:
  void add(const void* data, size_t n);
  std::string finish(int64_t train_tokens, int64_t train_docs, int64_t held_tokens, int64_t held_docs) const;
  std::string hex() const;  // the hash of the bytes added so far, 16 hex digits

 private:
  uint64_t h_ = 0xcbf29ce484222325ull;
};

}  // namespace hmla
