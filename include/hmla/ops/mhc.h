// DeepSeek-V4's manifold-constrained hyper-connections (mHC) as ops (DESIGN.md section 10,
// docs/deepseek_v4_math.md section 7, docs/mhc.md): the block entry (pre: the mixing weights and
// the collapsed input), the block exit (post: the streams' update) and hc_head, forward and
// backward, on the CPU and on CUDA, all in f32 on every device.
//
// Letters: N token rows, n = hc_mult streams of width D, the streams x [N, n, D] contiguous,
// m = (2 + n) n rows of the entry's fn (n for the head's), K = n D, S = 2 iters - 1 Sinkhorn
// divisions. Per token t, xf = x[t] flattened [K], r = 1 / sqrt(mean(xf^2) + norm_eps),
// z = r xf fn^T [m] (= unweighted_rms(xf) fn^T):
// - pre (the entry): a = z * scale[g] + base (g = 0, 1, 2 for z's pre, post and comb parts);
//   pre = sigmoid(a_pre) + hc_eps, post = 2 sigmoid(a_post), comb = softmax over k of a_comb
//   viewed [i, k], + hc_eps, then Sinkhorn: columns (sum over i) first, then iters - 1 times rows
//   then columns, every denominator + hc_eps; y = sum_i pre_i x[t, i].
// - post (the exit): out[t, k] = post[t, k] y[t] + sum_i comb[t, i, k] x[t, i] (comb transposed).
// - head: pre = sigmoid(z * scale[0] + base) + hc_eps, y = sum_i pre_i x[t, i].
// The forward saves rstd [N] (r) and z [N, m]; the backward recomputes pre, post and comb from
// them, and the Sinkhorn divisions step by step from the softmax (O(S^2 n^2) per token, exact:
// every division is differentiated, docs/mhc.md). Backward: activation gradients (dx, and post's
// dy, dpost, dcomb) are written; the weights' (dfn, dbase, dscale) are ADDED into (hmla/ops/nn.h's
// convention). No atomics: every sum has a fixed order (on the CPU, the products' as sgemm's).
//
// The product z = r xf fn^T (and its backward's dfn += (r dz)^T xf, dxf = (r dz) fn) runs inside
// the op: on the CPU through the CPU's sgemm; on CUDA as SIMT dot products in f32, because the
// repo's CUDA GEMM rounds its inputs to bf16 (nn.h) and mHC is f32 on every device; its output is
// m <= 80 columns wide, too narrow for the tensor-core tiles anyway.
#pragma once
#include <cstdint>

#include "hmla/core/tensor.h"

namespace hmla {

inline constexpr int64_t kMhcMaxStreams = 8;  // n <= 8: the per-token matrices live in registers on CUDA

// One params struct for the family; the Op says which pass (m = (2 + n) n for pre, n for head).
struct MhcParams {
  int64_t N = 0, n = 0, D = 0;
  int64_t iters = 1;               // hc_sinkhorn_iters (pre), >= 1
  float norm_eps = 0.f;            // rms_norm_eps (forward)
  float hc_eps = 0.f;              // hc_eps
  const float* x = nullptr;        // [N, n, D] the streams
  const float* fn = nullptr;       // pre, head: [m, n D]
  const float* base = nullptr;     // pre, head: [m]
  const float* scale = nullptr;    // pre: [3], head: [1]
  float* rstd = nullptr;           // pre, head: [N] forward writes, backward reads
  float* z = nullptr;              // pre, head: [N, m] forward writes, backward reads
  float* y = nullptr;              // pre, head forward: [N, D] written; post: [N, D] the block's output, read
  float* post = nullptr;           // [N, n]: pre forward writes, post reads
  float* comb = nullptr;           // [N, n, n]: pre forward writes, post reads
  float* out = nullptr;            // post forward: [N, n, D] the updated streams
  const float* dy = nullptr;       // pre, head backward: [N, D]
  const float* dpost = nullptr;    // pre backward: [N, n]
  const float* dcomb = nullptr;    // pre backward: [N, n, n]
  const float* dout = nullptr;     // post backward: [N, n, D]
  float* dx = nullptr;             // backward: [N, n, D] written
  float* dy_out = nullptr;         // post backward: [N, D] written
  float* dpost_out = nullptr;      // post backward: [N, n] written
  float* dcomb_out = nullptr;      // post backward: [N, n, n] written
  float* dfn = nullptr;            // pre, head backward: [m, n D] added into
  float* dbase = nullptr;          // pre, head backward: [m] added into
  float* dscale = nullptr;         // pre, head backward: [3] / [1] added into
};

// A mixer's weights (or their gradients): pre fn [(2 + n) n, n D], base [(2 + n) n], scale [3]
// (checkpoint hc_attn_* / hc_ffn_*); head fn [n, n D], base [n], scale [1] (model.hc_head.hc_*).
struct MhcWeights {
  Tensor fn, base, scale;
};
// What the forward saves for the backward: rstd [N], z [N, m].
struct MhcSaved {
  Tensor rstd, z;
};

// Every tensor f32, contiguous, on one device; x [N, n, D] with 1 <= n <= kMhcMaxStreams.
// The entry: y [N, D], post [N, n], comb [N, n, n] and saved written.
void mhc_pre_fwd(const Tensor& x, const MhcWeights& w, int64_t iters, float norm_eps, float hc_eps, const Tensor& y,
                 const Tensor& post, const Tensor& comb, const MhcSaved& saved);
// dx [N, n, D] written; dw's tensors added into. dy [N, D], dpost [N, n], dcomb [N, n, n].
void mhc_pre_bwd(const Tensor& dy, const Tensor& dpost, const Tensor& dcomb, const Tensor& x, const MhcWeights& w,
                 const MhcSaved& saved, int64_t iters, float hc_eps, const Tensor& dx, const MhcWeights& dw);
// The exit: out [N, n, D] written (out may not alias x).
void mhc_post_fwd(const Tensor& x, const Tensor& y, const Tensor& post, const Tensor& comb, const Tensor& out);
// dx [N, n, D], dy [N, D], dpost [N, n], dcomb [N, n, n] written from dout [N, n, D].
void mhc_post_bwd(const Tensor& dout, const Tensor& x, const Tensor& y, const Tensor& post, const Tensor& comb,
                  const Tensor& dx, const Tensor& dy, const Tensor& dpost, const Tensor& dcomb);
// hc_head: y [N, D] and saved written.
void mhc_head_fwd(const Tensor& x, const MhcWeights& w, float norm_eps, float hc_eps, const Tensor& y,
                  const MhcSaved& saved);
// dx written, dw added into, from dy [N, D].
void mhc_head_bwd(const Tensor& dy, const Tensor& x, const MhcWeights& w, const MhcSaved& saved, float hc_eps,
                  const Tensor& dx, const MhcWeights& dw);

}  // namespace hmla

// The family's backend entries (op_list.h): X(return type, entry, params struct).
#define HMLA_MHC_PARAMS(X) X(MhcParams)
#define HMLA_MHC_OPS(X)              \
  X(void, mhc_pre_fwd, MhcParams)    \
  X(void, mhc_pre_bwd, MhcParams)    \
  X(void, mhc_post_fwd, MhcParams)   \
  X(void, mhc_post_bwd, MhcParams)   \
  X(void, mhc_head_fwd, MhcParams)   \
  X(void, mhc_head_bwd, MhcParams)
