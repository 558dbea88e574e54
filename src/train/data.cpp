#include "hmla/train/data.h"

#include <algorithm>
#include <functional>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>

#include "hmla/io/paths.h"
#include "hmla/core/index_values.h"
#include "hmla/io/safetensors.h"
#include "hmla/train/run_state.h"

namespace hmla {

std::vector<int32_t> tokenize_bytes(const std::string& text) {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (unsigned char c : text) ids.push_back(int32_t(c) + kByteOffset);
  return ids;
}

std::string detokenize_bytes(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids)
    if (id >= kByteOffset && id < kByteVocab) s.push_back(char(id - kByteOffset));
  return s;
}

namespace {

void add_doc(TokenSet& set, const std::string& text) {
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) return;
  auto ids = tokenize_bytes(text);
  set.tokens.insert(set.tokens.end(), ids.begin(), ids.end());
  set.tokens.push_back(kEosId);
  set.doc_offsets.push_back(static_cast<int64_t>(set.tokens.size()));
}

// Both files of a pair carry the pair's data_fingerprint (run_state.h), so that a reader can
// tell them apart from two files of different prepare-data runs.
constexpr const char* kPairKey = "data_fingerprint";

void save_token_set(const std::string& path, const TokenSet& set, const std::string& fingerprint) {
  io::save_safetensors(path, {{"tokens", Tensor::from_vector<int32_t>({int64_t(set.tokens.size())}, set.tokens)},
                              {"doc_offsets", Tensor::from_vector<int64_t>({int64_t(set.doc_offsets.size())}, set.doc_offsets)}},
                       {{"tokenizer", "bytes+3; pad 0, bos 1, eos 2"}, {kPairKey, fingerprint}});
}

// prepare-data's --out: a new path or a directory whose token files may be replaced.
void check_output_dir(const std::filesystem::path& out) {
  std::error_code ec;
  const std::filesystem::file_type t = std::filesystem::status(out, ec).type();
  if (t == std::filesystem::file_type::not_found) return;
  HMLA_CHECK(t == std::filesystem::file_type::directory, IoError, "prepare-data: --out ", out.string(),
             " exists and is not a directory (nothing was written)");
  for (const char* f : {"train.safetensors", "heldout.safetensors"})
    io::check_output_file((out / f).string(), "prepare-data: --out");
}

// Packs documents (as [begin, end) token ranges, consumed by `take`) into one row.
struct RowBuilder {
  std::vector<int32_t> ids;
  std::vector<int64_t> cu{0};
};

}  // namespace

void prepare_data(const std::vector<std::string>& files, const std::string& out_dir, const std::string& sep,
                  int64_t heldout_every) {
  HMLA_CHECK(!files.empty(), ConfigError, "prepare-data: give at least one text file");
  HMLA_CHECK(heldout_every >= 2, ConfigError, "prepare-data: --heldout-every must be >= 2");
  HMLA_CHECK(!out_dir.empty(), ConfigError, "prepare-data: --out is empty: name the output directory");
  TokenSet train, held;
  train.doc_offsets = held.doc_offsets = {0};
  int64_t n = 0;
  for (const std::string& f : files) {
    std::istringstream in(io::read_file(f));
    std::string line, doc;
    auto flush = [&] {
      if (doc.find_first_not_of(" \t\r\n") != std::string::npos) add_doc(++n % heldout_every ? train : held, doc);
      doc.clear();
    };
    while (std::getline(in, line)) {
      if (line == sep) flush();
      else doc += line + "\n";
    }
    flush();
  }
  HMLA_CHECK(train.docs() > 0 && held.docs() > 0, ConfigError, "prepare-data: found ", n,
             " documents; need enough for both a training and a held-out set");
  // Validate first, create last: every input is read and split and the outputs are checked
  // before the directory exists, so a bad input leaves the disk as it was.
  const std::filesystem::path out(out_dir);
  check_output_dir(out);
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  HMLA_CHECK(!ec, IoError, "prepare-data: --out ", out_dir, ": cannot create the directory (", ec.message(), ")");
  // Two renames, one after the other: a run killed between them leaves a new train.safetensors
  // beside the old heldout.safetensors, which load_token_data refuses (their fingerprints differ).
  const std::string fingerprint = data_fingerprint(train, held);
  save_token_set((out / "train.safetensors").string(), train, fingerprint);
  save_token_set((out / "heldout.safetensors").string(), held, fingerprint);
}

TokenSet load_token_set(const std::string& path, io::Metadata* metadata) {
  io::TensorMap m = io::load_safetensors(path, metadata);
  HMLA_CHECK(m.count("tokens") && m.count("doc_offsets") && m.at("tokens").dim() == 1 &&
                 m.at("doc_offsets").dtype() == DType::i64,
             IoError, path, ": a token file needs tokens [n] and doc_offsets (i64); run hmla prepare-data");
  TokenSet s{token_ids(m.at("tokens"), kByteVocab, path + ": tokens").to_vector<int32_t>(),
             m.at("doc_offsets").to_vector<int64_t>()};
  HMLA_CHECK(s.doc_offsets.size() >= 2 && s.doc_offsets.front() == 0 &&
                 s.doc_offsets.back() == int64_t(s.tokens.size()) &&
                 std::adjacent_find(s.doc_offsets.begin(), s.doc_offsets.end(), std::greater_equal<>()) ==
                     s.doc_offsets.end(),
             IoError, path, ": doc_offsets must rise strictly from 0 to the token count (no empty documents)");
  return s;
}

TokenData load_token_data(const std::string& dir) {
  const std::filesystem::path d(dir);
  io::Metadata mt, mh;
  TokenData data;
  data.train = load_token_set((d / "train.safetensors").string(), &mt);
  data.held = load_token_set((d / "heldout.safetensors").string(), &mh);
  data.fingerprint = data_fingerprint(data.train, data.held);
  const auto t = mt.find(kPairKey), h = mh.find(kPairKey);
  const bool legacy = t == mt.end() && h == mh.end();  // written before prepare-data recorded the pair
  HMLA_CHECK(legacy || (t != mt.end() && h != mh.end() && t->second == data.fingerprint && h->second == data.fingerprint),
             IoError, dir, ": train.safetensors and heldout.safetensors are not one prepare-data output (the ",
             kPairKey, " they record does not match their contents: an interrupted prepare-data, or a file copied ",
             "in from elsewhere); run hmla prepare-data again");
  return data;
}

PackedLoader::PackedLoader(TokenSet data, int64_t seq_len, uint64_t seed)
    : data_(std::move(data)), s_(seq_len), seed_(seed) {
  HMLA_CHECK(seq_len >= 2, ConfigError, "seq_len must be at least 2");
  shuffle();
}

void PackedLoader::shuffle() {
  order_.resize(data_.docs());
  std::iota(order_.begin(), order_.end(), 0);
  std::mt19937_64 rng(seed_ + 0x9e3779b97f4a7c15ull * uint64_t(epoch_ + 1));
  std::shuffle(order_.begin(), order_.end(), rng);
}

void PackedLoader::seek(const std::vector<int64_t>& pos) {
  HMLA_CHECK(pos.size() == 3 && pos[0] >= 0 && pos[1] >= 0 && pos[1] <= data_.docs() && pos[2] >= 0, IoError,
             "data position in the checkpoint is malformed");
  epoch_ = pos[0];
  shuffle();
  const int64_t len = pos[1] < data_.docs() ? data_.doc_offsets[order_[pos[1]] + 1] - data_.doc_offsets[order_[pos[1]]] : 1;
  HMLA_CHECK(pos[2] < len, IoError, "data position in the checkpoint: offset ", pos[2],
             " is past the end of its document (", len, " tokens); was the data prepared again?");
  index_ = pos[1];
  offset_ = pos[2];
}

Batch PackedLoader::next(int64_t rows) {
  std::vector<int32_t> ids(rows * s_, kPadId);
  std::vector<std::vector<int64_t>> cu(rows);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t used = 0;
    cu[r] = {0};
    while (used < s_) {
      if (index_ == data_.docs()) {
        ++epoch_;
        index_ = 0;
        offset_ = 0;
        shuffle();
      }
      const int64_t d = order_[index_];
      const int64_t begin = data_.doc_offsets[d] + offset_, end = data_.doc_offsets[d + 1];
      const int64_t len = end - begin;
      if (len > s_ - used && used > 0) break;  // does not fit: pad this row's tail
      const int64_t take = std::min(len, s_ - used);
      std::copy(data_.tokens.begin() + begin, data_.tokens.begin() + begin + take, ids.begin() + r * s_ + used);
      used += take;
      cu[r].push_back(used);
      if (take == len) {
        ++index_;
        offset_ = 0;
      } else {
        offset_ += take;  // a document longer than a row continues in the next one
      }
    }
  }
  return {Tensor::from_vector<int32_t>({rows, s_}, ids), layout_from_cu_seqlens(s_, cu)};
}

Batch fixed_rows(const TokenSet& data, int64_t seq_len, int64_t rows) {
  std::vector<int32_t> ids(rows * seq_len, kPadId);
  std::vector<std::vector<int64_t>> cu(rows);
  int64_t d = 0;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t used = 0;
    cu[r] = {0};
    while (d < data.docs()) {
      const int64_t len = data.doc_offsets[d + 1] - data.doc_offsets[d];
      if (len > seq_len - used) {
        if (used > 0) break;
        ++d;  // longer than a row: not part of the fixed set
        continue;
      }
      std::copy(data.tokens.begin() + data.doc_offsets[d], data.tokens.begin() + data.doc_offsets[d + 1],
                ids.begin() + r * seq_len + used);
      used += len;
      cu[r].push_back(used);
      ++d;
    }
    if (cu[r].size() == 1) cu[r].push_back(1);  // ran out of documents: one pad "document"
  }
  return {Tensor::from_vector<int32_t>({rows, seq_len}, ids), layout_from_cu_seqlens(seq_len, cu)};
}

}  // namespace hmla
