// The op case registry's own driver: every row that carries a check (RowUse::check: a family's
// rows with their oracle in tests/common/cases_<family>.h, no runner file of their own) runs on each
// backend that runs it, the CPU in test_ops and the emulated CUDA device in test_cuda_emu, one test
// per table, row and backend.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "hmla/core/cuda.h"
#include "case_registry.h"

namespace hmla {
namespace {

struct CheckedRow {
  std::string name;  // table.row.backend
  const Backend* be;
  op_cases::RowUse row;
};
void PrintTo(const CheckedRow& r, std::ostream* os) { *os << r.name; }

std::vector<CheckedRow> checked_rows() {
  std::vector<CheckedRow> out;
  for (const op_cases::BackendRows& br : op_cases::rows_by_backend())
    for (const op_cases::RowUse& r : br.rows)
      if (r.check) out.push_back({r.table + "_" + r.name + "_" + br.be->name(), br.be, r});
  return out;
}

class RegistryRows : public ::testing::TestWithParam<CheckedRow> {};

TEST_P(RegistryRows, MatchTheirOracle) {
  const CheckedRow& c = GetParam();
  if (c.be->device() == Device::cuda && cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  if (!c.row.runs) GTEST_SKIP() << "the " << c.be->name() << " backend's plans do not run this row";
  EXPECT_EQ(c.row.check(c.be->device()), "");
}
INSTANTIATE_TEST_SUITE_P(Rows, RegistryRows, ::testing::ValuesIn(checked_rows()),
                         [](const ::testing::TestParamInfo<CheckedRow>& i) { return i.param.name; });

}  // namespace
}  // namespace hmla
