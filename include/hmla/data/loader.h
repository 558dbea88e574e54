// The training loader: packs whole documents of a token set into rows of s tokens, keeping their
// boundaries (the batch's DocLayout), splitting only documents longer than a row, and padding each
// row's tail with kPadId. Its position is three integers, so a checkpoint can resume it exactly.
#pragma once
#include <cstdint>
#include <vector>

#include "hmla/data/batch.h"
#include "hmla/data/token_set.h"

namespace hmla {

constexpr int32_t kPadId = 0;  // what a row's tail holds after its last document

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
