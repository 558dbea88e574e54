// The loader (loader.h): rows of s tokens packed from whole documents in a shuffled order,
// reshuffled each epoch (mt19937_64 from the seed and the epoch); fixed_rows packs in file order
// and leaves out documents longer than a row.
#include "hmla/data/loader.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "hmla/core/error.h"

namespace hmla {

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
      data_.copy_doc(d, offset_, take, ids.data() + r * s_ + used);
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
      data.copy_doc(d, 0, len, ids.data() + r * seq_len + used);
      used += len;
      cu[r].push_back(used);
      ++d;
    }
    if (cu[r].size() == 1) cu[r].push_back(1);  // ran out of documents: one pad "document"
  }
  return {Tensor::from_vector<int32_t>({rows, seq_len}, ids), layout_from_cu_seqlens(seq_len, cu)};
}

}  // namespace hmla
