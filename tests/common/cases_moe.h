// The MoE ops' case table (hmla/ops/moe.h): rows of router, dispatch, row-op and grouped-product
// shapes, and the (op, params) each row dispatches. The runner (tests/ops/test_moe_ops.cpp, MoeTable)
// checks a CUDA device against the CPU exactly where the work is integer or one rounding and against
// float64 where it sums. The load-balancing ops' rows carry their own check against float64 (the
// loads and the bias exactly), which the registry's driver runs on every backend
// (tests/ops/test_case_rows.cpp). Header-only, no test framework (`hmla ops`).
#pragma once
#include <algorithm>
#include <cmath>
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

// The load-balancing ops: the load over masked segments (rows segments of N / rows tokens, k
// distinct experts each, a few tokens masked), the bias update and the balance loss.
struct MoeBalanceCase {
  std::string name;
  Oracle oracle;
  int64_t N, E, k, rows;
};
inline void PrintTo(const MoeBalanceCase& c, std::ostream* os) { *os << c.name; }
inline std::vector<MoeBalanceCase> moe_balance_cases() {
  return {{"segments_masked", Oracle::moe_balance_ref, 15, 8, 2, 3}, {"one_segment_k3", Oracle::moe_balance_ref, 14, 8, 3, 1}};
}
inline void uses(Uses& u, const MoeBalanceCase& c, DType) {
  MoeBalanceParams p;
  p.N = c.N, p.E = c.E, p.k = c.k, p.rows = c.rows;
  u(Op::moe_expert_load, p)(Op::moe_bias_update, p)(Op::moe_aux_loss, p);
}

// The balance loss of moe_aux_loss from its definition, in T (double: the oracle; float: the naive
// instance whose error sets the STYLE.md bound): per token of a masked segment row, c = scale / T_r^2,
// s' = sigmoid(u) / sum sigmoid(u); loss = sum_t c sum_e F s'; du from the chain rule.
template <class T, class U>
T moe_aux_oracle(const std::vector<U>& u, const std::vector<double>& F, const std::vector<float>& mask, int64_t N,
                 int64_t E, int64_t k, int64_t rows, double scale, std::vector<T>* du) {
  const int64_t per = N / rows;
  T loss = 0;
  if (du) du->assign(size_t(N * E), T(0));
  for (int64_t t = 0; t < N; ++t) {
    if (!(mask[size_t(t)] > 0)) continue;
    const double* f = F.data() + (t / per) * E;
    T tokens = 0;
    for (int64_t e = 0; e < E; ++e) tokens += T(f[e]);
    tokens /= T(k);
    const T c = T(scale) / (tokens * tokens);
    std::vector<T> s(static_cast<size_t>(E));
    T S = 0;
    for (int64_t e = 0; e < E; ++e) S += s[size_t(e)] = T(1) / (T(1) + std::exp(-T(u[size_t(t * E + e)])));
    T q = 0;
    for (int64_t e = 0; e < E; ++e) q += T(f[e]) * s[size_t(e)] / S;
    loss += c * q;
    if (du)
      for (int64_t e = 0; e < E; ++e)
        (*du)[size_t(t * E + e)] = c * (T(f[e]) - q) / S * s[size_t(e)] * (T(1) - s[size_t(e)]);
  }
  return loss;
}

// The row on a device against its oracles: the loads (exact counts) and the bias (the sign rule,
// exact) against their definitions, the balance loss and its gradient against moe_aux_oracle by the
// STYLE.md rule (twice the naive float instance's error, plus 8 ulps of the magnitudes that enter).
inline std::string check(const MoeBalanceCase& c, Device dev) {
  const int64_t N = c.N, E = c.E, k = c.k, rows = c.rows, per = N / rows;
  std::vector<int32_t> idx;
  std::vector<float> mask(size_t(N), 1.f), u(size_t(N * E)), bias(static_cast<size_t>(E));
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < k; ++j) idx.push_back(int32_t((t * 5 + j * 3) % E));  // k distinct experts (gcd(3, E) = 1)
  mask[3] = mask[size_t(N - 1)] = 0.f;  // padding inside a row and at the end
  for (size_t i = 0; i < u.size(); ++i) u[i] = float(std::sin(double(i) * 1.7)) * 2.f;
  for (int64_t e = 0; e < E; ++e) bias[size_t(e)] = float(e % 3) * 0.25f - 0.25f;
  std::vector<double> F(size_t(rows * E), 0.0), total(size_t(E), 0.0);
  for (int64_t t = 0; t < N; ++t)
    if (mask[size_t(t)] > 0)
      for (int64_t j = 0; j < k; ++j) F[size_t((t / per) * E + idx[size_t(t * k + j)])] += 1, total[size_t(idx[size_t(t * k + j)])] += 1;
  std::string err;
  auto on = [dev](const Tensor& t) { return t.to(dev); };
  const Tensor id = on(Tensor::from_vector<int32_t>({N, k}, idx)), m = on(Tensor::from_vector<float>({N}, mask));
  const Tensor load = on(Tensor::zeros({rows, E}, DType::f64));
  moe_expert_load(id, m, rows, false, load);
  if (load.to(Device::cpu).to_vector<double>() != F) err += "the load per segment differs from the count; ";
  const float rate = 0.01f;
  const Tensor b = on(Tensor::from_vector<float>({E}, bias));
  moe_bias_update(b, on(Tensor::from_vector<double>({E}, total)), rate);
  const std::vector<float> got_b = b.to(Device::cpu).to_vector<float>();
  double mean = 0;
  for (double x : total) mean += x / double(E);
  for (int64_t e = 0; e < E; ++e) {
    const double d = mean - total[size_t(e)];
    const float want = bias[size_t(e)] + rate * float((d > 0) - (d < 0));
    if (got_b[size_t(e)] != want) err += "bias[" + std::to_string(e) + "] differs from the sign rule; ";
  }
  const double scale = 1e-2 * double(E) / (double(k) * double(rows));
  const Tensor dl = on(Tensor::zeros({N, E}, DType::f32)), loss = on(Tensor::from_vector<double>({1}, {0.5}));
  moe_aux_loss(on(Tensor::from_vector<float>({N, E}, u)), on(Tensor::from_vector<double>({rows, E}, F)), m, k, scale, dl, loss);
  std::vector<double> g64;
  std::vector<float> g32;
  const double l64 = moe_aux_oracle<double>(u, F, mask, N, E, k, rows, scale, &g64);
  const float l32 = moe_aux_oracle<float>(u, F, mask, N, E, k, rows, scale, &g32);
  const double got_loss = loss.to(Device::cpu).to_vector<double>()[0] - 0.5;  // added into what was there
  if (!(std::abs(got_loss - l64) <= 2 * std::abs(double(l32) - l64) + 8 * 0x1p-23 * std::abs(l64)) || !(l64 > 0))
    err += "the balance loss " + std::to_string(got_loss) + " against float64 " + std::to_string(l64) + "; ";
  const std::vector<float> got = dl.to(Device::cpu).to_vector<float>();
  double gmax = 0;
  for (double g : g64) gmax = std::max(gmax, std::abs(g));
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(got[i] - g64[i]) <= 2 * std::abs(double(g32[i]) - g64[i]) + 8 * 0x1p-23 * gmax)) {
      err += "dlogits[" + std::to_string(i) + "] against float64; ";
      break;
    }
  return err;
}

inline void case_rows_moe(const Backend& be, std::vector<RowUse>& out) {
  add_rows(out, "moe", "tests/ops/test_moe_ops.cpp", be, be.compute_dtype(), moe_cases());
  add_checked_rows(out, "moe_balance", be, be.compute_dtype(), moe_balance_cases());
}

}  // namespace hmla::op_cases
