// Which rows of an op case table (op_cases.h) a backend runs: the rows whose real params, the
// params the entry points build from the runner's inputs for that row, the backend's supports()
// accepts. supports() is the only place a backend writes its limits, so a harness never filters
// rows itself and a shape limit shows as a row the backend does not run. Pointers that tell a
// supports() what the call is (a backward's dq, select's scores, a sparse KL's table, a sink) are
// set to a marker; supports() reads no memory. Header-only, no test framework (hmla_cuda_check).
#pragma once
#include <string>
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
  return p;
}

// ---- whether a backend runs a row (every params its runner builds) -----------------------------

inline bool runs(const Backend& be, const AttnDenseCase& c, DType dt) {
  return be.supports(params(c, dt, false)) && be.supports(params(c, dt, true));
}
inline bool runs(const Backend& be, const AttnSparseCase& c, DType dt) {
  return be.supports(params(c, dt, false)) && be.supports(params(c, dt, true));
}
// Select reads f32 scores whatever the backend's compute dtype.
inline bool runs(const Backend& be, const IndexerSelectCase& c, DType) { return be.supports(params(c)); }
inline bool runs(const Backend& be, const IndexerTopkCase& c, DType dt) { return be.supports(params(c, dt)); }
inline bool runs(const Backend& be, const IndexerKlCase& c, DType) { return be.supports(params(c)); }

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
