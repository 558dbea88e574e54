// Token sets from disk (token_set.h): a prepare-data token file checked (ids against its recorded
// vocabulary, offsets rising strictly), a pair checked against its recorded fingerprint, or a
// Megatron dataset mapped and split in place.
#include "hmla/data/token_set.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <functional>

#include "hmla/core/error.h"
#include "hmla/core/index_values.h"
#include "hmla/data/fingerprint.h"
#include "hmla/text/corpus.h"
#include "hmla/text/megatron.h"

namespace hmla {

namespace {

int64_t recorded_vocab(const io::Metadata& m, const std::string& path) {
  const auto v = m.find("vocab_size");
  if (v == m.end()) return kByteVocab;  // the byte tokenizer's files record none
  int64_t n = 0;
  const auto [end, err] = std::from_chars(v->second.data(), v->second.data() + v->second.size(), n);
  HMLA_CHECK(err == std::errc() && end == v->second.data() + v->second.size() && n >= 1, IoError, path,
             ": metadata vocab_size '", v->second, "' is not a positive integer");
  return n;
}

}  // namespace

TokenSet load_token_set(const std::string& path, io::Metadata* metadata) {
  io::Metadata local;
  io::Metadata& md = metadata ? *metadata : local;
  io::TensorMap m = io::load_safetensors(path, &md);
  HMLA_CHECK(m.count("tokens") && m.count("doc_offsets") && m.at("tokens").dim() == 1 &&
                 m.at("doc_offsets").dtype() == DType::i64,
             IoError, path, ": a token file needs tokens [n] and doc_offsets (i64); run hmla prepare-data");
  TokenSet s{token_ids(m.at("tokens"), recorded_vocab(md, path), path + ": tokens").to_vector<int32_t>(),
             m.at("doc_offsets").to_vector<int64_t>()};
  HMLA_CHECK(s.doc_offsets.size() >= 2 && s.doc_offsets.front() == 0 &&
                 s.doc_offsets.back() == int64_t(s.tokens.size()) &&
                 std::adjacent_find(s.doc_offsets.begin(), s.doc_offsets.end(), std::greater_equal<>()) ==
                     s.doc_offsets.end(),
             IoError, path, ": doc_offsets must rise strictly from 0 to the token count (no empty documents)");
  return s;
}

namespace {

class MegatronView final : public TokenView {
 public:
  explicit MegatronView(text::MegatronDataset ds) : ds_(std::move(ds)) {}
  void copy(int64_t begin, int64_t n, int32_t* out) const override { ds_.copy(begin, n, out); }
  const text::MegatronDataset& dataset() const { return ds_; }

 private:
  text::MegatronDataset ds_;
};

TokenData load_megatron_in_place(const std::string& prefix) {
  const auto view = std::make_shared<MegatronView>(text::MegatronDataset::open(prefix));
  const text::MegatronDataset& ds = view->dataset();
  const int64_t top = ds.max_id();  // every id checked once, here
  TokenData data;
  for (TokenSet* s : {&data.train, &data.held}) {
    s->view = view;
    s->doc_offsets = {0};
  }
  for (int64_t d = 0; d < ds.docs(); ++d) {
    TokenSet& s = (d + 1) % kInPlaceHeldoutEvery ? data.train : data.held;
    s.doc_starts.push_back(ds.doc_begin(d));
    s.doc_offsets.push_back(s.doc_offsets.back() + ds.doc_begin(d + 1) - ds.doc_begin(d));
  }
  HMLA_CHECK(data.train.docs() > 0 && data.held.docs() > 0, IoError, ds.prefix(), ".idx: ", ds.docs(),
             " documents; read in place, every ", kInPlaceHeldoutEvery, "-th is held out, so at least ",
             kInPlaceHeldoutEvery, " are needed");
  data.fingerprint = data_fingerprint(data.train, data.held);
  data.vocab_size = top + 1;
  data.tokenizer = "Megatron indexed dataset " + ds.prefix() + " (" + ds.dtype_name() + ", largest id " +
                   std::to_string(top) + "), read in place";
  data.tokenizer_fingerprint = "megatron";
  return data;
}

}  // namespace

TokenData load_token_data(const std::string& dir) {
  std::error_code ec;
  std::string prefix;
  if (!std::filesystem::is_directory(dir, ec) && text::megatron_prefix(dir, prefix))
    return load_megatron_in_place(prefix);
  const std::filesystem::path d(dir);
  io::Metadata mt, mh;
  TokenData data;
  data.train = load_token_set((d / "train.safetensors").string(), &mt);
  data.held = load_token_set((d / "heldout.safetensors").string(), &mh);
  data.fingerprint = data_fingerprint(data.train, data.held);
  const auto t = mt.find(kFingerprintKey), h = mh.find(kFingerprintKey);
  const bool legacy = t == mt.end() && h == mh.end();  // written before prepare-data recorded the pair
  HMLA_CHECK(legacy || (t != mt.end() && h != mh.end() && t->second == data.fingerprint && h->second == data.fingerprint),
             IoError, dir, ": train.safetensors and heldout.safetensors are not one prepare-data output (the ",
             kFingerprintKey, " they record does not match their contents: an interrupted prepare-data, or a file ",
             "copied in from elsewhere); run hmla prepare-data again");
  data.vocab_size =
      std::max(recorded_vocab(mt, dir + "/train.safetensors"), recorded_vocab(mh, dir + "/heldout.safetensors"));
  const auto tk = mt.find("tokenizer");
  data.tokenizer = tk == mt.end() ? "bytes+3; pad 0, bos 1, eos 2" : tk->second;
  if (const auto f = mt.find("tokenizer_fingerprint"); f != mt.end()) data.tokenizer_fingerprint = f->second;
  return data;
}

}  // namespace hmla
