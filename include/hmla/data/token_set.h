// Token sets: documents as one concatenation of ids (tokens [n] i32 + doc_offsets [docs + 1] i64,
// each document ending in its eos), read from prepare-data's token files or in place from a
// Megatron dataset. Reading checks the ids against the recorded vocabulary and the pair's
// fingerprint (fingerprint.h) against its contents.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hmla/io/safetensors.h"

namespace hmla {

// The byte tokenizer's vocabulary (text/tokenizer.h): what token files that record no vocab_size
// were written with.
constexpr int64_t kByteVocab = 259;

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

}  // namespace hmla
