// Checked size arithmetic, the memory budget, and token ids checked in their own dtype.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>

#include "hmla/core/index_values.h"
#include "hmla/core/size_check.h"

namespace hmla {
namespace {

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Sets HMLA_MEMORY_BUDGET for one test and restores it.
struct Budget {
  explicit Budget(const char* v) {
    if (const char* old = std::getenv("HMLA_MEMORY_BUDGET")) saved = old;
    setenv("HMLA_MEMORY_BUDGET", v, 1);
  }
  ~Budget() { saved.empty() ? unsetenv("HMLA_MEMORY_BUDGET") : setenv("HMLA_MEMORY_BUDGET", saved.c_str(), 1); }
  std::string saved;
};

TEST(SizeCheck, OverflowIsAnErrorNamingTheFactors) {
  EXPECT_EQ(checked_product({{"a", 3}, {"b", 4}}, "x"), 12);
  const std::string m = message_of([] { checked_product({{"batch", 1 << 30}, {"vocab_size", int64_t(1) << 40}}, "logits"); });
  EXPECT_NE(m.find("logits: batch x vocab_size = 1073741824 x 1099511627776 overflows int64"), std::string::npos) << m;
  EXPECT_NE(message_of([] { checked_product({{"seq_len", -2}}, "rows"); }).find("seq_len = -2 is negative"),
            std::string::npos);
  EXPECT_THROW(checked_add(INT64_MAX, 1, "sum"), ConfigError);
  EXPECT_THROW(shape_numel({int64_t(1) << 40, int64_t(1) << 40}), ShapeError);  // never a negative size
  EXPECT_THROW(Tensor::empty({int64_t(1) << 31, int64_t(1) << 31}, DType::f32), ShapeError);
}

TEST(SizeCheck, PlanRefusesWhatExceedsTheBudgetAndNamesTheLargestPart) {
  Budget b("1M");
  EXPECT_EQ(memory_budget(), 1 << 20);
  MemoryPlan small;
  small.add("the ids", {{"batch", 2}, {"seq_len", 8}}, 4);
  EXPECT_NO_THROW(small.check("run"));
  MemoryPlan big = small;
  big.add("the logits", {{"batch", 2}, {"seq_len", 8}, {"vocab_size", 100000}}, 4);
  const std::string m = message_of([&] { big.check("run"); });
  EXPECT_NE(m.find("run needs at least 6.1 MiB, more than the 1.0 MiB of HMLA_MEMORY_BUDGET"), std::string::npos) << m;
  EXPECT_NE(m.find("the logits (batch x seq_len x vocab_size = 2 x 8 x 100000 values of 4 bytes)"), std::string::npos)
      << m;
  Budget off("unlimited");
  EXPECT_NO_THROW(big.check("run"));
  Budget bad("12 apples");
  EXPECT_THROW(memory_budget(), ConfigError);
}

TEST(SizeCheck, PhysicalMemoryIsTheDefaultBudget) {
  Budget b("");
  EXPECT_GT(memory_budget(), int64_t(1) << 26);
  EXPECT_EQ(format_bytes(3.7 * 1099511627776.0), "3.7 TiB");
}

TEST(TokenIds, CheckedInTheirOwnDtypeBeforeNarrowing) {
  const int64_t big = (int64_t(1) << 32) + 41;  // narrowed to 32 bits it would be id 41
  const Tensor t64 = Tensor::from_vector<int64_t>({1, 3}, {5, big, 41});
  const std::string m = message_of([&] { token_ids(t64, 260, "in: input_ids"); });
  EXPECT_NE(m.find("in: input_ids[0, 1] = 4294967337 is outside the vocabulary [0, 260)"), std::string::npos) << m;
  EXPECT_THROW(token_ids(Tensor::from_vector<int32_t>({2}, {3, -1}), 260, "ids"), IoError);
  EXPECT_THROW(token_ids(Tensor::from_vector<int32_t>({2}, {3, 260}), 260, "ids"), IoError);
  EXPECT_THROW(token_ids(Tensor::from_vector<float>({1}, {3.f}), 260, "ids"), IoError);
  EXPECT_THROW(token_ids(Tensor::from_vector<int64_t>({1}, {big}), 0, "ids"), IoError);  // no vocab: int32's range
  const Tensor ok = token_ids(Tensor::from_vector<int64_t>({1, 2}, {0, 259}), 260, "ids");
  EXPECT_EQ(ok.dtype(), DType::i32);
  EXPECT_EQ(ok.shape(), Shape({1, 2}));
  EXPECT_EQ(ok.to_vector<int32_t>(), (std::vector<int32_t>{0, 259}));
}

}  // namespace
}  // namespace hmla
