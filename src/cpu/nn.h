// CPU building blocks of the MLA layer, on row-major f32 rows: linear, RMSNorm, interleaved
// RoPE. Backward functions overwrite their outputs unless the name says `acc`.
#pragma once
#include <cstdint>

namespace hmla::cpu {

// y[N, out] = x[N, in] W^T, W [out, in]; ldx/ldy are row strides of x and y.
void linear_fwd(float* y, int64_t ldy, const float* x, int64_t ldx, const float* W, int64_t N,
                int64_t in, int64_t out);
// dW [out, in] = dy^T x (overwrite); dx [N, in] (+)= dy W: `beta` 0 overwrites, 1 accumulates;
// dx may be null.
void linear_bwd(float* dx, int64_t lddx, float beta, float* dW, const float* dy, int64_t lddy,
                const float* x, int64_t ldx, const float* W, int64_t N, int64_t in, int64_t out);

// y = x * rstd * w per row, rstd = 1 / sqrt(mean(x^2) + eps) saved [N]. x, y have row stride ld*.
void rmsnorm_fwd(float* y, int64_t ldy, float* rstd, const float* x, int64_t ldx, const float* w,
                 int64_t N, int64_t D, float eps);
// dx (overwrite, stride lddx), dw [D] (overwrite).
void rmsnorm_bwd(float* dx, int64_t lddx, float* dw, const float* dy, int64_t lddy, const float* x,
                 int64_t ldx, const float* w, const float* rstd, int64_t N, int64_t D);

// y = (x - mean) * rstd * w + b per row (LayerNorm); mean and rstd saved [N].
void layernorm_fwd(float* y, float* mean, float* rstd, const float* x, const float* w, const float* b,
                   int64_t N, int64_t D, float eps);
// dx (overwrite), dw and db [D] (overwrite). Rows contiguous.
void layernorm_bwd(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                   const float* mean, const float* rstd, int64_t N, int64_t D);

// The two RoPE layouts (DESIGN.md section 4): MLA rotates interleaved pairs (x0,x1),(x2,x3),...;
// the indexer rotates halves (x_i, x_{i + Dr/2}) of its first Dr channels.
enum class RopeLayout { interleaved, half };

// RoPE in place on `heads` slices of width Dr per row, pair i rotated by pos(t) * inv_freq[i]. cos/sin are [s, Dr/2] tables (already multiplied by the
// attention factor); row n of the N = b * s rows sits at position n % s. x + n * ld + h * hstride
// is the slice of head h. `transpose` applies the transposed map (the backward; with the
// attention factor folded into cos/sin the map is a scaled rotation, not orthogonal).
void rope(RopeLayout layout, float* x, int64_t ld, int64_t hstride, int64_t heads, int64_t N, int64_t s,
          int64_t Dr, const float* cos, const float* sin, bool transpose);

// SwiGLU: y = silu(g) * u elementwise over n values; backward writes dg and du (overwrite).
void swiglu_fwd(float* y, const float* g, const float* u, int64_t n);
void swiglu_bwd(float* dg, float* du, const float* dy, const float* g, const float* u, int64_t n);

// Cross-entropy of logits [N, V] against targets [N] with row weights w [N] (0 skips a row):
// returns sum_n w[n] * (logsumexp(logits[n]) - logits[n, target[n]]) and, when dlogits is not
// null, writes its gradient w[n] * (softmax(logits[n]) - onehot(target[n])) (rows with w = 0
// get 0). Rows are independent; the sum runs in row order.
double cross_entropy(const float* logits, const int32_t* target, const float* w, int64_t N, int64_t V,
                     float* dlogits);

}  // namespace hmla::cpu
