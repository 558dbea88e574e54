// Megatron-LM indexed datasets (megatron/core/datasets/indexed_dataset.py): PREFIX.idx = the magic
// "MMIDIDX\0\0", u64 version 1, u8 dtype code (1 u8, 2 i8, 3 i16, 4 i32, 5 i64, 6 f64, 7 f32,
// 8 u16), u64 sequence count, u64 document count, i32 sequence lengths, i64 byte pointers into
// PREFIX.bin, i64 document indices (sequence boundaries from 0 to the sequence count);
// PREFIX.bin = the token ids. Read by mmap; every integer dtype is accepted (ids must be >= 0).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hmla::text {

class MegatronDataset {
 public:
  // Validates the whole .idx against itself and the .bin's length before anything else: bad magic,
  // version or dtype, a size that disagrees with the file, pointers that do not follow from the
  // lengths x the dtype's size, document indices that do not rise strictly from 0 to the sequence
  // count; each a one-line IoError naming the file. The ids are not read here (see max_id).
  static MegatronDataset open(const std::string& prefix);

  const std::string& prefix() const { return prefix_; }
  int64_t docs() const { return int64_t(doc_index_.size()) - 1; }
  int64_t tokens() const { return tokens_; }
  int elem_size() const { return elem_; }
  std::string dtype_name() const;
  // Token range [doc_begin(d), doc_begin(d + 1)) of document d (the sequences are contiguous).
  int64_t doc_begin(int64_t d) const { return pointers_[doc_index_[d]] / elem_; }
  // Copies ids [begin, begin + n) as int32 into out.
  void copy(int64_t begin, int64_t n, int32_t* out) const;
  // The largest id, scanning the .bin once; IoError naming the file at the first negative id or
  // one that does not fit an int32.
  int64_t max_id() const;

 private:
  std::string prefix_;
  int code_ = 0, elem_ = 0;
  int64_t tokens_ = 0;
  std::vector<int64_t> pointers_, doc_index_;  // pointers_ gets one entry past the last sequence
  std::shared_ptr<const void> map_;  // the .bin, mapped read-only
};

}  // namespace hmla::text
