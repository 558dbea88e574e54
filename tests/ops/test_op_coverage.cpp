// The op case registry's coverage rule (tests/common/case_registry.h) on every backend of the
// build: each Op of the op list has a case row, and each backend runs every op it implements on at
// least one row (the CPU in test_ops; the emulated CUDA in test_cuda_emu). Two planted gaps show
// the rule fails: an op with no row, and a backend that runs no row of an op.
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <vector>

#include "case_registry.h"

namespace hmla {
namespace {

using op_cases::BackendRows;
using op_cases::RowUse;

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& l : lines) s += l + "\n";
  return s;
}
bool uses_op(const RowUse& r, Op op) {
  for (const auto& [o, v] : r.ops)
    if (o == op) return true;
  return false;
}

TEST(OpCoverage, EveryOpHasARowAndEveryBackendRunsEachOpOnARow) {
  const std::vector<BackendRows> all = op_cases::rows_by_backend();
  EXPECT_EQ(joined(op_cases::coverage_problems(all)), "");
  for (const BackendRows& br : all) std::cout << br.be->name() << ": " << br.rows.size() << " rows\n";
}

// As if gemm had been added to the op list with no row: the rule names it.
TEST(OpCoverage, APlantedOpWithoutARowFails) {
  std::vector<BackendRows> all = op_cases::rows_by_backend();
  for (BackendRows& br : all) std::erase_if(br.rows, [](const RowUse& r) { return uses_op(r, Op::gemm); });
  EXPECT_NE(joined(op_cases::coverage_problems(all)).find("op gemm (nn) has no case row"), std::string::npos);
}

// As if the CPU's plan refused rope on every row: the CPU claims rope and runs no row of it.
TEST(OpCoverage, ABackendThatRunsNoRowOfItsOpFails) {
  std::vector<BackendRows> all = op_cases::rows_by_backend();
  for (RowUse& r : all[0].rows)
    if (uses_op(r, Op::rope)) r.runs = false;
  EXPECT_NE(joined(op_cases::coverage_problems(all)).find("the cpu backend implements rope but runs no row that uses it"),
            std::string::npos);
}

// A row with neither a runner file nor a check of its own is run by nobody: the rule names it.
TEST(OpCoverage, ARowNobodyRunsFails) {
  std::vector<BackendRows> all = op_cases::rows_by_backend();
  all[0].rows[0].runner.clear(), all[0].rows[0].check = nullptr;
  const std::string row = all[0].rows[0].table + "/" + all[0].rows[0].name;
  EXPECT_NE(joined(op_cases::coverage_problems(all)).find("row " + row + " has no runner on the cpu backend"),
            std::string::npos);
}

// Op identity: names, families and params structs come from the op list, one per enumerator.
TEST(OpCoverage, OpsHaveNamesFamiliesAndParams) {
  EXPECT_EQ(std::string(op_name(Op::attn_dense_fwd)), "attn_dense_fwd");
  EXPECT_EQ(std::string(op_family(Op::attn_dense_bwd)), "attn_dense");
  EXPECT_EQ(std::string(op_family(Op::moe_aux_loss)), "moe_balance");
  EXPECT_EQ(std::string(op_params_name(Op::indexer_kl_sparse)), "IndexerKlParams");
  Op op;
  for (Op o : kAllOps) {
    ASSERT_TRUE(op_from_name(op_name(o), op));
    EXPECT_EQ(op, o);
    EXPECT_NE(std::string(op_family(o)), "?") << op_name(o);
  }
  EXPECT_FALSE(op_from_name("no_such_op", op));
}

}  // namespace
}  // namespace hmla
