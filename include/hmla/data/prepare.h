// prepare-data (docs/data.md): text, JSON Lines, zstd and Megatron inputs to a pair of token files
// (train.safetensors, heldout.safetensors), tokenized on several threads with an output that does
// not depend on their number, streamed through temporaries, written atomically.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "hmla/text/tokenizer.h"

namespace hmla {

// The documents of every input, tokenized by `tokenizer` (each document = encode(text,
// add_special) + eos_id(); whitespace-only documents are dropped) or, for a Megatron dataset, its
// ids as stored; every `heldout_every`-th document goes to the held-out set. Streams: input read
// in chunks, documents tokenized in batches on `threads` threads, tokens written to unnamed
// temporaries in --out and assembled into out_dir/{train,heldout}.safetensors at the end, each
// written atomically and recording the pair's data_fingerprint, the tokenizer and (for any but
// the byte tokenizer, whose files stay as they always were) its vocab_size. An error leaves
// nothing behind.
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

}  // namespace hmla
