// DeepSeekMoE's routing and row movement as ops (DESIGN.md section 9, docs/moe.md): the router's
// group-limited top-k over sigmoid scores and its backward, the dispatch of (token, slot) pairs
// grouped by expert, and the gathers, combines and row dots between the per-expert products.
// and the routed experts' products over their dispatch rows (grouped: the per-expert bounds stay
// on the tensors' device). Every kernel is deterministic: each output value is written by one
// thread in a fixed order, no atomics. The CPU and the CUDA backend (src/cuda/moe.cu) run them all.
//
// Letters: N tokens, E routed experts, k = num_experts_per_tok, D a row width. A slot is one
// (token t, choice j) pair, numbered t * k + j; the dispatch order lists the N * k slots grouped by
// expert (experts ascending), each expert's slots in token order.
#pragma once
#include <cstdint>
#include <vector>

#include "hmla/core/tensor.h"

namespace hmla {

// The router's score of a logit u (scoring_func): sigmoid(u) (DeepSeek-V3.2, GLM-5, V4's option) or
// DeepSeek-V4's sqrt(softplus(u)), softplus as torch computes it (log1p(exp(u)), u itself above 20).
enum class MoeScore : uint8_t { sigmoid, sqrtsoftplus };

// The router (transformers' DeepseekV32TopkRouter; DeepseekV4TopKRouter with one group, and its
// DeepseekV4HashRouter): s = score(u) of the logits u, choice c = s + bias (no bias: c = s); the
// groups (E / n_group experts each, consecutive) ranked by the sum of their two largest c, the
// best topk_group kept; then the k experts of largest c among the kept groups. Ties (exact, in a
// group's rank or an expert's) go to the smaller index. idx lists the chosen by descending c
// (equal c: ascending expert). Hash routing (`fixed`, the frozen tid2eid rows of the tokens):
// idx = fixed, no choice. weight = s at the chosen, divided by (sum of those s + 1e-20) when
// norm_topk_prob, times `scaling`. The backward writes dlogits [N, E] (0 outside the chosen): the
// gradient of weight only (the choice is piecewise constant, the bias gets none); for sqrtsoftplus
// it reads the logits (ds/du = softplus'(u) / 2s).
struct MoeRouteParams {
  int64_t N = 0, E = 0, k = 0, n_group = 1, topk_group = 1;
  bool norm_topk_prob = true;
  float scaling = 1.f;             // routed_scaling_factor
  MoeScore score_fn = MoeScore::sigmoid;
  const float* logits = nullptr;   // [N, E] u = x W_gate^T, contiguous (forward; sqrtsoftplus's backward)
  const float* bias = nullptr;     // [E] e_score_correction_bias, or null
  const int32_t* fixed = nullptr;  // [N, k] hash routing's experts, or null
  int32_t* idx = nullptr;          // [N, k] the chosen experts
  float* weight = nullptr;         // [N, k] their gating weights
  float* score = nullptr;          // [N, k] their s (the backward's input)
  const int32_t* idx_in = nullptr; // backward: [N, k] the forward's idx
  const float* score_in = nullptr; // backward: [N, k] the forward's score
  const float* dweight = nullptr;  // backward: [N, k]
  float* dlogits = nullptr;        // backward: [N, E], written
};

// The dispatch of idx [N, k] (every entry in [0, E), no expert twice in a row): order [N * k] the
// slots grouped by expert, pos [N * k] its inverse (pos[slot] = the slot's row in that order),
// offsets [E + 1] (expert e's rows are [offsets[e], offsets[e + 1])). A stable counting sort.
struct MoeDispatchParams {
  int64_t N = 0, E = 0, k = 0;
  const int32_t* idx = nullptr;  // [N, k]
  int32_t* order = nullptr;      // [N * k]
  int32_t* pos = nullptr;        // [N * k]
  int32_t* offsets = nullptr;    // [E + 1]
};

// Row movement between token rows [N, D] and dispatch rows [N * k, D]:
// - gather: out[i] = src[r(i)] * (w ? w[order[i]] : 1), r(i) = order[i] / k (from_tokens: src is
//   token rows) or i (src is already in dispatch order: a row scale);
// - combine: out[t] = (accumulate ? out[t] : 0) + sum over j = 0 .. k-1, in that order, of
//   (w ? w[t * k + j] : 1) * src[pos[t * k + j]]; the sum is formed first, then added;
// - rowdot: out[order[i]] = sum_d a[i, d] b[i, d] (d ascending): a value per slot, in slot order.
// On CUDA the gather's src and the rowdot's a and b may be bf16 (saved activations, widened
// exactly); everything else, and all of the CPU's, is f32.
struct MoeRowsParams {
  int64_t N = 0, k = 0, D = 0;
  DType src_dtype = DType::f32, a_dtype = DType::f32, b_dtype = DType::f32;
  const void* src = nullptr;       // gather: [N, D] or [N * k, D]; combine: [N * k, D]; rows at ld_src
  int64_t ld_src = 0;
  const void* a = nullptr;         // rowdot: [N * k, D] contiguous
  const void* b = nullptr;         // rowdot: [N * k, D] contiguous
  const int32_t* order = nullptr;  // [N * k] (gather, rowdot)
  const int32_t* pos = nullptr;    // [N * k] (combine)
  const float* w = nullptr;        // [N * k] per slot, or null
  bool from_tokens = true, accumulate = false;
  float* out = nullptr;            // gather: [N * k, D]; combine: [N, D]; rows at ld_out; rowdot: [N * k]
  int64_t ld_out = 0;
};

// The routed experts' products over the dispatch rows: rows [offsets[e], offsets[e + 1]) of the
// row matrices belong to expert e, whose weight is W[e] [out, in] (contiguous). Forward (dW null):
// y[r] = x[r] W_e^T. Backward: dW_e += dy_e^T x_e (f32, added into) and, when dx is set,
// dx[r] = dy[r] W_e + dx_beta dx[r]. x, y / dy, dx and the weights are each f32 or bf16 (linear_fwd's
// and linear_bwd's contract: on CUDA inputs rounded to bf16, f32 sums, one rounding to the output's
// dtype); the CPU runs f32 only, as linear_fwd / linear_bwd expert after expert (empty experts
// skipped), so its bits are those of a per-expert loop. The offsets are read where they live: the
// CUDA kernels read them on the device, so no bound crosses to the host.
struct MoeGroupedParams {
  int64_t E = 0, rows = 0, in = 0, out = 0;
  DType x_dtype = DType::f32, w_dtype = DType::f32, y_dtype = DType::f32, dx_dtype = DType::f32;
  const int32_t* offsets = nullptr;  // [E + 1], on the tensors' device
  const void* const* W = nullptr;    // [E] host table: expert e's [out, in] weight (on the device)
  float* const* dW = nullptr;        // backward: [E] host table: expert e's [out, in] f32 gradient
  const void* x = nullptr;           // [rows, in] rows at ld_x
  int64_t ld_x = 0;
  void* y = nullptr;                 // forward: [rows, out] written; backward: dy, read; rows at ld_y
  int64_t ld_y = 0;
  void* dx = nullptr;                // backward: [rows, in] rows at ld_dx, or null
  int64_t ld_dx = 0;
  float dx_beta = 0.f;
};

struct MoeRouting {  // the router's outputs over N tokens
  Tensor idx;     // [N, k] i32
  Tensor weight;  // [N, k] f32
  Tensor score;   // [N, k] f32
};
struct MoeDispatch {
  Tensor order, pos;  // [N * k] i32
  Tensor offsets;     // [E + 1] i32
};

// A router's settings (config.h's MoeConfig and V4Config).
struct MoeRouter {
  int64_t n_group = 1, topk_group = 1;
  bool norm_topk_prob = true;
  float scaling = 1.f;
  MoeScore score = MoeScore::sigmoid;
};

// logits [N, E] and bias [E] (or undefined: no correction) f32 contiguous; fixed [N, k] i32 (hash
// routing: each row k distinct experts in [0, E)) or undefined; r's tensors [N, k] contiguous
// (written).
void moe_route_fwd(const Tensor& logits, const Tensor& bias, const MoeRouter& router, const MoeRouting& r,
                   const Tensor& fixed = Tensor());
// dlogits [N, E] written from dweight [N, k] and the forward's r.idx, r.score (and its logits for
// sqrtsoftplus).
void moe_route_bwd(const Tensor& dweight, const MoeRouting& r, const MoeRouter& router, const Tensor& dlogits,
                   const Tensor& logits = Tensor());
// idx [N, k] i32 checked on the host when it lives there (every entry in [0, E), none twice in a row).
MoeDispatch moe_dispatch(const Tensor& idx, int64_t E);
// gather: src [N, D] row matrix (from_tokens) or [N * k, D]; out [N * k, D] contiguous; w [N * k] or undefined.
void moe_gather(const Tensor& src, const MoeDispatch& d, int64_t k, const Tensor& w, bool from_tokens,
                const Tensor& out);
// combine: src [N * k, D] contiguous; out [N, D] row matrix; w [N * k] or undefined.
void moe_combine(const Tensor& src, const MoeDispatch& d, int64_t k, const Tensor& w, bool accumulate,
                 const Tensor& out);
// rowdot: a, b [N * k, D] contiguous; out [N * k] per slot.
void moe_rowdot(const Tensor& a, const Tensor& b, const MoeDispatch& d, int64_t k, const Tensor& out);
// The experts' products: x [N * k, in] and y [N * k, out] row matrices in dispatch order, W[e] the
// E experts' [out, in] weights (one dtype), d.offsets the bounds.
void moe_grouped_fwd(const Tensor& x, const std::vector<Tensor>& W, const MoeDispatch& d, const Tensor& y);
// dW[e] += dy_e^T x_e; dx = dy W_e + dx_beta dx when dx is defined (dx_beta 0 or 1).
void moe_grouped_bwd(const Tensor& dy, const Tensor& x, const std::vector<Tensor>& W, const std::vector<Tensor>& dW,
                     const MoeDispatch& d, const Tensor& dx, float dx_beta = 0.f);

// Load balancing (DeepSeek-V3; docs/moe.md "Load balancing"; CPU and CUDA: moe_balance.cu): the
// experts' load counted from the router's chosen table, the auxiliary-loss-free bias update, and
// the sequence-wise balance loss with its gradient. One params struct for the three; every sum in
// a fixed order.
// - moe_expert_load: load[r, e] (+)= the number of slots (t, j) with idx[t, j] == e over the tokens
//   t of segment r whose mask[t] > 0 (every token when mask is null); the N tokens are `rows`
//   consecutive segments of N / rows (a batch's rows). f64 counts: exact to 2^53.
// - moe_bias_update: bias[e] += rate * sign(total - E load[e]) (= sign(mean_load - load[e]), the
//   comparison exact on integer counts; sign(0) = 0), total = sum_e load[e]; in f32, as
//   bias + rate * sign.
// - moe_aux_loss: per token t of segment r = t / (N / rows) with mask[t] > 0, T_r = sum_e F[r, e] / k
//   (the segment's counted tokens), c_t = scale / T_r^2, s = sigmoid(u_t) over all E experts,
//   S = sum_e s_e (e ascending) and s' = s / S: loss += sum_t c_t sum_e F[r, e] s'_e (tokens in
//   order), and dlogits[t, e] += c_t (F[r, e] - sum_i F[r, i] s'_i) / S s_e (1 - s_e), the gradient
//   of that loss through the scores (F and c are constants). With scale = alpha E / (k B) this is
//   alpha / B sum_r sum_e f_e P_e (f_e = E F[r, e] / (k T_r), P_e = sum_t s'_e / T_r).
struct MoeBalanceParams {
  int64_t N = 0, E = 0, k = 0, rows = 1;
  const int32_t* idx = nullptr;   // load: [N, k] the router's chosen experts
  const float* mask = nullptr;    // load: [N] or null
  double* load = nullptr;         // load: [rows, E] written, or added into when accumulate
  bool accumulate = false;
  const double* load_in = nullptr;  // bias update: [E] the step's global load
  float* bias = nullptr;            // bias update: [E] e_score_correction_bias
  float rate = 0.f;
  const float* logits = nullptr;  // aux loss: [N, E] u = x W_gate^T
  const double* counts = nullptr; // aux loss: [rows, E] F, per segment (mask: the token mask)
  double scale = 0;               // aux loss: alpha E / (k B)
  float* dlogits = nullptr;       // aux loss: [N, E], added into
  double* loss = nullptr;         // aux loss: [1], added into
};

// idx [N, k] i32; mask [N] f32 contiguous or undefined; load f64 [rows, E] contiguous (rows divides N).
void moe_expert_load(const Tensor& idx, const Tensor& mask, int64_t rows, bool accumulate, const Tensor& load);
// bias f32 [E], load f64 [E], both contiguous on one device; rate finite.
void moe_bias_update(const Tensor& bias, const Tensor& load, float rate);
// logits f32 [N, E], counts f64 [rows, E], mask f32 [N], dlogits f32 [N, E] (added into), loss f64
// [1] (added into), contiguous on one device; k >= 1, scale finite.
void moe_aux_loss(const Tensor& logits, const Tensor& counts, const Tensor& mask, int64_t k, double scale,
                  const Tensor& dlogits, const Tensor& loss);

}  // namespace hmla

// The family's backend entries (op_list.h): X(return type, entry, params struct).
#define HMLA_MOE_PARAMS(X) X(MoeRouteParams) X(MoeDispatchParams) X(MoeRowsParams) X(MoeGroupedParams)
#define HMLA_MOE_OPS(X)                       \
  X(void, moe_route_fwd, MoeRouteParams)      \
  X(void, moe_route_bwd, MoeRouteParams)      \
  X(void, moe_dispatch, MoeDispatchParams)    \
  X(void, moe_gather, MoeRowsParams)          \
  X(void, moe_combine, MoeRowsParams)         \
  X(void, moe_rowdot, MoeRowsParams)          \
  X(void, moe_grouped_fwd, MoeGroupedParams)  \
  X(void, moe_grouped_bwd, MoeGroupedParams)

#define HMLA_MOE_BALANCE_PARAMS(X) X(MoeBalanceParams)
#define HMLA_MOE_BALANCE_OPS(X)                  \
  X(void, moe_expert_load, MoeBalanceParams)     \
  X(void, moe_bias_update, MoeBalanceParams)     \
  X(void, moe_aux_loss, MoeBalanceParams)
