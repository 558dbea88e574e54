// The index-table contract (include/hmla/ops/index_table.h): one pass over the table on the host
// with a per-key stamp (O(b sq N) time, O(s) scratch), so a row's duplicates are found without
// sorting; skip's copy is made only when some entry is invalid.
#include "hmla/ops/index_table.h"

#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "hmla/core/error.h"

namespace hmla {

namespace {

std::string allowed_set(int64_t start, int64_t t) {
  if (start > t) return "(empty: a padding row)";
  std::string s = "[";  // appended, not "[" + ...: gcc 12's -Wrestrict misfires on the operator+ chain
  s += std::to_string(start);
  s += ", ";
  s += std::to_string(t);
  return s + "]";
}

std::atomic<bool>& check_all_tables() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("HMLA_CHECK_TABLES");
    return v && v[0] == '1';
  }()};
  return on;
}

}  // namespace

bool table_checked(TableOrigin origin) { return origin == TableOrigin::external || check_all_tables().load(); }

bool set_check_all_tables(bool on) { return check_all_tables().exchange(on); }

Tensor check_index_table(const Tensor& idx, const DocLayout& layout, int64_t q_row0, InvalidIndex mode,
                         const char* what) {
  HMLA_CHECK(idx.defined() && idx.dtype() == DType::i32 && idx.dim() == 3, ShapeError, what,
             ": the index table must be an int32 [b, s, N] tensor, got ",
             idx.defined() ? dtype_name(idx.dtype()) : "undefined", idx.defined() ? shape_str(idx.shape()) : "");
  const int64_t b = idx.size(0), sq = idx.size(1), N = idx.size(2), s = layout.s;
  HMLA_CHECK(layout.b == b && q_row0 >= 0 && q_row0 + sq <= s, LayoutError, what, ": the index table ",
             shape_str(idx.shape()), " does not fit the layout's b = ", layout.b, ", s = ", s, " (rows from ", q_row0,
             ")");
  const Tensor host = idx.is_contiguous() ? idx.on(Device::cpu) : idx.to(Device::cpu);
  const int32_t* t_idx = host.data<int32_t>();
  const int32_t* ds = layout.doc_start.data<int32_t>();
  std::vector<int64_t> stamp(size_t(s), -1);
  std::vector<int64_t> invalid;  // flat positions of the entries skip turns into -1
  for (int64_t row = 0; row < b * sq; ++row) {
    const int64_t bb = row / sq, t = q_row0 + row % sq, start = ds[bb * s + t];
    for (int64_t i = 0; i < N; ++i) {
      const int32_t j = t_idx[row * N + i];
      if (j == -1) continue;
      if (j < start || j > t) {
        HMLA_CHECK(mode == InvalidIndex::skip, ShapeError, what, ": index table [", bb, ", ", row % sq, ", ", i,
                   "] = ", j, " is neither -1 nor a key of row ", t, "'s allowed set ", allowed_set(start, t),
                   " (invalid=\"skip\" treats such entries as no key)");
        invalid.push_back(row * N + i);
        continue;
      }
      HMLA_CHECK(stamp[size_t(j)] != row, ShapeError, what, ": row ", t, " of batch ", bb, " lists key ", j,
                 " twice; duplicates are not allowed");
      stamp[size_t(j)] = row;
    }
  }
  if (invalid.empty()) return idx;
  Tensor fixed = host.clone();
  for (int64_t f : invalid) fixed.data<int32_t>()[f] = -1;
  return fixed.on(idx.device());
}

}  // namespace hmla
