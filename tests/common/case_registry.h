// The op case registry: every family's rows (tests/common/cases_<family>.h, found by CMake and
// gathered in the generated case_tables.h), each with the (op, variant) it asks of a backend; the
// coverage rule over them (every Op has a row; each backend runs every op it implements on some
// row); the support matrix `hmla ops` prints. Header-only, no test framework.
#pragma once
#include <map>
#include <set>
#include <string>
#include <vector>

#include "case_tables.h"  // generated: the cases_<family>.h headers and HMLA_CASE_TABLES(F)

namespace hmla::op_cases {

// Every row of every table as `be` sees it.
inline std::vector<RowUse> case_rows(const Backend& be) {
  std::vector<RowUse> out;
#define HMLA_CASE_TABLE(family) case_rows_##family(be, out);
  HMLA_CASE_TABLES(HMLA_CASE_TABLE)
#undef HMLA_CASE_TABLE
  return out;
}

// The rows as each backend of the build sees them: the CPU's, and CUDA's where the build has it.
struct BackendRows {
  const Backend* be;
  std::vector<RowUse> rows;
};
inline std::vector<BackendRows> rows_by_backend() {
  std::vector<BackendRows> out{{&cpu_backend(), case_rows(cpu_backend())}};
  if (cuda_backend()) out.push_back({cuda_backend(), case_rows(*cuda_backend())});
  return out;
}

// What breaks the coverage rule, one line each ("" none): a row nobody runs (no runner file, no
// check), an Op no row lists on any backend, and an Op a backend implements (every backend of the
// build implements every Op: op_list.h) that no row it runs uses.
inline std::vector<std::string> coverage_problems(const std::vector<BackendRows>& all) {
  std::vector<std::string> problems;
  std::set<Op> listed;
  for (const BackendRows& br : all)
    for (const RowUse& r : br.rows) {
      if (r.runner.empty() && !r.check)
        problems.push_back("row " + r.table + "/" + r.name + " has no runner on the " + br.be->name() + " backend");
      for (const auto& [op, v] : r.ops) listed.insert(op);
    }
  for (Op op : kAllOps)
    if (!listed.count(op)) problems.push_back(std::string("op ") + op_name(op) + " (" + op_family(op) + ") has no case row");
  for (const BackendRows& br : all) {
    std::set<Op> run;
    for (const RowUse& r : br.rows)
      if (r.runs)
        for (const auto& [op, v] : r.ops) run.insert(op);
    for (Op op : kAllOps)
      if (listed.count(op) && !run.count(op))
        problems.push_back(std::string("the ") + br.be->name() + " backend implements " + op_name(op) +
                           " but runs no row that uses it");
  }
  return problems;
}

// The support matrix: per op and backend, the variants its plans name over the rows it runs, with
// their row counts ("mma 12, simt 3"), or "-" where it runs none.
inline std::map<Op, std::vector<std::string>> support_matrix(const std::vector<BackendRows>& all) {
  std::map<Op, std::vector<std::string>> m;
  for (Op op : kAllOps) {
    for (const BackendRows& br : all) {
      std::map<Variant, int> n;
      for (const RowUse& r : br.rows) {
        if (!r.runs) continue;
        std::set<Variant> seen;  // a row counts once per variant of the op
        for (const auto& [o, v] : r.ops)
          if (o == op && seen.insert(v).second) ++n[v];
      }
      std::string cell;
      for (const auto& [v, k] : n) cell += (cell.empty() ? "" : ", ") + std::string(variant_name(v)) + " " + std::to_string(k);
      m[op].push_back(cell.empty() ? "-" : cell);
    }
  }
  return m;
}

}  // namespace hmla::op_cases
