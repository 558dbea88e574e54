// The MoE ops' case table (hmla/ops/moe.h): rows of router, dispatch, row-op and grouped-product
// shapes, and the (op, params) each row dispatches. The runner (tests/ops/test_moe_ops.cpp, MoeTable)
// checks a CUDA device against the CPU exactly where the work is integer or one rounding and against
// float64 where it sums; the load-balancing ops' row is run by MoeOps.TheBalancingOpsOnCudaEqualTheCpus
// there and, on the CPU, by tests/ops/test_moe_balance.cpp against float64. Header-only, no test
// framework (`hmla ops`).
#pragma once
#include <ostream>
#include <string>
#include <vector>

#include "hmla/ops/moe.h"
#include "case_support.h"

namespace hmla::op_cases {

// N tokens routed to k of E experts in G groups (TG kept), D-wide rows, I-wide expert outputs;
// levels > 0: logits from `levels` values (exact ties).
struct MoeCase {
  std::string name;
  int64_t N, E, k, G, TG;
  bool norm;
  float rsf;
  int64_t D, I;
  int levels;
  Oracle oracle = Oracle::moe_ref;
};
inline void PrintTo(const MoeCase& c, std::ostream* os) { *os << c.name; }

inline std::vector<MoeCase> moe_cases() {
  return {
      {"ties_groups", 6, 8, 3, 4, 2, true, 2.5f, 16, 8, 3},
      {"one_group_no_norm", 7, 6, 2, 1, 1, false, 2.5f, 12, 5, 0},
      {"k1", 9, 4, 1, 2, 1, true, 1.f, 8, 6, 0},
      {"empty_experts", 3, 16, 2, 4, 1, true, 2.5f, 10, 7, 0},
      {"ragged_tiles", 37, 4, 2, 2, 2, true, 2.5f, 45, 33, 0},
  };
}

// The experts' matrices at one stride, as the grouped products' plan requires (it reads only the
// pointers): E fake addresses `stride` bytes apart.
inline const void* const* moe_fake_experts(int64_t E, int64_t stride) {
  static std::vector<const void*> table;
  table.assign(size_t(E), nullptr);
  for (int64_t e = 0; e < E; ++e) table[size_t(e)] = reinterpret_cast<const char*>(4096) + e * stride;
  return table.data();
}

inline void uses(Uses& u, const MoeCase& c, DType) {
  MoeRouteParams r;
  r.N = c.N, r.E = c.E, r.k = c.k, r.n_group = c.G, r.topk_group = c.TG;
  MoeDispatchParams d;
  d.N = c.N, d.E = c.E, d.k = c.k;
  MoeRowsParams rows;
  rows.N = c.N, rows.k = c.k, rows.D = c.D;
  MoeGroupedParams g;
  g.E = c.E, g.rows = c.N * c.k, g.in = c.D, g.out = c.I;
  g.W = moe_fake_experts(c.E, c.I * c.D * 4);
  u(Op::moe_route_fwd, r)(Op::moe_route_bwd, r)(Op::moe_dispatch, d);
  u(Op::moe_gather, rows)(Op::moe_combine, rows)(Op::moe_rowdot, rows);
  u(Op::moe_grouped_fwd, g)(Op::moe_grouped_bwd, g);
}

// The load-balancing ops: the load over masked segments, the bias update and the balance loss.
struct MoeBalanceCase {
  std::string name;
  Oracle oracle;
  int64_t N, E, k, rows;
};
inline void PrintTo(const MoeBalanceCase& c, std::ostream* os) { *os << c.name; }
inline std::vector<MoeBalanceCase> moe_balance_cases() { return {{"segments_masked", Oracle::moe_balance_ref, 15, 8, 2, 3}}; }
inline void uses(Uses& u, const MoeBalanceCase& c, DType) {
  MoeBalanceParams p;
  p.N = c.N, p.E = c.E, p.k = c.k, p.rows = c.rows;
  u(Op::moe_expert_load, p)(Op::moe_bias_update, p)(Op::moe_aux_loss, p);
}

inline void case_rows_moe(const Backend& be, std::vector<RowUse>& out) {
  add_rows(out, "moe", be, be.compute_dtype(), moe_cases());
  add_rows(out, "moe_balance", be, be.compute_dtype(), moe_balance_cases());
}

}  // namespace hmla::op_cases
