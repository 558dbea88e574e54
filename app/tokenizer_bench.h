// `hmla bench tokenizer`: hmla's encoder next to Hugging Face tokenizers' encode_batch on the same
// lines at the same thread count (tests/text/tokenizers_bench.py), ids checked equal first.
#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace hmla::app {

struct TokenizerBenchOptions {
  std::string tokenizer, input;
  std::vector<int64_t> threads{1, 2};
  std::string python = "/tmp/tokvenv/bin/python";  // "": hmla only
  std::string script;                              // tokenizers_bench.py (default: the source tree's)
  int64_t reps = 3;
};

void run_tokenizer_bench(const TokenizerBenchOptions& o, std::ostream& out);

}  // namespace hmla::app
