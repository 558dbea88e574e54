// hmla::text tokenizers against Hugging Face tokenizers 0.23.3 (tests/text/make_tokenizer_fixtures.py):
// ids with and without add_special and decodes on every fixture text of every case; hand-made files
// that only merge-by-rank BPE and UCP regexes pass; bad files as one-line errors.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "hmla/core/error.h"
#include "hmla/text/tokenizer.h"
#include "hmla/text/utf8.h"
#include "unicode_recent.h"

namespace fs = std::filesystem;
using nlohmann::json;
using hmla::text::load_tokenizer;

namespace {

const fs::path kFixtures = fs::path(HMLA_SOURCE_DIR) / "tests" / "text" / "fixtures";

std::string from_hex(const std::string& h) {
  std::string s;
  for (size_t i = 0; i + 1 < h.size(); i += 2) s.push_back(char(std::stoi(h.substr(i, 2), nullptr, 16)));
  return s;
}

json read_json(const fs::path& p) {
  std::ifstream f(p);
  return json::parse(f);
}

std::optional<std::string> case_eos(const std::string& name) {
  if (name == "split_behaviours") return "<|eos|>";  // no eos file beside it
  return std::nullopt;
}

class Fixture : public testing::TestWithParam<std::string> {};

TEST_P(Fixture, IdsAndDecodesEqualTokenizers) {
  const fs::path dir = kFixtures / GetParam();
  const json want = read_json(dir / "expected.json");
  ASSERT_EQ(want["tokenizers"], "0.23.3") << "fixtures from another tokenizers version: rerun the script";
  const auto tok = load_tokenizer(dir.string(), case_eos(GetParam()), /*eos_required=*/false);
  int n = 0;
  for (const json& t : want["texts"]) {
    const std::string text = from_hex(t["hex"]);
    SCOPED_TRACE("text " + std::to_string(n++) + ": " + json(hmla::text::replace_invalid_utf8(text)).dump());
    const std::vector<int32_t> ids = tok->encode(text, false);
    EXPECT_EQ(ids, t["ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(tok->encode(text, true), t["ids_special"].get<std::vector<int32_t>>());
    const std::vector<int32_t> ref = t["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok->decode(ref, false), t["decoded"].get<std::string>());
    EXPECT_EQ(tok->decode(ref, true), t["decoded_skip"].get<std::string>());
    if (t["roundtrip"].get<bool>()) {
      EXPECT_EQ(tok->decode(ids, false), hmla::text::replace_invalid_utf8(text));
    }
  }
  EXPECT_GT(n, 20);
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, Fixture,
                         testing::Values("deepseek_v3", "deepseek_v4", "glm", "nfkc_ignore_merges",
                                         "split_behaviours", "bpe_prefix_fallback"));

TEST(HfTokenizer, NoEosNeededUnlessAsked) {
  // deepseek_v4 has no tokenizer_config.json or config.json beside it, as hmla tokenize may meet.
  const std::string v4 = (kFixtures / "deepseek_v4").string();
  const auto tok = load_tokenizer(v4, std::nullopt, /*eos_required=*/false);
  EXPECT_EQ(tok->eos_id(), -1);
  EXPECT_FALSE(tok->is_stop(0) || tok->is_stop(1));
  EXPECT_NE(tok->describe().find("eos none"), std::string::npos) << tok->describe();
  EXPECT_NE(tok->fingerprint(), load_tokenizer(v4, "<｜end▁of▁sentence｜>")->fingerprint());
  EXPECT_EQ(load_tokenizer(v4, "<｜end▁of▁sentence｜>", false)->eos_id(), 1);
  try {
    load_tokenizer(v4);
    ADD_FAILURE() << "no error without an eos";
  } catch (const hmla::ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("pass --eos-token"), std::string::npos) << e.what();
  }
}

TEST(HfTokenizer, EosVocabAndFingerprint) {
  const auto ds = load_tokenizer((kFixtures / "deepseek_v3").string());  // tokenizer_config {"content": ...}
  EXPECT_EQ(ds->eos_id(), 1);
  EXPECT_TRUE(ds->is_stop(1));
  EXPECT_EQ(ds->vocab_size(), 2000);
  const auto glm = load_tokenizer((kFixtures / "glm" / "tokenizer.json").string());  // tokenizer_config string
  EXPECT_EQ(glm->eos_id(), 0);                                                       // <|endoftext|>
  const auto nf = load_tokenizer((kFixtures / "nfkc_ignore_merges").string());        // config.json eos_token_id
  EXPECT_EQ(nf->eos_id(), 0);
  EXPECT_EQ(nf->vocab_size(), 1003);  // the added tokens count
  const auto other = load_tokenizer((kFixtures / "deepseek_v3").string(), "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(other->eos_id(), 0);
  EXPECT_EQ(ds->fingerprint().rfind("fnv1a:", 0), 0u);
  EXPECT_EQ(ds->fingerprint().size(), 6u + 16u);
  EXPECT_NE(ds->fingerprint(), other->fingerprint());
  EXPECT_EQ(ds->fingerprint(), load_tokenizer((kFixtures / "deepseek_v3").string())->fingerprint());
  EXPECT_NE(ds->describe().find("vocab 2000"), std::string::npos);
}

TEST(HfTokenizer, ThreadsGetTheSameIds) {
  const auto tok = load_tokenizer((kFixtures / "deepseek_v3").string());
  std::ifstream f(kFixtures / "multilingual.txt");
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const std::vector<int32_t> want = tok->encode(text);
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 20; ++rep) got[t] = tok->encode(text);
    });
  for (auto& th : threads) th.join();
  for (const auto& g : got) EXPECT_EQ(g, want);
}

// ---- hand-made files: what a wrong implementation would get wrong --------------------------------

std::string byte_char(int b) {  // GPT-2's byte-level character of byte b, as UTF-8
  int next = 256, cp = -1;
  for (int x = 0; x < 256; ++x) {
    const bool keep = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174;
    const int c = keep ? x : next++;
    if (x == b) cp = c;
  }
  std::string s;
  if (cp < 0x80) s.push_back(char(cp));
  else s.push_back(char(0xC0 | (cp >> 6))), s.push_back(char(0x80 | (cp & 0x3F)));
  return s;
}

// A byte-level BPE over all 256 bytes plus `extra` tokens and `merges`, the pre-tokenizer given.
fs::path write_tiny(const std::string& name, const json& pre, const std::vector<std::string>& extra,
                    const json& merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  for (size_t i = 0; i < extra.size(); ++i) vocab[extra[i]] = 256 + int(i);
  json spec = {{"version", "1.0"}, {"added_tokens", json::array()}, {"normalizer", nullptr},
               {"pre_tokenizer", pre}, {"post_processor", nullptr}, {"decoder", {{"type", "ByteLevel"}}},
               {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"dropout", nullptr}}}};
  const fs::path dir = fs::temp_directory_path() / ("hmla_tok_" + std::to_string(::getpid())) / name;
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << spec.dump();
  return dir / "tokenizer.json";
}

TEST(HfTokenizer, MergesByRankNotLeftmostFirst) {
  // "abc": b+c has the better rank, so a | bc; a leftmost-first BPE would give ab | c.
  const json pre = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  const auto tok = load_tokenizer(write_tiny("rank", pre, {"bc", "ab"}, json{"b c", "a b"}).string(), "a");
  EXPECT_EQ(tok->encode("abc"), (std::vector<int32_t>{'a', 256}));
  EXPECT_EQ(tok->encode("abab"), (std::vector<int32_t>{257, 257}));
  EXPECT_EQ(tok->decode(tok->encode("abcab"), false), "abcab");
}

TEST(HfTokenizer, RegexesAreUnicodeAware) {
  // \s in UCP mode is U+3000 and U+00A0 too; without PCRE2_UCP "a\u3000b" stays one piece.
  const json pre = {{"type", "Sequence"},
                    {"pretokenizers",
                     {{{"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}, {"behavior", "Removed"}},
                      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  const auto tok = load_tokenizer(write_tiny("ucp", pre, {"ab"}, json::array({json{"a", "b"}})).string(), "a");
  EXPECT_EQ(tok->encode("a\u3000b"), (std::vector<int32_t>{'a', 'b'}));
  EXPECT_EQ(tok->encode("a\u00a0b ab"), (std::vector<int32_t>{'a', 'b', 256}));
}

TEST(HfTokenizer, RegexesKnowUnicode16) {
  // Code points assigned in Unicode 15.0-16.0, which PCRE2 10.42 has as unassigned: each pattern's
  // matches are removed, and what is left must be what tokenizers 0.23.3 leaves.
  const auto left = [](const std::string& name, const std::string& pattern, const std::string& text) {
    const json pre = {{"type", "Sequence"},
                      {"pretokenizers",
                       {{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Removed"}},
                        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
    const auto tok = load_tokenizer(write_tiny(name, pre, {}, json::array()).string(), "a");
    return tok->decode(tok->encode(text), false);
  };
  EXPECT_EQ(left("l", "\\p{L}", "x\u1c89\U00011f04\U00031350!"), "!");  // Lu 16.0, Lo 15.0, CJK Ext. H
  EXPECT_EQ(left("n", "\\p{N}", "1\U00011f51\U0001d2c0z"), "z");           // Kawi Nd, Kaktovik No (15.0)
  EXPECT_EQ(left("neg", "[^\\s\\p{L}\\p{N}]+", "\U00011f04 \U0001fae8"), "\U00011f04 ");  // new So only
  EXPECT_EQ(left("notl", "\\P{L}", "a\U00011f04.\U0001fae8"), "a\U00011f04");
  EXPECT_EQ(left("d", "\\d", "\U00010d40x"), "x");                          // Garay digit (16.0)
  EXPECT_EQ(left("w", "\\w+", "\U00011f04\u0897 ."), " .");                 // Lo 15.0, Mn 16.0
  EXPECT_EQ(left("ps", "[\\p{P}\\p{S}]", "\U00011f43\U0001fae8\u2ffca"), "a");
  EXPECT_EQ(left("lu", "\\p{Lu}", "\u1c89\u1c8a"), "\u1c8a");

  using hmla::text::has_recent_code_point;  // which pieces run the widened regex
  EXPECT_FALSE(has_recent_code_point("ab \u0896\u4e00\U0001f979"));  // U+0896 unassigned; 14.0 emoji
  EXPECT_TRUE(has_recent_code_point("ab \u0897"));                     // the first 15.0-16.0 code point
  EXPECT_TRUE(has_recent_code_point("\u4e00\U0002ebf0x"));             // CJK Ext. I (15.1)
  using hmla::text::with_recent_unicode;
  EXPECT_EQ(with_recent_unicode("abc|\\s+(?!\\S)"), "abc|\\s+(?!\\S)");
  EXPECT_EQ(with_recent_unicode("\\p{Han}\\Q\\p{L}\\E[\\P{L}]"), "\\p{Han}\\Q\\p{L}\\E[\\P{L}]");  // the limits
  EXPECT_EQ(with_recent_unicode("[[:alpha:]\\p{L}]").rfind("[[:alpha:]\\p{L}\\x{", 0), 0u);
  EXPECT_EQ(with_recent_unicode("\\c[\\p{L}").rfind("\\c[[\\p{L}\\x{", 0), 0u);  // \c[ opens no class
  EXPECT_EQ(with_recent_unicode("[\\]\\p{N}]").rfind("[\\]\\p{N}\\x{", 0), 0u);
}

TEST(HfTokenizer, LongRunsStayFast) {
  // One 1 MB piece (a letter run, a space run): the heap BPE is O(n log n), the regexes linear.
  const auto tok = load_tokenizer((kFixtures / "glm").string());
  for (const std::string& text : {std::string(1 << 20, 'a'), std::string(1 << 20, ' '), std::string(1 << 19, '7')}) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<int32_t> ids = tok->encode(text);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);
    EXPECT_EQ(tok->decode(ids, false), text);
  }
}

TEST(Utf8, MaximalSubpartsAsPython) {
  using hmla::text::replace_invalid_utf8;
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(replace_invalid_utf8("\xed\xa0\x80"), r + r + r);  // a surrogate: three subparts
  EXPECT_EQ(replace_invalid_utf8("\xf0\x9f\x98"), r);          // a truncated 4-byte sequence: one
  EXPECT_EQ(replace_invalid_utf8("\xc0\xaf"), r + r);          // an overlong: two
  EXPECT_EQ(replace_invalid_utf8("a\xe2\x82z"), "a" + r + "z");
  EXPECT_EQ(replace_invalid_utf8("\xf4\x90\x80\x80"), r + r + r + r);  // above U+10FFFF
  EXPECT_TRUE(hmla::text::is_valid_utf8("héllo 👍"));
  EXPECT_FALSE(hmla::text::is_valid_utf8("abcdefghij\xff"));
}

TEST(ByteTokenizer, IdsAreTheOldTokenizeBytes) {
  const auto tok = hmla::text::byte_tokenizer();
  const std::string text = std::string("héllo\n\0\xff wörld 👍", 20);
  std::vector<int32_t> want;
  for (unsigned char c : text) want.push_back(int32_t(c) + 3);
  EXPECT_EQ(tok->encode(text), want);
  EXPECT_EQ(tok->decode(want, true), text);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_EQ(tok->fingerprint(), "bytes");
}

// ---- bad files ------------------------------------------------------------------------------------

template <class E>
void expect_one_line(const fs::path& file, const std::string& needle, const std::optional<std::string>& eos = "a") {
  try {
    load_tokenizer(file.string(), eos);
    ADD_FAILURE() << "no error for " << needle;
  } catch (const E& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong error type for " << needle << ": " << e.what();
  }
}

fs::path mutate(const std::string& name, const std::function<void(json&)>& edit) {
  json spec = read_json(kFixtures / "glm" / "tokenizer.json");
  edit(spec);
  const fs::path dir = fs::temp_directory_path() / ("hmla_tok_" + std::to_string(::getpid())) / name;
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << spec.dump();
  return dir / "tokenizer.json";
}

TEST(HfTokenizer, BadFilesAreOneLineErrors) {
  using hmla::ConfigError;
  using hmla::IoError;
  const fs::path dir = fs::temp_directory_path() / ("hmla_tok_" + std::to_string(::getpid())) / "truncated";
  fs::create_directories(dir);
  {
    std::ifstream f(kFixtures / "glm" / "tokenizer.json");
    std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::ofstream(dir / "tokenizer.json") << s.substr(0, s.size() / 2);
  }
  expect_one_line<IoError>(dir / "tokenizer.json", "tokenizer.json");
  expect_one_line<IoError>(dir / "missing.json", "no such file");
  expect_one_line<IoError>(mutate("unknown_merge", [](json& s) { s["model"]["merges"][5] = {"zzzq", "a"}; }),
                           "not in the vocabulary");
  expect_one_line<IoError>(mutate("dup_id", [](json& s) { s["model"]["vocab"]["a"] = 40; }), "appears twice");
  expect_one_line<IoError>(mutate("neg_id", [](json& s) { s["model"]["vocab"]["a"] = -5; }), "outside");
  expect_one_line<IoError>(mutate("huge_id", [](json& s) { s["model"]["vocab"]["a"] = 1ull << 62; }), "outside");
  expect_one_line<IoError>(mutate("sparse_id", [](json& s) { s["model"]["vocab"]["a"] = 1 << 23; }), "dense");
  expect_one_line<IoError>(mutate("sparse_added", [](json& s) { s["added_tokens"][1]["id"] = 1 << 23; }), "dense");
  expect_one_line<IoError>(mutate("str_id", [](json& s) { s["model"]["vocab"]["a"] = "7"; }), "not an integer");
  expect_one_line<IoError>(mutate("added_dup", [](json& s) { s["added_tokens"][1]["id"] = 0; }), "appears twice");
  expect_one_line<IoError>(
      mutate("bad_regex", [](json& s) { s["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(\\p{L}+"; }),
      "does not compile");
  expect_one_line<IoError>(mutate("merges_obj", [](json& s) { s["model"]["merges"] = 3; }), "merges");
  expect_one_line<IoError>(mutate("merge_str", [](json& s) { s["model"]["merges"][0] = "abc"; }), "merges[0]");
  expect_one_line<ConfigError>(mutate("dropout", [](json& s) { s["model"]["dropout"] = 0.1; }), "dropout");
  expect_one_line<ConfigError>(mutate("lower", [](json& s) { s["normalizer"] = {{"type", "Lowercase"}}; }),
                               "normalizer Lowercase");
  expect_one_line<ConfigError>(mutate("wordpiece", [](json& s) { s["model"]["type"] = "WordPiece"; }),
                               "model WordPiece");
  expect_one_line<ConfigError>(mutate("metaspace", [](json& s) { s["decoder"] = {{"type", "Metaspace"}}; }),
                               "decoder Metaspace");
  expect_one_line<ConfigError>(mutate("no_eos", [](json&) {}), "--eos-token", std::nullopt);
  expect_one_line<ConfigError>(mutate("bad_eos", [](json&) {}), "--eos-token", "<nope>");
}

}  // namespace
