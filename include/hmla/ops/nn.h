// The model's dense building blocks as ops (DESIGN.md section 2): products, norms, RoPE, SwiGLU,
// embedding, cross-entropy and the element-wise steps between them. Each family has one plain
// params struct (pointers with row strides, like AttnDenseParams) that every backend implements;
// the entry points below take Tensors, validate them once, fill the struct and dispatch to the
// backend of the tensors' device (hmla/ops/backend.h). Outputs are passed as Tensor handles
// (views allowed) and written through.
//
// Row matrices: a tensor [..., D] whose last dimension is contiguous and whose leading dimensions
// walk rows at one stride is read as N rows of width D with a row stride ld (a column slice of a
// wider tensor is one).
//
// Gradients, one convention (llm.c's): every backward ADDS into its weight-gradient outputs (dW,
// dw, db, dE: views of the gradient arena, zeroed once per step), so contributions of layers,
// micro-batches and tied tensors sum where they land; activation gradients (dx, dg, du) are
// written, except linear_bwd's dx_beta = 1, which adds a second branch into the first.
#pragma once
#include <cstdint>

#include "hmla/core/tensor.h"

namespace hmla {

enum class Trans : uint8_t { no, yes };

// C = alpha op(A) op(B) + beta C for each of `batch` matrices: op(A) [M, K], op(B) [K, N], C [M, N]
// row-major with leading dimensions ld* and batch strides *_batch (elements). Each operand has its
// own dtype, f32 or bf16 (the CPU runs f32 only; CUDA any mix: docs/cuda.md "Products").
struct GemmParams {
  DType a_dtype = DType::f32, b_dtype = DType::f32, c_dtype = DType::f32;
  Trans ta = Trans::no, tb = Trans::no;
  int64_t batch = 1, M = 0, N = 0, K = 0;
  float alpha = 1.f, beta = 0.f;
  const void* a = nullptr;  // [batch][M, K] (ta: [K, M]) rows at lda, matrices at a_batch
  int64_t lda = 0, a_batch = 0;
  const void* b = nullptr;  // [batch][K, N] (tb: [N, K]) rows at ldb, matrices at b_batch
  int64_t ldb = 0, b_batch = 0;
  void* c = nullptr;  // [batch][M, N] rows at ldc, matrices at c_batch
  int64_t ldc = 0, c_batch = 0;
};

// c = alpha op(a) op(b) + beta c. a, b, c are 2-D [rows, cols] or all three 3-D [batch, rows,
// cols] (any batch stride: a head-sliced view is a batch), last dimension contiguous. Each of a, b,
// c is f32 or bf16 (its own dtype). On CUDA every input is rounded to bf16, the products are summed
// in f32 and alpha acc + beta c is rounded once to c's dtype; the CPU runs f32 only.
void matmul(const Tensor& a, Trans ta, const Tensor& b, Trans tb, const Tensor& c, float alpha = 1.f,
            float beta = 0.f);

// y = x W^T: x rows [N, in], W [out, in] contiguous, y rows [N, out]; x, W, y each f32 or bf16
// (matmul's contract: on CUDA, e.g. bf16 activations times a bf16 weight copy).
void linear_fwd(const Tensor& x, const Tensor& W, const Tensor& y);
// dW += dy^T x; dx = dy W + dx_beta * dx when dx is defined (dx_beta 0 or 1). dy, x, W, dx each
// f32 or bf16; dW f32 (the gradient arena, added into).
void linear_bwd(const Tensor& dy, const Tensor& x, const Tensor& W, const Tensor& dW, const Tensor& dx,
                float dx_beta = 0.f);

// RMSNorm (bias and mean null) or LayerNorm over rows of width D: y = xhat * w (+ bias),
// xhat = (x - mean) * rstd; the backward writes dx and adds into dw (and db). The fused
// add_rmsnorm_fwd first writes xs = x + x2 (the residual stream) and normalises xs. x, x2 and y
// may be bf16 on CUDA (the activations, read exactly, y rounded once); the residual stream xs,
// the 1-D weights, mean, rstd and every gradient stay f32 (DESIGN.md section 4).
struct NormParams {
  int64_t N = 0, D = 0;
  float eps = 0.f;
  DType x_dtype = DType::f32, x2_dtype = DType::f32, y_dtype = DType::f32;
  const void* x = nullptr;  // [N, D] rows at stride ldx, x_dtype
  int64_t ldx = 0;
  const void* x2 = nullptr;  // add_rmsnorm: [N, D] rows at stride ldx2, x2_dtype, added to x
  int64_t ldx2 = 0;
  float* xs = nullptr;  // add_rmsnorm: [N, D] rows at stride ldxs, x + x2 (may alias x or x2)
  int64_t ldxs = 0;
  const float* w = nullptr;     // [D]
  const float* bias = nullptr;  // [D] LayerNorm only
  void* y = nullptr;            // [N, D] rows at stride ldy, y_dtype
  int64_t ldy = 0;
  float* mean = nullptr;  // [N] LayerNorm only
  float* rstd = nullptr;  // [N]
  const float* dy = nullptr;  // [N, D] rows at stride lddy (backward)
  int64_t lddy = 0;
  float* dx = nullptr;  // [N, D] rows at stride lddx (backward)
  int64_t lddx = 0;
  float* dw = nullptr;  // [D]
  float* db = nullptr;  // [D] LayerNorm only
};

// y = x * rstd * w per row, rstd = 1 / sqrt(mean(x^2) + eps) saved [N]. x, y row matrices, each
// f32 or bf16; w, rstd f32. The backwards take x f32 or bf16, everything else f32.
void rmsnorm_fwd(const Tensor& x, const Tensor& w, float eps, const Tensor& y, const Tensor& rstd);
void rmsnorm_bwd(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dx,
                 const Tensor& dw);
// The residual stream's step, fused: xs = x + x2, then y = rmsnorm_fwd(xs) (the same bits as add
// then rmsnorm_fwd). x, x2, xs, y row matrices of one shape; xs may be x or x2. x, xs f32 (the
// residual stream); x2 and y f32 or bf16.
void add_rmsnorm_fwd(const Tensor& x, const Tensor& x2, const Tensor& w, float eps, const Tensor& xs, const Tensor& y,
                     const Tensor& rstd);
// y = (x - mean) * rstd * w + b per row; contiguous rows; x and y f32 or bf16.
void layernorm_fwd(const Tensor& x, const Tensor& w, const Tensor& b, float eps, const Tensor& y, const Tensor& mean,
                   const Tensor& rstd);
void layernorm_bwd(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                   const Tensor& dx, const Tensor& dw, const Tensor& db);

// The two RoPE layouts (DESIGN.md section 4): MLA rotates interleaved pairs (x0,x1),(x2,x3),...;
// the indexer rotates halves (x_i, x_{i + Dr/2}).
enum class RopeLayout { interleaved, half };

// RoPE in place on `heads` slices of width Dr per row: pair i of row n rotated by the angle of
// position n % s. cos/sin are [s, Dr/2] tables with the attention factor folded in; `transpose`
// applies the transposed map (the backward: with the factor folded in it is a scaled rotation).
struct RopeParams {
  RopeLayout layout = RopeLayout::interleaved;
  DType x_dtype = DType::f32;
  void* x = nullptr;  // [N][heads][Dr] in place: rows at ld, heads at hstride, x_dtype
  int64_t ld = 0, hstride = 0, heads = 0, N = 0, s = 0, Dr = 0;
  const float* cos = nullptr;  // [s, Dr / 2]
  const float* sin = nullptr;  // [s, Dr / 2]
  bool transpose = false;
};

// x: a [b, s, heads, Dr] f32 or bf16 view (rows of one stride, heads of another, Dr contiguous),
// rotated in f32 and stored back rounded once; cos, sin f32.
void rope(const Tensor& x, const Tensor& cos, const Tensor& sin, RopeLayout layout, bool transpose);

// SwiGLU y = silu(g) * u element-wise over n values; the backward writes dg and du. g, u and y
// are the activations, all of one dtype (f32 or bf16: g, u read exactly, y rounded once); dy, dg
// and du are gradients, f32.
struct SwigluParams {  // every pointer [n] contiguous
  int64_t n = 0;
  DType dtype = DType::f32;  // of g, u, y
  float limit = 0.f;         // > 0: DeepSeek-V4's clamp (swiglu_limit), 0: none
  const void* g = nullptr;
  const void* u = nullptr;
  void* y = nullptr;
  const float* dy = nullptr;
  float* dg = nullptr;
  float* du = nullptr;
};
// y = silu(g) u; with limit > 0 (DeepSeek-V4's swiglu_limit, as transformers clamps) g is first
// clamped to <= limit and u to [-limit, limit], and the gradient does not pass a clamp that acted
// (torch's clamp passes it at equality).
void swiglu_fwd(const Tensor& g, const Tensor& u, const Tensor& y, float limit = 0.f);
void swiglu_bwd(const Tensor& dy, const Tensor& g, const Tensor& u, const Tensor& dg, const Tensor& du,
                float limit = 0.f);

// Embedding rows: out[n] = E[ids[n]]; the backward adds dout[n] into dE[ids[n]], rows in token
// order (deterministic).
struct EmbeddingParams {
  int64_t N = 0, V = 0, D = 0;
  const int32_t* ids = nullptr;  // [N] in [0, V)
  const float* E = nullptr;      // [V, D]
  float* out = nullptr;          // [N, D]
  const float* dout = nullptr;   // [N, D] (backward)
  float* dE = nullptr;           // [V, D] (backward: added into)
};
// ids i32 [N] (any shape of N values) checked in [0, V); E [V, D]; out [N, D] contiguous.
void embedding_fwd(const Tensor& ids, const Tensor& E, const Tensor& out);
void embedding_bwd(const Tensor& ids, const Tensor& dout, const Tensor& dE);  // adds into dE

// Cross-entropy of logits [N, V] against targets [N] with row weights w [N] (0 skips a row):
// ADDS sum_n w[n] (logsumexp(logits[n]) - logits[n, target[n]]) into the f64 scalar acc, row by
// row in row order (chunks of rows into one acc sum as one call would), and, when dlogits is
// given, writes w[n] (softmax(logits[n]) - onehot(target[n])) (0 for w = 0 rows); dlogits may be
// logits itself (the LM head writes the gradient over its chunk's logits). acc lives on the op's
// device (a slot of the step's stats buffer, hmla/ops/optim.h), so nothing is read back.
struct CrossEntropyParams {
  int64_t N = 0, V = 0;
  const float* logits = nullptr;   // [N, V]
  const int32_t* target = nullptr; // [N] in [0, V)
  const float* w = nullptr;        // [N]
  float* dlogits = nullptr;        // [N, V] or null
  double* acc = nullptr;           // [1] on the op's device: the loss is added into it
};
// acc: an f64 tensor of one value on logits' device (a view of a wider buffer allowed).
void cross_entropy_into(const Tensor& logits, const Tensor& target, const Tensor& w, const Tensor& dlogits,
                        const Tensor& acc);
// The same, returning init + the loss on the host (one read-back; callers outside the training step).
double cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& w, const Tensor& dlogits = {},
                     double init = 0);

// Element-wise over row matrices of one shape [N, D]: out = a + alpha * b (b may be null: out =
// alpha * a). out may alias a or b.
struct AxpyParams {
  int64_t N = 0, D = 0;
  float alpha = 1.f;
  const float* a = nullptr;  // [N, D] rows at lda
  int64_t lda = 0;
  const float* b = nullptr;  // [N, D] rows at ldb, or null
  int64_t ldb = 0;
  float* out = nullptr;  // [N, D] rows at ldout
  int64_t ldout = 0;
};
void add(const Tensor& a, const Tensor& b, const Tensor& out);                // out = a + b
void axpy(const Tensor& a, float alpha, const Tensor& b, const Tensor& out);  // out = a + alpha b
void scale(const Tensor& a, float alpha, const Tensor& out);                  // out = alpha a

// dst = src element by element, converted to dst's dtype (f32 <-> bf16, or the same dtype): the
// compute copies of f32 tensors for the bf16 kernels and back. Same shape, any strides, at most
// four dimensions of size > 1, one device.
struct ConvertParams {
  DType src_dtype = DType::f32, dst_dtype = DType::f32;
  int dims = 0;
  int64_t shape[4] = {}, src_stride[4] = {}, dst_stride[4] = {};
  const void* src = nullptr;  // shape at src_stride (elements), src_dtype
  void* dst = nullptr;        // shape at dst_stride (elements), dst_dtype
};
void convert(const Tensor& src, const Tensor& dst);
// A contiguous copy of t in `dtype` on t's device (t itself when it already is one).
Tensor converted(const Tensor& t, DType dtype);
// An operand of the attention and indexer-score kernels as its device's backend reads them
// (Backend::compute_dtype: f32 on the CPU, bf16 on CUDA): t itself, any strides, when it is in that
// dtype, else a contiguous copy in it.
Tensor compute_operand(const Tensor& t);

}  // namespace hmla

// The family's backend entries (op_list.h): X(return type, entry, params struct).
#define HMLA_NN_PARAMS(X) \
  X(GemmParams) X(NormParams) X(RopeParams) X(SwigluParams) X(EmbeddingParams) X(CrossEntropyParams) X(AxpyParams) \
  X(ConvertParams)
#define HMLA_NN_OPS(X)                          \
  X(void, gemm, GemmParams)                     \
  X(void, rmsnorm_fwd, NormParams)              \
  X(void, rmsnorm_bwd, NormParams)              \
  X(void, add_rmsnorm_fwd, NormParams)          \
  X(void, layernorm_fwd, NormParams)            \
  X(void, layernorm_bwd, NormParams)            \
  X(void, rope, RopeParams)                     \
  X(void, swiglu_fwd, SwigluParams)             \
  X(void, swiglu_bwd, SwigluParams)             \
  X(void, embedding_fwd, EmbeddingParams)       \
  X(void, embedding_bwd, EmbeddingParams)       \
  X(void, cross_entropy, CrossEntropyParams)    \
  X(void, axpy, AxpyParams)                     \
  X(void, convert, ConvertParams)
