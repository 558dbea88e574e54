// Builders for DocLayout from the three conventions of DESIGN.md section 3. Each validates its
// input and reports the first inconsistency with its row and position.
#include "hmla/core/layout.h"

#include <limits>

namespace hmla {

namespace {

void check_dims(int64_t b, int64_t s) {
  HMLA_CHECK(b >= 1 && s >= 1, LayoutError, "layout needs b >= 1 and s >= 1, got b = ", b,
             ", s = ", s);
  HMLA_CHECK(s < (int64_t(1) << 31) - 1, LayoutError, "s = ", s, " does not fit int32 positions");
  HMLA_CHECK(b <= std::numeric_limits<int64_t>::max() / s, LayoutError, "layout of b = ", b, " rows of s = ",
             s, " positions overflows int64");
}

DocLayout empty_layout(int64_t b, int64_t s) {
  check_dims(b, s);
  DocLayout l;
  l.b = b;
  l.s = s;
  l.doc_start = Tensor::empty({b, s}, DType::i32);
  l.doc_end = Tensor::empty({b, s}, DType::i32);
  // Everything starts as padding; builders mark documents.
  int32_t* ds = l.doc_start.data<int32_t>();
  int32_t* de = l.doc_end.data<int32_t>();
  for (int64_t r = 0; r < b; ++r)
    for (int64_t t = 0; t < s; ++t) ds[r * s + t] = de[r * s + t] = static_cast<int32_t>(t + 1);
  return l;
}

void mark_doc(DocLayout& l, int64_t r, int64_t start, int64_t end) {
  int32_t* ds = l.doc_start.data<int32_t>() + r * l.s;
  int32_t* de = l.doc_end.data<int32_t>() + r * l.s;
  for (int64_t t = start; t < end; ++t) {
    ds[t] = static_cast<int32_t>(start);
    de[t] = static_cast<int32_t>(end);
  }
}

}  // namespace

int64_t DocLayout::num_docs() const {
  const int32_t* ds = doc_start.data<int32_t>();
  int64_t n = 0;
  for (int64_t i = 0; i < b * s; ++i) n += (ds[i] == i % s);
  return n;
}

int64_t DocLayout::allowed_pairs() const {
  const int32_t* ds = doc_start.data<int32_t>();
  int64_t n = 0;
  for (int64_t i = 0; i < b * s; ++i) {
    int64_t t = i % s;
    if (ds[i] <= t) n += t - ds[i] + 1;
  }
  return n;
}

int64_t DocLayout::valid_rows() const {
  int64_t n = 0;
  for (int64_t r = 0; r < b; ++r)
    for (int64_t t = 0; t < s; ++t) n += !is_padding(r, t);
  return n;
}

DocLayout layout_causal(int64_t b, int64_t s) {
  DocLayout l = empty_layout(b, s);
  for (int64_t r = 0; r < b; ++r) mark_doc(l, r, 0, s);
  return l;
}

// Every entry is checked before anything is written: monotone, from 0, ending within s.
static void check_cu_seqlens(int64_t s, const std::vector<std::vector<int64_t>>& cu) {
  for (size_t r = 0; r < cu.size(); ++r) {
    const auto& c = cu[r];
    HMLA_CHECK(c.size() >= 2, LayoutError, "cu_seqlens of row ", r,
               " needs at least two entries (a start and an end), got ", c.size());
    HMLA_CHECK(c[0] == 0, LayoutError, "cu_seqlens of row ", r, " must start at 0, got ", c[0]);
    for (size_t i = 1; i < c.size(); ++i) {
      // Equal offsets are a zero-length document (FlashAttention's varlen and TileLang's
      // generators write them): no rows, nothing to mark.
      HMLA_CHECK(c[i] >= c[i - 1], LayoutError, "cu_seqlens of row ", r,
                 " must be non-decreasing: entry ", i, " = ", c[i], " after ", c[i - 1]);
      HMLA_CHECK(c[i] <= s, LayoutError, "cu_seqlens of row ", r, " has entry ", i, " = ", c[i],
                 ", past s = ", s);
    }
  }
}

DocLayout layout_from_cu_seqlens(int64_t s, const std::vector<std::vector<int64_t>>& cu) {
  check_dims(static_cast<int64_t>(cu.size()), s);
  check_cu_seqlens(s, cu);
  DocLayout l = empty_layout(static_cast<int64_t>(cu.size()), s);
  for (int64_t r = 0; r < l.b; ++r)
    for (size_t i = 1; i < cu[r].size(); ++i) mark_doc(l, r, cu[r][i - 1], cu[r][i]);
  return l;
}

DocLayout layout_from_end_rows(int64_t b, int64_t s, const std::vector<int64_t>& end_rows) {
  check_dims(b, s);
  HMLA_CHECK(static_cast<int64_t>(end_rows.size()) == b * s, LayoutError, "end rows: expected b*s = ",
             b * s, " entries, got ", end_rows.size());
  DocLayout l = empty_layout(b, s);
  for (int64_t r = 0; r < b; ++r) {
    const int64_t* e = end_rows.data() + r * s;
    int64_t t = 0;
    while (t < s) {
      if (e[t] <= t) {  // padding row
        ++t;
        continue;
      }
      int64_t end = e[t];
      HMLA_CHECK(end <= s, LayoutError, "end row ", end, " of token ", t, " in row ", r,
                 " is past s = ", s);
      for (int64_t u = t + 1; u < end; ++u)
        HMLA_CHECK(e[u] == end, LayoutError, "token ", u, " of row ", r, " has end row ", e[u],
                   " but belongs to the document [", t, ", ", end, ") whose rows all end at ", end);
      mark_doc(l, r, t, end);
      t = end;
    }
  }
  return l;
}

DocLayout layout_from_eos(int64_t b, int64_t s, const std::vector<int64_t>& ids, int64_t eos_id,
                          int64_t pad_id) {
  check_dims(b, s);
  HMLA_CHECK(static_cast<int64_t>(ids.size()) == b * s, LayoutError, "token ids: expected b*s = ",
             b * s, " entries, got ", ids.size());
  DocLayout l = empty_layout(b, s);
  for (int64_t r = 0; r < b; ++r) {
    const int64_t* x = ids.data() + r * s;
    // Tail padding: the trailing run of pad tokens. When pad == eos, its first token is the
    // EOS that ends the preceding document (which then has no other EOS at its end).
    int64_t tail = s;
    while (tail > 0 && x[tail - 1] == pad_id) --tail;
    if (pad_id == eos_id && tail > 0 && tail < s) ++tail;
    int64_t start = 0;
    for (int64_t t = 0; t < tail; ++t) {
      if (x[t] == eos_id || t + 1 == tail) {
        mark_doc(l, r, start, t + 1);
        start = t + 1;
      }
    }
  }
  return l;
}

}  // namespace hmla
