// `hmla tokenize`: text -> token ids (stdout or a safetensors file) and, with --decode, ids -> text,
// through a Hugging Face tokenizer.json (hmla/text/tokenizer.h).
#include <iostream>
#include <iterator>
#include <sstream>

#include "commands.h"
#include "hmla/core/error.h"
#include "hmla/io/safetensors.h"
#include "hmla/text/tokenizer.h"

namespace hmla::app {

namespace {

struct TokenizeOptions {
  std::string tokenizer, eos_token, out;
  bool add_special = false, decode = false, skip_special = false;
  std::vector<std::string> files;
};

std::string read_stdin() {
  std::ios::sync_with_stdio(false);
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

void run_decode(const text::Tokenizer& tok, bool skip_special) {
  std::string line;
  int64_t n = 0;
  while (std::getline(std::cin, line)) {
    ++n;
    std::istringstream words(line);
    std::vector<int32_t> ids;
    for (std::string w; words >> w;) {
      size_t used = 0;
      long long v = -1;
      try {
        v = std::stoll(w, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      HMLA_CHECK(used == w.size() && v >= 0 && v < tok.vocab_size(), ConfigError, "--decode: line ", n, ": '", w,
                 "' is not an id below the vocabulary size ", tok.vocab_size());
      ids.push_back(int32_t(v));
    }
    std::cout << tok.decode(ids, skip_special) << "\n";
  }
}

void run_tokenize(const TokenizeOptions& o) {
  // Only --add-special asks for the eos: its ids are meant as model input, recorded (with --out)
  // under a fingerprint that covers the eos, as prepare-data's are.
  const auto tok = text::load_tokenizer(
      o.tokenizer, o.eos_token.empty() ? std::nullopt : std::optional<std::string>(o.eos_token), o.add_special);
  if (o.decode) return run_decode(*tok, o.skip_special);
  std::vector<int32_t> ids;
  std::vector<int64_t> offsets{0};
  auto one = [&](const std::string& text) {
    const size_t at = ids.size();
    tok->encode(text, o.add_special, ids);
    offsets.push_back(int64_t(ids.size()));
    if (!o.out.empty()) return;
    for (size_t i = at; i < ids.size(); ++i) std::cout << (i > at ? " " : "") << ids[i];
    std::cout << "\n";
  };
  if (o.files.empty()) one(read_stdin());
  for (const std::string& f : o.files) one(io::read_file(f));
  if (o.out.empty()) return;
  io::save_safetensors(o.out,
                       {{"ids", Tensor::from_vector<int32_t>({int64_t(ids.size())}, ids)},
                        {"doc_offsets", Tensor::from_vector<int64_t>({int64_t(offsets.size())}, offsets)}},
                       {{"tokenizer", tok->describe()}, {"tokenizer_fingerprint", tok->fingerprint()}});
}

}  // namespace

void add_text_commands(CLI::App& app) {
  auto o = std::make_shared<TokenizeOptions>();
  CLI::App* t = app.add_subcommand(
      "tokenize",
      "Token ids of stdin (or of each file, one text each) through a Hugging Face tokenizer.json:\n"
      "one line of space-separated ids per input, or --out F.safetensors (ids i32, doc_offsets i64).\n"
      "--decode reads lines of ids on stdin and prints their text.");
  t->add_option("--tokenizer", o->tokenizer, "a tokenizer.json or a directory holding one")->required();
  t->add_option("--eos-token", o->eos_token, "the eos token (default: tokenizer_config.json's, config.json's; only --add-special needs one)");
  t->add_flag("--add-special", o->add_special, "add the post-processor's special tokens (a bos, for instance)");
  t->add_option("--out", o->out, "write ids and doc_offsets to this safetensors file instead of stdout");
  t->add_flag("--decode", o->decode, "ids on stdin -> text");
  t->add_flag("--skip-special", o->skip_special, "with --decode: leave special tokens out");
  t->add_option("files", o->files, "texts to encode (default: stdin)");
  t->callback([o] {
    HMLA_CHECK(!(o->decode && (!o->files.empty() || !o->out.empty() || o->add_special)), ConfigError,
               "--decode reads ids on stdin: it takes no files, --out or --add-special");
    run_tokenize(*o);
  });
}

}  // namespace hmla::app
