// Expert parallelism's exchange (hmla/dist/ep.h): counts by one all-to-all, rows by one all-to-all
// each way, the received blocks reordered from sender-major to expert-major by block copies.
#include "hmla/dist/ep.h"

#include <numeric>

#include "hmla/core/error.h"

namespace hmla {

int64_t EpPlan::rows_sent() const { return std::accumulate(sent.begin(), sent.end(), int64_t(0)); }
int64_t EpPlan::rows_received() const { return std::accumulate(received.begin(), received.end(), int64_t(0)); }

std::vector<int64_t> EpPlan::local_expert_rows() const {
  std::vector<int64_t> n(size_t(E_local), 0);
  for (int q = 0; q < R; ++q)
    for (int64_t j = 0; j < E_local; ++j) n[size_t(j)] += received[size_t(q * E_local + j)];
  return n;
}

EpPlan ep_plan(Comm& ep, const std::vector<int64_t>& expert_rows) {
  EpPlan p;
  p.R = ep.size(), p.rank = ep.rank(), p.E = int64_t(expert_rows.size());
  HMLA_CHECK(p.E > 0 && p.E % p.R == 0, ConfigError, "expert parallelism: ", p.R, " ranks must divide the ", p.E,
             " routed experts of a MoE layer");
  for (int64_t n : expert_rows) HMLA_CHECK(n >= 0, ShapeError, "expert parallelism: a negative row count");
  p.E_local = p.E / p.R;
  p.sent = expert_rows;  // experts ascending = owners ascending, each owner's block in its order
  p.received.assign(expert_rows.size(), 0);
  ep.alltoall(p.sent.data(), p.received.data(), p.E_local * int64_t(sizeof(int64_t)));
  return p;
}

namespace {

void check_rows(const Tensor& t, int64_t n, const char* what) {
  HMLA_CHECK(t.dim() == 2 && t.size(0) == n && t.is_contiguous() && (t.dtype() == DType::f32 || t.dtype() == DType::bf16),
             ShapeError, what, ": expected contiguous f32 or bf16 rows [", n, ", W], got ", dtype_name(t.dtype()),
             shape_str(t.shape()));
}

// Per rank q, the bytes of the blocks [q * E_local, (q + 1) * E_local) of `counts` rows of `row_bytes`.
std::vector<int64_t> block_bytes(const EpPlan& p, const std::vector<int64_t>& counts, int64_t row_bytes) {
  std::vector<int64_t> b(size_t(p.R), 0);
  for (int q = 0; q < p.R; ++q)
    for (int64_t j = 0; j < p.E_local; ++j) b[size_t(q)] += counts[size_t(q * p.E_local + j)] * row_bytes;
  return b;
}

// Copies each (sender q, expert j) block between the sender-major layout (the wire) and the
// expert-major one; to_expert: wire -> expert-major, else back.
void reorder(const EpPlan& p, const Tensor& wire, const Tensor& by_expert, bool to_expert) {
  std::vector<int64_t> at(size_t(p.R * p.E_local));  // each block's first row in the expert-major layout
  int64_t off = 0;
  for (int64_t j = 0; j < p.E_local; ++j)
    for (int q = 0; q < p.R; ++q) at[size_t(q * p.E_local + j)] = off, off += p.received[size_t(q * p.E_local + j)];
  int64_t w = 0;
  for (size_t i = 0; i < at.size(); w += p.received[i], ++i) {
    const int64_t n = p.received[i];
    if (n == 0) continue;
    Tensor a = wire.slice(0, w, w + n), b = by_expert.slice(0, at[i], at[i] + n);
    if (to_expert) b.copy_from(a);
    else a.copy_from(b);
  }
}

}  // namespace

Tensor ep_dispatch(Comm& ep, const EpPlan& p, const Tensor& rows) {
  check_rows(rows, p.rows_sent(), "ep_dispatch");
  const int64_t W = rows.size(1), rb = W * int64_t(dtype_size(rows.dtype()));
  Tensor wire = Tensor::empty({p.rows_received(), W}, rows.dtype(), rows.device());
  ep.alltoallv(rows.raw_data(), block_bytes(p, p.sent, rb), wire.raw_data(), block_bytes(p, p.received, rb),
               rows.device());
  Tensor out = Tensor::empty(wire.shape(), rows.dtype(), rows.device());
  reorder(p, wire, out, true);
  return out;
}

Tensor ep_return(Comm& ep, const EpPlan& p, const Tensor& rows) {
  check_rows(rows, p.rows_received(), "ep_return");
  const int64_t W = rows.size(1), rb = W * int64_t(dtype_size(rows.dtype()));
  Tensor wire = Tensor::empty(rows.shape(), rows.dtype(), rows.device());
  reorder(p, wire, rows, false);
  Tensor out = Tensor::empty({p.rows_sent(), W}, rows.dtype(), rows.device());
  ep.alltoallv(wire.raw_data(), block_bytes(p, p.received, rb), out.raw_data(), block_bytes(p, p.sent, rb),
               rows.device());
  return out;
}

}  // namespace hmla
