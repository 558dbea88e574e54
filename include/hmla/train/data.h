// Training data: a byte-level tokenizer (pad = 0, bos = 1, eos = 2, byte x -> x + 3), prepared
// token files (tokens [n] i32 + doc_offsets [docs + 1] i64, each document ending in eos), and a
// loader that packs whole documents into rows of s tokens, keeping their boundaries, splitting
// only documents longer than a row, and padding each row's tail.
#pragma once
#include <algorithm>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "hmla/io/safetensors.h"
#include "hmla/model/model.h"
#include "hmla/text/tokenizer.h"

namespace hmla {

constexpr int32_t kPadId = 0, kBosId = 1, kEosId = 2, kByteOffset = 3, kByteVocab = 259;

std::vector<int32_t> tokenize_bytes(const std::string& text);
std::string detokenize_bytes(const std::vector<int32_t>& ids);

// Ids read in place (a mapped Megatron .bin) rather than held in a vector.
class TokenView {
 public:
  virtual ~TokenView() = default;
  virtual void copy(int64_t begin, int64_t n, int32_t* out) const = 0;  // ids [begin, begin + n) as int32
};

// Documents as a concatenation: document d is [doc_offsets[d], doc_offsets[d + 1]) of it. Its
// ids are `tokens`, or, with a view, document d's lie at view[doc_starts[d] ...) (a held-out split
// of data read in place picks documents out of the mapped file without copying them).
struct TokenSet {
  TokenSet() = default;
  TokenSet(std::vector<int32_t> ids, std::vector<int64_t> offsets)
      : tokens(std::move(ids)), doc_offsets(std::move(offsets)) {}
  std::vector<int32_t> tokens;
  std::vector<int64_t> doc_offsets;  // docs + 1 entries
  std::shared_ptr<const TokenView> view;
  std::vector<int64_t> doc_starts;  // docs entries, with a view
  int64_t docs() const { return static_cast<int64_t>(doc_offsets.size()) - 1; }
  int64_t size() const { return doc_offsets.empty() ? 0 : doc_offsets.back(); }  // tokens in all
  // Ids [offset, offset + n) of document d into out.
  void copy_doc(int64_t d, int64_t offset, int64_t n, int32_t* out) const {
    if (view) view->copy(doc_starts[d] + offset, n, out);
    else std::copy(tokens.begin() + doc_offsets[d] + offset, tokens.begin() + doc_offsets[d] + offset + n, out);
  }
};

// prepare-data (docs/data.md): the documents of every input, tokenized by `tokenizer` (each
// document = encode(text, add_special) + eos_id(); whitespace-only documents are dropped) or, for
// a Megatron dataset, its ids as stored; every `heldout_every`-th document goes to the held-out
// set. Streams: input read in chunks, documents tokenized in batches on `threads` threads (the
// output does not depend on their number), tokens written to unnamed temporaries in --out and
// assembled into out_dir/{train,heldout}.safetensors at the end, each written atomically and
// recording the pair's data_fingerprint, the tokenizer and (for any but the byte tokenizer,
// whose files stay as they always were) its vocab_size. An error leaves nothing behind.
struct PrepareOptions {
  std::vector<std::string> inputs;  // text::expand_inputs's arguments
  std::string out_dir;
  std::string separator = "%";
  int64_t heldout_every = 20;
  const text::Tokenizer* tokenizer = nullptr;  // null: the byte tokenizer
  std::string text_key = "text";
  bool strict = false;
  int threads = 2;
  int64_t vocab_size = 0;  // Megatron input: the vocab_size recorded (0: its largest id + 1)
  std::ostream* log = nullptr;  // the summary line
  bool progress = false;  // a progress line on stderr, refreshed in place
};
struct PrepareSummary {
  int64_t train_docs = 0, held_docs = 0, train_tokens = 0, held_tokens = 0;
  uint64_t bytes = 0;
  int64_t skipped_lines = 0;
  std::string line;  // the summary line
};
PrepareSummary prepare_data(const PrepareOptions& options);
// The byte tokenizer over text files (the original form).
void prepare_data(const std::vector<std::string>& files, const std::string& out_dir, const std::string& separator,
                  int64_t heldout_every);
// Ids are checked against the file's recorded vocab_size (files without one: kByteVocab).
TokenSet load_token_set(const std::string& path, io::Metadata* metadata = nullptr);

// Training data read in place: a Megatron indexed dataset (text/megatron.h) named by its prefix
// (or its .idx / .bin), mapped, never copied; document n (from 1) is held out when n is a multiple
// of kInPlaceHeldoutEvery (prepare-data's default split, so `prepare-data PREFIX` gives the same
// sets and fingerprint). Its vocab_size is its largest id + 1.
constexpr int64_t kInPlaceHeldoutEvery = 20;

// A prepare-data directory's two token sets, checked to be one prepare-data output: the
// fingerprint both files record must be that of their contents (files from before the fingerprint
// was recorded carry none and are read as they are). IoError otherwise.
struct TokenData {
  TokenSet train, held;
  std::string fingerprint;  // data_fingerprint(train, held)
  int64_t vocab_size = kByteVocab;  // recorded by prepare-data (files without it: the byte vocabulary)
  std::string tokenizer;  // the tokenizer's describe() as recorded
  std::string tokenizer_fingerprint = "bytes";  // its fingerprint() as recorded ("megatron": ids as stored)
};
// `dir` may instead name a Megatron dataset, read in place (above).
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
