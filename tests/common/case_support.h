// Which rows of an op case table (op_cases.h) a backend runs: the rows for whose real (op, params),
// those the entry points build from the runner's inputs for that row, the backend's plans name a
// variant. The plans are the only place a backend writes its limits, so a harness never filters
// rows itself and a shape limit shows as a row the backend does not run. Optional inputs a plan
// reads (a sink, a given lse) are set to a marker; plans read no memory. Header-only, no test
// framework (hmla_cuda_check).
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "hmla/ops/backend.h"
#include "op_cases.h"

namespace hmla::op_cases {

namespace detail {
inline char marker;  // a non-null pointer for the params' "is this pass/this variant" fields
}

// ---- the params each family's runners hand the entry points -------------------------------------

// The dense attention's forward (backward: with its gradients) on the row's query rows.
inline AttnDenseParams params(const AttnDenseCase& c, DType dt, bool backward) {
  AttnDenseParams p;
  p.dtype = dt;
  p.b = c.b, p.s = c.s, p.H = c.H, p.Hkv = c.Hkv, p.Dqk = c.Dqk, p.Dv = c.Dv;
  p.q_row0 = std::max<int64_t>(c.q_row0, 0), p.sq = c.s - p.q_row0;
  p.scale = 1.f;
  if (c.sink) p.sink = reinterpret_cast<const float*>(&detail::marker);
  if (backward) p.dq = &detail::marker;
  return p;
}

// A backward's params have dq: that is how the CUDA backend's supports tells the passes apart.
inline AttnSparseParams params(const AttnSparseCase& c, DType dt, bool backward) {
  AttnSparseParams p;
  p.dtype = dt;
  p.b = c.b, p.sq = p.skv = c.s, p.H = c.H, p.Dqk = c.Dqk, p.Dv = c.Dv, p.K = c.K, p.KW = c.K + c.W;
  if (c.sink) p.sink = reinterpret_cast<const float*>(&detail::marker);
  if (backward) p.dq = &detail::marker;
  return p;
}

// indexer_select on given f32 scores, query rows [q_row0, s).
inline IndexerTopkParams params(const IndexerSelectCase& c) {
  IndexerTopkParams p;
  p.b = kSelectBatch, p.s = c.s, p.q_row0 = c.q_row0, p.sq = c.s - c.q_row0, p.K = c.K, p.W = c.W;
  p.scores = reinterpret_cast<const float*>(&detail::marker);
  return p;
}

// indexer_topk from qI, kI (of dtype dt) and w.
inline IndexerTopkParams params(const IndexerTopkCase& c, DType dt) {
  IndexerTopkParams p;
  p.dtype = dt;
  p.b = kSelectBatch, p.s = p.sq = c.s, p.HI = c.HI, p.DI = c.DI, p.K = c.K, p.W = c.W;
  return p;
}

// The KLs on f32 inputs (CUDA also reads bf16 q, k, qI, kI: tests/cuda/emu/test_mixed_dtype_emu.cpp).
inline IndexerKlParams params(const IndexerKlCase& c) {
  IndexerKlParams p;
  p.b = c.b, p.s = p.sq = c.s, p.HI = c.HI, p.DI = c.DI, p.H = c.H, p.Hkv = c.Hkv, p.Dqk = c.Dqk;
  if (c.sparse) p.K = c.K, p.W = c.W, p.topk = reinterpret_cast<const int32_t*>(&detail::marker);
  if (c.give_lse) p.lse_c = reinterpret_cast<const float*>(&detail::marker);
  if (c.bf16_inputs) p.dtype = p.qk_dtype = DType::bf16;
  return p;
}

// ---- what a row asks of a backend --------------------------------------------------------------

// Each (op, params) a row's runner dispatches, with the variant the backend's plan names for it: a
// row runs on a backend when every plan names one. The coverage test (tests/ops/test_op_coverage.cpp)
// and `hmla ops` read the ops and variants; the runners read runs().
struct Uses {
  const Backend& be;
  std::vector<std::pair<Op, Variant>> ops = {};
  template <class P>
  Uses& operator()(Op op, const P& p) {
    ops.push_back({op, be.plan(op, p).variant});
    return *this;
  }
  bool all() const {
    for (const auto& [op, v] : ops)
      if (v == Variant::none) return false;
    return true;
  }
};

inline void uses(Uses& u, const AttnDenseCase& c, DType dt) {
  u(Op::attn_dense_fwd, params(c, dt, false))(Op::attn_dense_bwd, params(c, dt, true));
}
// The runners hand the entry points their own tables: checked at the boundary (external tables).
inline void uses(Uses& u, const AttnSparseCase& c, DType dt) {
  u(Op::attn_sparse_check_table, params(c, dt, false))(Op::attn_sparse_fwd, params(c, dt, false));
  u(Op::attn_sparse_bwd, params(c, dt, true));
}
// Select reads f32 scores whatever the backend's compute dtype.
inline void uses(Uses& u, const IndexerSelectCase& c, DType) { u(Op::indexer_select, params(c)); }
inline void uses(Uses& u, const IndexerTopkCase& c, DType dt) { u(Op::indexer_topk, params(c, dt)); }
inline void uses(Uses& u, const IndexerKlCase& c, DType) {
  u(c.sparse ? Op::indexer_kl_sparse : Op::indexer_kl_dense, params(c));
}

// A row as the registry lists it (tests/common/case_registry.h): its table, name and oracle, each
// (op, variant) it asks of a backend, whether that backend runs it, and who runs it: the test file
// whose runner instantiates over the table (`runner`), or the registry's own driver
// (tests/ops/test_case_rows.cpp) through `check`, which runs the row on a device against its
// oracle and returns "" or what differs.
struct RowUse {
  std::string table, name, oracle;
  std::vector<std::pair<Op, Variant>> ops;
  bool runs = false;
  std::string runner;
  std::function<std::string(Device)> check = {};
};
template <class Row>
void add_rows(std::vector<RowUse>& out, const char* table, const char* runner, const Backend& be, DType dt,
              const std::vector<Row>& rows) {
  for (const Row& c : rows) {
    Uses u{be};
    uses(u, c, dt);
    out.push_back({table, c.name, oracle_name(c.oracle), u.ops, u.all(), runner});
  }
}
// Rows the registry's driver runs: each Row type gives check(row, device) (found by ADL).
template <class Row>
void add_checked_rows(std::vector<RowUse>& out, const char* table, const Backend& be, DType dt,
                      const std::vector<Row>& rows) {
  for (const Row& c : rows) {
    Uses u{be};
    uses(u, c, dt);
    out.push_back({table, c.name, oracle_name(c.oracle), u.ops, u.all(), "tests/ops/test_case_rows.cpp",
                   [c](Device dev) { return check(c, dev); }});
  }
}

// Whether a backend runs a row: every params its runner builds.
template <class Row>
bool runs(const Backend& be, const Row& c, DType dt) {
  Uses u{be};
  uses(u, c, dt);
  return u.all();
}
// The rows of `table` that `be` (null: a backend this build lacks) runs on inputs of dtype `dt`:
// what a runner instantiates over (::testing::ValuesIn(run_by(...))).
template <class Row>
std::vector<Row> run_by(const Backend* be, DType dt, const std::vector<Row>& table) {
  std::vector<Row> rows;
  if (be)
    for (const Row& c : table)
      if (runs(*be, c, dt)) rows.push_back(c);
  return rows;
}

// The names of the rows of `table` that `be` does not run ("" when it runs them all): what a
// suite asserts where a backend must run its whole table (the CPU runs every row of every table).
template <class Row>
std::string rows_not_run(const Backend& be, DType dt, const std::vector<Row>& table) {
  std::string names;
  for (const Row& c : table)
    if (!runs(be, c, dt)) names += " " + c.name;
  return names;
}

}  // namespace hmla::op_cases
