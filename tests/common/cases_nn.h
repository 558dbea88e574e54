// The case table of the dense ops and the optimizer steps (hmla/ops/nn.h, optim.h): rows, their
// shapes and oracles, and the (op, params) each row's case dispatches (uses). The runner and the
// float64 oracles are tests/ops/test_nn_ops.cpp's. Header-only, no test framework (`hmla ops`).
#pragma once
#include <string>
#include <vector>

#include "hmla/ops/nn.h"
#include "hmla/ops/optim.h"
#include "case_support.h"

// A new op in the family is its enumerator, its row and its uses here, and its case function in
// test_nn_ops.cpp.
namespace hmla::op_cases {

// What the shape fields mean per op:
//   matmul: [rows, inner] x [inner, cols]; matmul_per_head: the same per head of [rows, heads,
//   pitch] activations; linear: x [rows, inner] a column slice of [rows, pitch], W [cols, inner];
//   the row ops (norms, axpy, convert, cross_entropy): [rows, cols] (a slice of [rows, pitch]
//   where pitch > 0); rope: [rows = b, inner = s, heads, pitch] rotating cols = Dr channels;
//   embedding: rows ids into an [inner, cols] table; swiglu and the optimizer: cols values.
enum class NnOp {
  matmul, matmul_per_head, linear, rmsnorm, add_rmsnorm, layernorm, rope, swiglu, embedding, cross_entropy,
  axpy_scale, optimizer, convert,
};
struct NnShape {
  int64_t rows = 1, cols = 0, inner = 0, heads = 1, pitch = 0;
};
struct NnCase {
  std::string name;
  Oracle oracle;
  NnOp op;
  NnShape shape;
  bool ta = false, tb = false;  // matmul: op(A) = A^T, op(B) = B^T
  float beta = 0.f;             // matmul: C = alpha op(A) op(B) + beta C0
  RopeLayout layout = RopeLayout::interleaved;
  float limit = 0.f;            // swiglu: DeepSeek-V4's clamp (0: none)
};
inline void PrintTo(const NnCase& c, std::ostream* os) { print_row(c, os); }
inline std::vector<NnCase> nn_ops() {
  using O = Oracle;
  return {
      {"matmul_nn", O::gemm_ref, NnOp::matmul, {.rows = 7, .cols = 5, .inner = 9}},
      {"matmul_tn_beta", O::gemm_ref, NnOp::matmul, {.rows = 7, .cols = 5, .inner = 9}, true, false, 0.5f},
      {"matmul_nt", O::gemm_ref, NnOp::matmul, {.rows = 7, .cols = 5, .inner = 9}, false, true},
      {"matmul_per_head_views", O::gemm_ref, NnOp::matmul_per_head,
       {.rows = 6, .cols = 5, .inner = 4, .heads = 3, .pitch = 10}},
      {"linear_column_slices", O::gemm_ref, NnOp::linear, {.rows = 11, .cols = 4, .inner = 6, .pitch = 9}},
      {"rmsnorm_column_slices", O::norm_ref, NnOp::rmsnorm, {.rows = 9, .cols = 12, .pitch = 16}},
      {"add_rmsnorm_aliased", O::add_rmsnorm_ref, NnOp::add_rmsnorm, {.rows = 9, .cols = 12, .pitch = 16}},
      {"layernorm", O::norm_ref, NnOp::layernorm, {.rows = 8, .cols = 10}},
      {"rope_interleaved", O::rope_ref, NnOp::rope, {.rows = 2, .cols = 6, .inner = 5, .heads = 3, .pitch = 9}},
      {"rope_half", O::rope_ref, NnOp::rope, {.rows = 2, .cols = 6, .inner = 5, .heads = 3, .pitch = 9}, false, false,
       0.f, RopeLayout::half},
      {"swiglu", O::swiglu_ref, NnOp::swiglu, {.cols = 37}},
      {"swiglu_clamped", O::swiglu_ref, NnOp::swiglu, {.cols = 37}, false, false, 0.f, RopeLayout::interleaved, 1.5f},
      {"embedding_repeated_ids", O::embedding_ref, NnOp::embedding, {.rows = 6, .cols = 5, .inner = 7}},
      {"cross_entropy_row_weights", O::cross_entropy_ref, NnOp::cross_entropy, {.rows = 6, .cols = 11}},
      // Rows wide enough for the CPU's f32 vector path (cross_entropy.cpp: 4096 and wider).
      {"cross_entropy_wide_rows", O::cross_entropy_ref, NnOp::cross_entropy, {.rows = 3, .cols = 4096}},
      {"axpy_scale_aliased_slices", O::axpy_ref, NnOp::axpy_scale, {.rows = 5, .cols = 4, .pitch = 7}},
      {"optimizer_steps", O::optim_ref, NnOp::optimizer, {.cols = 23}},
      {"convert_strided", O::bf16_rounding, NnOp::convert, {.rows = 6, .cols = 5, .pitch = 8}},
  };
}

// The nn rows: each entry point the row's case calls, with the row's shapes. The products take f32
// tensors on every backend (CUDA rounds their inputs to bf16 inside: nn.h).
inline GemmParams gemm(Trans ta, Trans tb, int64_t batch, int64_t M, int64_t N, int64_t K, float beta) {
  GemmParams p;
  p.ta = ta, p.tb = tb, p.batch = batch, p.M = M, p.N = N, p.K = K, p.beta = beta;
  return p;
}
inline NormParams norm(int64_t N, int64_t D, bool backward, bool layernorm, bool add) {
  NormParams p;
  p.N = N, p.D = D, p.eps = 1e-6f;
  static float f;
  if (layernorm) p.bias = &f, p.mean = &f;
  if (add) p.x2 = &f, p.xs = &f;
  if (backward) p.dy = &f, p.dx = &f, p.dw = &f;
  if (backward && layernorm) p.db = &f;
  return p;
}
inline AxpyParams axpy(int64_t N, int64_t D, float alpha, bool with_b) {
  AxpyParams p;
  p.N = N, p.D = D, p.alpha = alpha;
  if (with_b) p.b = reinterpret_cast<const float*>(&detail::marker);
  return p;
}
inline ConvertParams convert(DType from, DType to, int64_t rows, int64_t cols) {
  ConvertParams p;
  p.src_dtype = from, p.dst_dtype = to, p.dims = 2, p.shape[0] = rows, p.shape[1] = cols;
  return p;
}

inline void uses(Uses& u, const NnCase& c, DType) {
  const NnShape& s = c.shape;
  const Trans T = Trans::yes, N = Trans::no;
  static float x;
  switch (c.op) {
    case NnOp::matmul: u(Op::gemm, gemm(c.ta ? T : N, c.tb ? T : N, 1, s.rows, s.cols, s.inner, c.beta)); return;
    case NnOp::matmul_per_head: u(Op::gemm, gemm(N, N, s.heads, s.rows, s.cols, s.inner, 0.f)); return;
    case NnOp::linear:  // y = x W^T; dW += dy^T x; dx = dy W + dx
      u(Op::gemm, gemm(N, T, 1, s.rows, s.cols, s.inner, 0.f))(Op::gemm, gemm(T, N, 1, s.cols, s.inner, s.rows, 1.f));
      u(Op::gemm, gemm(N, N, 1, s.rows, s.inner, s.cols, 1.f));
      return;
    case NnOp::rmsnorm:
      u(Op::rmsnorm_fwd, norm(s.rows, s.cols, false, false, false))(Op::rmsnorm_bwd, norm(s.rows, s.cols, true, false, false));
      return;
    case NnOp::add_rmsnorm:  // and add then rmsnorm_fwd, the bits it must give
      u(Op::add_rmsnorm_fwd, norm(s.rows, s.cols, false, false, true))(Op::axpy, axpy(s.rows, s.cols, 1.f, true));
      u(Op::rmsnorm_fwd, norm(s.rows, s.cols, false, false, false));
      return;
    case NnOp::layernorm:
      u(Op::layernorm_fwd, norm(s.rows, s.cols, false, true, false))(Op::layernorm_bwd, norm(s.rows, s.cols, true, true, false));
      return;
    case NnOp::rope: {
      RopeParams p;
      p.layout = c.layout, p.heads = s.heads, p.N = s.rows * s.inner, p.s = s.inner, p.Dr = s.cols;
      RopeParams t = p;
      t.transpose = true;
      u(Op::rope, p)(Op::rope, t);
      return;
    }
    case NnOp::swiglu: {
      SwigluParams f, b;
      f.n = b.n = s.cols;
      f.limit = b.limit = c.limit;
      b.dy = &x, b.dg = &x, b.du = &x;
      u(Op::swiglu_fwd, f)(Op::swiglu_bwd, b);
      return;
    }
    case NnOp::embedding: {
      EmbeddingParams f, b;
      f.N = b.N = s.rows, f.V = b.V = s.inner, f.D = b.D = s.cols;
      b.dout = &x, b.dE = &x;
      u(Op::embedding_fwd, f)(Op::embedding_bwd, b);
      return;
    }
    case NnOp::cross_entropy: {
      CrossEntropyParams p;
      p.N = s.rows, p.V = s.cols;
      p.dlogits = &x;
      u(Op::cross_entropy, p);
      return;
    }
    case NnOp::axpy_scale:  // axpy, then scale (no b)
      u(Op::axpy, axpy(s.rows, s.cols, -0.5f, true))(Op::axpy, axpy(s.rows, s.cols, 3.f, false));
      return;
    case NnOp::optimizer: {
      SumSquaresParams ss;
      AdamWParams adam;
      MuonParams muon;
      ss.n = adam.n = muon.n = s.cols;
      MuonParams update = muon;  // the momentum has m and writes u; the update has neither
      muon.m = &x, muon.u = &x;
      u(Op::sum_squares, ss)(Op::adamw_update, adam)(Op::muon_momentum, muon)(Op::muon_update, update);
      // and the step's stats ops and Muon's normalisation (stats_case)
      u(Op::stats_add, StatsParams{})(Op::stats_losses, StatsParams{})(Op::stats_clip, StatsParams{});
      u(Op::muon_normalize, update);
      return;
    }
    case NnOp::convert:
      u(Op::convert, convert(DType::f32, DType::bf16, s.rows, s.cols))(Op::convert, convert(DType::bf16, DType::f32, s.rows, s.cols));
      return;
  }
}

}  // namespace hmla::op_cases

namespace hmla::op_cases {
inline void case_rows_nn(const Backend& be, std::vector<RowUse>& out) {
  add_rows(out, "nn", "tests/ops/test_nn_ops.cpp", be, DType::f32, nn_ops());
}
}  // namespace hmla::op_cases
