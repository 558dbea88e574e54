// Training data: a byte-level tokenizer (pad = 0, bos = 1, eos = 2, byte x -> x + 3), prepared
// token files (tokens [n] i32 + doc_offsets [docs + 1] i64, each document ending in eos), and a
// loader that packs whole documents into rows of s tokens, keeping their boundaries, splitting
// only documents longer than a row, and padding each row's tail.
#pragma once
#include <string>
#include <vector>

#include "hmla/io/safetensors.h"
#include "hmla/model/model.h"

namespace hmla {

constexpr int32_t kPadId = 0, kBosId = 1, kEosId = 2, kByteOffset = 3, kByteVocab = 259;

std::vector<int32_t> tokenize_bytes(const std::string& text);
std::string detokenize_bytes(const std::vector<int32_t>& ids);

struct TokenSet {
  std::vector<int32_t> tokens;
  std::vector<int64_t> doc_offsets;  // docs + 1 entries
  int64_t docs() const { return static_cast<int64_t>(doc_offsets.size()) - 1; }
};

// Splits each file into documents at lines equal to `separator` (fortune files use "%"); every
// `heldout_every`-th document goes to the held-out set. Writes out_dir/{train,heldout}.safetensors,
// each recording the pair's data_fingerprint in its metadata.
void prepare_data(const std::vector<std::string>& files, const std::string& out_dir, const std::string& separator,
                  int64_t heldout_every);
TokenSet load_token_set(const std::string& path, io::Metadata* metadata = nullptr);

// A prepare-data directory's two token sets, checked to be one prepare-data output: the
// fingerprint both files record must be that of their contents (files from before the fingerprint
// was recorded carry none and are read as they are). IoError otherwise.
struct TokenData {
  TokenSet train, held;
  std::string fingerprint;  // data_fingerprint(train, held)
};
TokenData load_token_data(const std::string& dir);

class PackedLoader {
 public:
  // Documents are visited in an order shuffled by `seed`, reshuffled every epoch.
  PackedLoader(TokenSet data, int64_t seq_len, uint64_t seed);
  Batch next(int64_t rows);
  // Position for checkpoints: (epoch, document index in the epoch's order, offset in it).
  std::vector<int64_t> position() const { return {epoch_, index_, offset_}; }
  void seek(const std::vector<int64_t>& pos);

 private:
  void shuffle();
  TokenSet data_;
  int64_t s_;
  uint64_t seed_;
  std::vector<int64_t> order_;
  int64_t epoch_ = 0, index_ = 0, offset_ = 0;
};

// The first `rows` packed rows of a set in file order (a fixed evaluation set).
Batch fixed_rows(const TokenSet& data, int64_t seq_len, int64_t rows);

}  // namespace hmla
