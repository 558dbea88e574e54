// prepare-data's inputs (corpus.h, megatron.h) and its streaming writer (data/prepare.h): JSON Lines rules,
// zstd frames, sorted expansion, Megatron index validation, the byte tokenizer's files bit for bit
// as before, and the same output at any thread count.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zstd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "hmla/core/error.h"
#include "hmla/io/safetensors.h"
#include "hmla/data/fingerprint.h"
#include "hmla/data/prepare.h"
#include "hmla/data/token_set.h"
#include "hmla/text/corpus.h"
#include "hmla/text/megatron.h"
#include "hmla/text/tokenizer.h"

namespace hmla {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path p = fs::temp_directory_path() / ("hmla_corpus_" + std::to_string(::getpid()) + "_" +
                                            ::testing::UnitTest::GetInstance()->current_test_info()->name());
  TempDir() {
    fs::remove_all(p);
    fs::create_directories(p);
  }
  ~TempDir() { fs::remove_all(p); }
  std::string operator/(const std::string& n) const { return (p / n).string(); }
};

void write(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string slurp(const std::string& path) { return io::read_file(path); }

std::vector<std::string> docs_of(const text::CorpusInput& in, text::CorpusCounts& counts, bool strict = false) {
  std::vector<std::string> docs;
  text::CorpusOptions o;
  o.strict = strict;
  text::read_documents(in, o, counts, [&](std::string&& d) { docs.push_back(d); });
  return docs;
}

std::string message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// The rule: blank lines ignored; invalid JSON (a truncated line whose key is intact among them),
// a line that is not an object, one without the top-level key (a nested "text" does not count)
// and one whose value is not a string are each skipped and counted. Escapes are decoded:
// \u00e9, a surrogate pair, \n, \", \\.
TEST(Corpus, JsonLinesKeyMissingKeyInvalidLinesAndEscapes) {
  TempDir d;
  write(d / "a.jsonl",
        "{\"text\": \"first\"}\n"
        "\n"
        "{\"meta\": {\"text\": \"nested\"}, \"id\": 1}\n"
        "{\"text\": 42}\n"
        "{\"text\": \"truncated\", \"more\": \n"
        "[\"text\", \"an array\"]\n"
        "{\"id\": 3, \"text\": \"a\\u00e9\\ud83d\\ude00\\n\\\"q\\\"\\\\\"}\n"
        "{\"text\": \"bad \\ud83d alone\"}\n"
        "{\"text\": \"\"}");
  text::CorpusCounts c;
  const auto docs = docs_of({d / "a.jsonl", text::InputKind::jsonl}, c);
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0], "first");
  EXPECT_EQ(docs[1], "a\xc3\xa9\xf0\x9f\x98\x80\n\"q\"\\");
  EXPECT_EQ(docs[2], "");  // an empty text is a document here; prepare-data drops whitespace-only ones
  EXPECT_EQ(c.lines_missing_key, 1);
  EXPECT_EQ(c.lines_not_string, 1);
  EXPECT_EQ(c.lines_invalid, 3);  // truncated, an array, a lone surrogate
  text::CorpusCounts c2;
  const std::string m = message([&] { docs_of({d / "a.jsonl", text::InputKind::jsonl}, c2, true); });
  EXPECT_NE(m.find("a.jsonl:3: no \"text\" member"), std::string::npos) << m;
  // Through prepare-data: skipped lines are counted in the summary; --strict writes nothing.
  std::string many;
  for (int i = 0; i < 40; ++i) many += "{\"text\": \"doc " + std::to_string(i) + "\"}\n";
  write(d / "b.jsonl", many + "{\"text\": 1}\n{\"id\": 2}\nnot json\n");
  PrepareOptions o;
  o.inputs = {d / "b.jsonl"};
  o.out_dir = d / "out";
  const PrepareSummary sum = prepare_data(o);
  EXPECT_EQ(sum.skipped_lines, 3);
  EXPECT_NE(sum.line.find("1 invalid JSON, 1 without \"text\", 1 not a string"), std::string::npos) << sum.line;
  o.strict = true;
  o.out_dir = d / "strict";
  EXPECT_NE(message([&] { prepare_data(o); }).find("b.jsonl:41: \"text\" is not a string"), std::string::npos);
  EXPECT_FALSE(fs::exists(d / "strict"));
}

std::string zstd_frame(const std::string& s) {  // one frame with its content checksum
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 1);
  std::string out(ZSTD_compressBound(s.size()), '\0');
  out.resize(ZSTD_compress2(c, out.data(), out.size(), s.data(), s.size()));
  ZSTD_freeCCtx(c);
  return out;
}

// Two frames split mid-document read as one stream; a corrupt or truncated frame is one IoError
// naming the file, and prepare-data leaves no --out behind.
TEST(Corpus, ZstdMultiFrameAndCorruptFrames) {
  TempDir d;
  write(d / "t.zst", zstd_frame("one\n%\ntw") + zstd_frame("o\n%\nthree\n"));
  text::CorpusCounts c;
  const auto docs = docs_of({d / "t.zst", text::InputKind::text, true}, c);
  EXPECT_EQ(docs, (std::vector<std::string>{"one\n", "two\n", "three\n"}));
  std::string bad = zstd_frame("x\n%\ny\n") + zstd_frame(std::string(5000, 'z') + "\n%\nw\n");
  const std::string whole = bad;
  bad.back() ^= 0x5a;  // the second frame's checksum
  write(d / "bad.jsonl.zst", bad);
  write(d / "cut.zst", whole.substr(0, whole.size() - 6));
  for (const char* f : {"bad.jsonl.zst", "cut.zst"}) {
    PrepareOptions o;
    o.inputs = {d / f};
    o.out_dir = d / "out";
    const std::string m = message([&] { prepare_data(o); });
    EXPECT_NE(m.find(d / f), std::string::npos) << m;
    EXPECT_TRUE(m.find("corrupt zstd") != std::string::npos || m.find("truncated zstd") != std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    EXPECT_FALSE(fs::exists(d / "out")) << f;
  }
}

// Directories recursively in sorted path order (created here in reverse), hidden files left out;
// globs sorted, a matched directory expanded; a glob matching nothing is an error.
TEST(Corpus, DirectoriesAndGlobsInSortedOrder) {
  TempDir d;
  for (const char* f : {"c/z.txt", "c/sub/b.txt", "c/b.jsonl", "c/a.txt", "c/.hidden", "c/.tmpdir/x.txt"})
    write(d / f, "x\n");
  std::vector<std::string> got;
  for (const auto& in : text::expand_inputs({d / "c"})) got.push_back(fs::relative(in.path, d.p).string());
  EXPECT_EQ(got, (std::vector<std::string>{"c/a.txt", "c/b.jsonl", "c/sub/b.txt", "c/z.txt"}));
  EXPECT_EQ(text::expand_inputs({d / "c"})[1].kind, text::InputKind::jsonl);
  got.clear();
  for (const auto& in : text::expand_inputs({d / "c/*"})) got.push_back(fs::relative(in.path, d.p).string());
  EXPECT_EQ(got, (std::vector<std::string>{"c/a.txt", "c/b.jsonl", "c/sub/b.txt", "c/z.txt"}));
  got.clear();
  for (const auto& in : text::expand_inputs({d / "c/[za]*.txt"})) got.push_back(fs::relative(in.path, d.p).string());
  EXPECT_EQ(got, (std::vector<std::string>{"c/a.txt", "c/z.txt"}));
  EXPECT_THROW(text::expand_inputs({d / "c/*.none"}), ConfigError);
  PrepareOptions o;  // --out inside an input directory: its token files would be read back as text
  o.inputs = {d / "c"};
  o.out_dir = d / "c/sub/out";
  write(d / "c/sub/out/train.safetensors", "an earlier run's");
  EXPECT_NE(message([&] { prepare_data(o); }).find("lies in --out"), std::string::npos);
  EXPECT_THROW(text::expand_inputs({d / "missing.txt"}), ConfigError);
}

// What prepare_data wrote before it streamed: whole files split at separator lines, the byte ids
// (byte + 3) + eos (2), every N-th document held out, one serialize_safetensors per set.
std::pair<std::string, std::string> old_prepare(const std::vector<std::string>& files, int64_t every) {
  TokenSet train, held;
  train.doc_offsets = held.doc_offsets = {0};
  int64_t n = 0;
  auto add = [&](const std::string& doc) {
    if (doc.find_first_not_of(" \t\r\n") == std::string::npos) return;
    TokenSet& s = ++n % every ? train : held;
    for (unsigned char c : doc) s.tokens.push_back(int32_t(c) + 3);
    s.tokens.push_back(2);
    s.doc_offsets.push_back(int64_t(s.tokens.size()));
  };
  for (const std::string& f : files) {
    std::istringstream in(io::read_file(f));
    std::string line, doc;
    while (std::getline(in, line)) {
      if (line == "%") {
        add(doc);
        doc.clear();
      } else {
        doc += line + "\n";
      }
    }
    add(doc);
  }
  const std::string fp = data_fingerprint(train, held);
  auto ser = [&](const TokenSet& s) {
    return io::serialize_safetensors(
        {{"tokens", Tensor::from_vector<int32_t>({int64_t(s.tokens.size())}, s.tokens)},
         {"doc_offsets", Tensor::from_vector<int64_t>({int64_t(s.doc_offsets.size())}, s.doc_offsets)}},
        {{"tokenizer", "bytes+3; pad 0, bos 1, eos 2"}, {"data_fingerprint", fp}});
  };
  return {ser(train), ser(held)};
}

// Files without a final newline, "%\r" (not a separator), blank documents, several files, several
// batches: the streamed files equal the old ones byte for byte, at 1 and 3 threads.
TEST(Corpus, ByteTokenizerFilesBitIdenticalToTheOldPrepareData) {
  TempDir d;
  std::string big;  // ~9 MB in ~330,000 documents: several batches (4 MiB or 65,536 documents each)
  for (int i = 0; big.size() < (9 << 20); ++i)
    big += "fortune " + std::to_string(i) + (i % 7 ? "\nline two\n%\n" : "\n%\r\n%\n\n%\n");
  write(d / "a.txt", big);
  write(d / "b.txt", "no newline at the end\n%\nlast");
  const auto [train, held] = old_prepare({d / "a.txt", d / "b.txt"}, 5);
  for (int threads : {1, 3}) {
    PrepareOptions o;
    o.inputs = {d / "a.txt", d / "b.txt"};
    o.out_dir = d / ("out" + std::to_string(threads));
    o.heldout_every = 5;
    o.threads = threads;
    prepare_data(o);
    EXPECT_EQ(slurp(o.out_dir + "/train.safetensors"), train) << threads;
    EXPECT_EQ(slurp(o.out_dir + "/heldout.safetensors"), held) << threads;
    EXPECT_EQ(fs::directory_iterator(o.out_dir) == fs::directory_iterator(), false);
    int files = 0;
    for (auto it = fs::directory_iterator(o.out_dir); it != fs::directory_iterator(); ++it) ++files;
    EXPECT_EQ(files, 2);  // no temporaries left
  }
}

// data/demo (written by the original prepare-data) comes out again from its own text.
TEST(Corpus, TheDemoDataComesOutAgainFromItsText) {
  const std::string demo = std::string(HMLA_SOURCE_DIR) + "/data/demo";
  const TokenData data = load_token_data(demo);
  const auto bytes = text::byte_tokenizer();
  TempDir d;
  std::string text;
  size_t t = 0, h = 0;
  for (int64_t n = 1; t < size_t(data.train.docs()) || h < size_t(data.held.docs()); ++n) {
    const TokenSet& s = n % 20 ? data.train : data.held;
    size_t& i = n % 20 ? t : h;
    const std::vector<int32_t> ids(s.tokens.begin() + s.doc_offsets[i], s.tokens.begin() + s.doc_offsets[i + 1] - 1);
    text += bytes->decode(ids, true) + "%\n";
    ++i;
  }
  write(d / "fortunes.txt", text);
  PrepareOptions o;
  o.inputs = {d / "fortunes.txt"};
  o.out_dir = d / "out";
  prepare_data(o);
  const TokenData again = load_token_data(o.out_dir);
  EXPECT_EQ(again.train.tokens, data.train.tokens);
  EXPECT_EQ(again.train.doc_offsets, data.train.doc_offsets);
  EXPECT_EQ(again.held.tokens, data.held.tokens);
  EXPECT_EQ(again.fingerprint, data.fingerprint);  // resumed runs of old data keep their fingerprint
}

// A word-level tokenizer with a bos, to take the non-byte path: ids 3 + (word hash % 97), bos 1, eos 2.
class WordTokenizer final : public text::Tokenizer {
 public:
  using Tokenizer::encode;
  void encode(std::string_view s, bool add_special, std::vector<int32_t>& out) const override {
    if (add_special) out.push_back(1);
    size_t h = 0;
    bool in = false;
    for (char c : std::string(s) + " ") {
      if (c == ' ' || c == '\n') {
        if (in) out.push_back(int32_t(3 + h % 97));
        h = 0;
        in = false;
      } else {
        h = h * 31 + static_cast<unsigned char>(c);
        in = true;
      }
    }
  }
  std::string decode(std::span<const int32_t>, bool) const override { return ""; }
  int64_t vocab_size() const override { return 100; }
  int32_t eos_id() const override { return 2; }
  bool is_stop(int32_t id) const override { return id == 2; }
  std::string describe() const override { return "words (test), vocab 100"; }
  std::string fingerprint() const override { return "fnv1a:test"; }
};

// The same files at 1, 2 and 4 threads (batches cut at different places among the threads), each
// document bos + words + eos, and the tokenizer and vocab_size recorded.
TEST(Corpus, SameOutputAtAnyThreadCountWithAnotherTokenizer) {
  TempDir d;
  std::string j;
  for (int i = 0; i < 5000; ++i) j += "{\"text\": \"doc " + std::to_string(i) + std::string(i % 13, 'w') + " end\"}\n";
  write(d / "a.jsonl", j);
  WordTokenizer tok;
  std::string first;
  for (int threads : {1, 2, 4}) {
    PrepareOptions o;
    o.inputs = {d / "a.jsonl"};
    o.out_dir = d / ("out" + std::to_string(threads));
    o.tokenizer = &tok;
    o.threads = threads;
    prepare_data(o);
    const std::string bytes = slurp(o.out_dir + "/train.safetensors") + slurp(o.out_dir + "/heldout.safetensors");
    if (first.empty()) first = bytes;
    EXPECT_EQ(bytes, first) << threads;
  }
  io::Metadata m;
  const TokenSet s = load_token_set(d / "out1/train.safetensors", &m);
  EXPECT_EQ(m.at("vocab_size"), "100");
  EXPECT_EQ(m.at("tokenizer"), "words (test), vocab 100");
  EXPECT_EQ(m.at("tokenizer_fingerprint"), "fnv1a:test");
  EXPECT_EQ(s.tokens[0], 1);
  EXPECT_EQ(s.tokens[s.doc_offsets[1] - 1], 2);
  EXPECT_EQ(s.doc_offsets[1], 5);  // bos, "doc", "0", "end", eos
  EXPECT_EQ(load_token_data(d / "out1").vocab_size, 100);
}

// A file's recorded vocab_size bounds its ids (files without one: the byte vocabulary, 259).
TEST(Corpus, RecordedVocabSizeBoundsTheIds) {
  TempDir d;
  auto save = [&](int32_t id, const io::Metadata& m) {
    io::save_safetensors(d / "t.safetensors", {{"tokens", Tensor::from_vector<int32_t>({2}, {id, 2})},
                                               {"doc_offsets", Tensor::from_vector<int64_t>({2}, {0, 2})}}, m);
    return d / "t.safetensors";
  };
  EXPECT_NO_THROW(load_token_set(save(258, {})));
  EXPECT_THROW(load_token_set(save(259, {})), Error);
  EXPECT_NO_THROW(load_token_set(save(1000, {{"vocab_size", "1001"}})));
  EXPECT_THROW(load_token_set(save(1001, {{"vocab_size", "1001"}})), Error);
  EXPECT_THROW(load_token_set(save(5, {{"vocab_size", "ten"}})), IoError);
}

// A Megatron dataset as indexed_dataset.py writes one: a sequence per document.
template <class T>
void write_megatron(const std::string& prefix, const std::vector<std::vector<int32_t>>& docs, int code) {
  std::string bin, idx("MMIDIDX\0\0", 9);
  auto put = [&](auto v) { idx.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(uint64_t(1));
  idx.push_back(char(code));
  put(uint64_t(docs.size()));
  put(uint64_t(docs.size() + 1));
  for (const auto& d : docs) put(int32_t(d.size()));
  int64_t ptr = 0;
  for (const auto& d : docs) {
    put(ptr);
    ptr += int64_t(d.size() * sizeof(T));
    for (int32_t id : d) {
      const T v = T(id);
      bin.append(reinterpret_cast<const char*>(&v), sizeof v);
    }
  }
  for (size_t i = 0; i <= docs.size(); ++i) put(int64_t(i));
  write(prefix + ".idx", idx);
  write(prefix + ".bin", bin);
}

// int32 and uint16 datasets of the byte ids of some text convert to the files prepare-data writes
// from the text itself (same tokens, documents, held-out split and fingerprint).
TEST(Corpus, MegatronConvertsToTheSameTokensAsTheText) {
  TempDir d;
  std::string text;
  std::vector<std::vector<int32_t>> docs;
  const auto bytes = text::byte_tokenizer();
  for (int i = 0; i < 40; ++i) {
    const std::string doc = "document " + std::to_string(i) + "\n";
    text += doc + "%\n";
    docs.push_back(bytes->encode(doc));
    docs.back().push_back(bytes->eos_id());
  }
  write(d / "t.txt", text);
  write_megatron<int32_t>(d / "m32", docs, 4);
  write_megatron<uint16_t>(d / "m16", docs, 8);
  PrepareOptions o;
  o.inputs = {d / "t.txt"};
  o.out_dir = d / "text";
  o.heldout_every = 4;
  prepare_data(o);
  const TokenData ref = load_token_data(d / "text");
  for (const char* arg : {"m32", "m16.idx", "m16.bin"}) {
    o.inputs = {d / arg};
    o.out_dir = d / (std::string("out_") + arg);
    prepare_data(o);
    const TokenData got = load_token_data(o.out_dir);
    EXPECT_EQ(got.fingerprint, ref.fingerprint) << arg;
    EXPECT_EQ(got.vocab_size, int64_t(3 + 'u' + 1)) << arg;  // the largest id + 1
  }
}

// Each defect of an index is one IoError naming the .idx and what is wrong, before anything is written.
TEST(Corpus, MegatronIndexValidation) {
  TempDir d;
  const std::vector<std::vector<int32_t>> docs{{5, 6, 7}, {8, 9}, {10}};
  write_megatron<int32_t>(d / "m", docs, 4);
  const std::string idx = slurp(d / "m.idx"), bin = slurp(d / "m.bin");
  ASSERT_NO_THROW(text::MegatronDataset::open(d / "m"));
  auto expect = [&](const std::string& idx_bytes, const std::string& bin_bytes, const std::string& needle) {
    write(d / "m.idx", idx_bytes);
    write(d / "m.bin", bin_bytes);
    const std::string m = message([&] {
      PrepareOptions o;
      o.inputs = {d / "m"};
      o.out_dir = d / "out";
      prepare_data(o);
    });
    EXPECT_NE(m.find(d / "m.idx"), std::string::npos) << m;
    EXPECT_NE(m.find(needle), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    EXPECT_FALSE(fs::exists(d / "out")) << needle;
  };
  auto patched = [&](size_t at, const void* v, size_t n) {
    std::string s = idx;
    std::memcpy(s.data() + at, v, n);
    return s;
  };
  expect(idx, bin.substr(0, bin.size() - 4), "but " + (d / "m.bin") + " has 20");  // .bin shorter than the sizes
  expect(idx, bin + std::string(4, '\0'), "has 28");
  expect(idx.substr(0, idx.size() - 8), bin, "(truncated)");
  expect(idx.substr(0, 20), bin, "truncated");
  expect(patched(0, "XXIDIDX", 7), bin, "bad magic");
  const uint64_t v2 = 2;
  expect(patched(9, &v2, 8), bin, "version 2");
  expect(patched(17, "\x07", 1), bin, "float type");
  expect(patched(17, "\x09", 1), bin, "unknown dtype code 9");
  const int64_t p = 8;  // sequence 1 should start at byte 12
  expect(patched(34 + 12 + 8, &p, 8), bin, "sequence 1 points at byte 8");
  const int64_t end = 4;  // the document indices end at 4, not 3
  expect(patched(34 + 36 + 24, &end, 8), bin, "not at the sequence count");
  const int64_t down = 0;
  expect(patched(34 + 36 + 8, &down, 8), bin, "rise strictly");
  write(d / "m.idx", idx);
  std::string neg = bin;
  const int32_t minus = -4;
  std::memcpy(neg.data() + 4, &minus, 4);
  write(d / "m.bin", neg);
  EXPECT_THROW(text::MegatronDataset::open(d / "m").max_id(), IoError);
}

}  // namespace
}  // namespace hmla
