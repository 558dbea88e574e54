#include <gtest/gtest.h>

#include "hmla/core/layout.h"

namespace hmla {
namespace {

std::vector<int32_t> starts(const DocLayout& l) { return l.doc_start.to_vector<int32_t>(); }
std::vector<int32_t> ends(const DocLayout& l) { return l.doc_end.to_vector<int32_t>(); }

TEST(Layout, CuSeqlensWithTailPadding) {
  // Documents [0,3), [3,4) (one token), [4,6); rows 6 and 7 are padding.
  DocLayout l = layout_from_cu_seqlens(8, {{0, 3, 4, 6}});
  EXPECT_EQ(starts(l), (std::vector<int32_t>{0, 0, 0, 3, 4, 4, 7, 8}));
  EXPECT_EQ(ends(l), (std::vector<int32_t>{3, 3, 3, 4, 6, 6, 7, 8}));
  EXPECT_FALSE(l.is_padding(0, 5));
  EXPECT_TRUE(l.is_padding(0, 6));
  EXPECT_EQ(l.num_docs(), 3);
  EXPECT_EQ(l.valid_rows(), 6);
  EXPECT_EQ(l.allowed_pairs(), 6 + 1 + 3);
}

TEST(Layout, CuSeqlensPerRowAndErrors) {
  DocLayout l = layout_from_cu_seqlens(4, {{0, 4}, {0, 1, 2}});
  EXPECT_EQ(starts(l), (std::vector<int32_t>{0, 0, 0, 0, 0, 1, 3, 4}));
  EXPECT_THROW(layout_from_cu_seqlens(4, {{1, 4}}), LayoutError);     // not starting at 0
  EXPECT_THROW(layout_from_cu_seqlens(4, {{0, 2, 1}}), LayoutError);  // decreasing
  // Zero-length documents (repeated offsets, as FlashAttention's varlen writes them) are no rows.
  EXPECT_EQ(starts(layout_from_cu_seqlens(4, {{0, 0, 2, 2, 3}})), (std::vector<int32_t>{0, 0, 2, 4}));
  EXPECT_THROW(layout_from_cu_seqlens(4, {{0, 5}}), LayoutError);     // past s
  EXPECT_THROW(layout_from_cu_seqlens(4, {{0}}), LayoutError);
  EXPECT_THROW(layout_from_cu_seqlens(0, {{0}}), LayoutError);
}

TEST(Layout, EndRowsMatchCuSeqlens) {
  // Same layout as CuSeqlensWithTailPadding in the flashmask convention.
  DocLayout l = layout_from_end_rows(1, 8, {3, 3, 3, 4, 6, 6, 0, 7});
  DocLayout c = layout_from_cu_seqlens(8, {{0, 3, 4, 6}});
  EXPECT_EQ(starts(l), starts(c));
  EXPECT_EQ(ends(l), ends(c));
  // Padding in the middle of a row (end_row <= t) is allowed too.
  DocLayout m = layout_from_end_rows(1, 4, {2, 2, 1, 4});
  EXPECT_EQ(starts(m), (std::vector<int32_t>{0, 0, 3, 3}));
  EXPECT_THROW(layout_from_end_rows(1, 4, {3, 2, 3, 4}), LayoutError);  // inconsistent ends
  EXPECT_THROW(layout_from_end_rows(1, 4, {5, 5, 5, 5}), LayoutError);  // past s
  EXPECT_THROW(layout_from_end_rows(1, 4, {4, 4}), LayoutError);        // wrong length
}

TEST(Layout, EosSeparators) {
  const int64_t eos = 2, pad = 0;
  // a b EOS c EOS d e pad pad: docs [0,3), [3,5), [5,7) (no EOS, still a document), pads.
  DocLayout l = layout_from_eos(1, 9, {5, 6, eos, 7, eos, 8, 9, pad, pad}, eos, pad);
  EXPECT_EQ(starts(l), (std::vector<int32_t>{0, 0, 0, 3, 3, 5, 5, 8, 9}));
  EXPECT_EQ(ends(l), (std::vector<int32_t>{3, 3, 3, 5, 5, 7, 7, 8, 9}));
  // A pad token inside a document is not padding.
  DocLayout m = layout_from_eos(1, 4, {5, pad, 6, eos}, eos, pad);
  EXPECT_EQ(starts(m), (std::vector<int32_t>{0, 0, 0, 0}));
  // All padding.
  DocLayout e = layout_from_eos(1, 3, {pad, pad, pad}, eos, pad);
  EXPECT_EQ(e.valid_rows(), 0);
}

TEST(Layout, EosEqualsPad) {
  const int64_t eos = 2;
  // a EOS b EOS EOS EOS: docs [0,2), [2,4); the last two EOS are tail padding.
  DocLayout l = layout_from_eos(1, 6, {5, eos, 6, eos, eos, eos}, eos, eos);
  EXPECT_EQ(starts(l), (std::vector<int32_t>{0, 0, 2, 2, 5, 6}));
  // a b EOS EOS: the first EOS ends the document.
  DocLayout m = layout_from_eos(1, 4, {5, 6, eos, eos}, eos, eos);
  EXPECT_EQ(starts(m), (std::vector<int32_t>{0, 0, 0, 4}));
}

}  // namespace
}  // namespace hmla
