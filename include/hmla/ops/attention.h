// Dense per-document causal attention (DESIGN.md section 4): the op entry points every backend
// implements, and the plain params struct they share. Letters: b batch, s rows, H query heads,
// Hkv key/value heads (Hkv divides H), Dqk query/key width, Dv value width.
//
// Forward: out[t, h] = sum_{j in A(t)} P_h(t, j) v[j, h / (H / Hkv)],
//          P_h(t, .) = softmax_j(scale * q[t, h] . k[j, h / (H / Hkv)]) (+ exp(sink[h]) in the
//          denominator when a sink is given); lse[h, t] is the log of that denominator.
// Empty rows (A(t) empty): out = 0, lse = +inf, zero gradients.
// Query rows may be a slice of the key rows (context parallelism): q holds sq rows at global
// positions [q_row0, q_row0 + sq) of the s key rows; out, lse, dout and dq have sq rows, k, v,
// dk and dv have s, and the layout covers the s key rows (global positions).
// Backward writes dq, dk, dv (activation gradients) and ADDS into dsink (a parameter's gradient:
// hmla/ops/nn.h's one convention).
#pragma once
#include <cstdint>
#include <string>

#include "hmla/core/layout.h"
#include "hmla/core/tensor.h"

namespace hmla {

// Who computes the dense attention on CUDA (docs/cuda.md, "Dense attention through cuDNN"):
// cuDNN's fused SDPA where it takes the inputs (a build with cudnn-frontend, sm_90, bf16, head
// widths <= 256, no sink), else the hand-written kernels. auto_ picks cuDNN
// where it takes the inputs; cudnn insists (an error naming why it cannot); hmla never uses it.
// The CPU has one implementation and takes auto_ and hmla.
enum class AttnBackend { auto_, cudnn, hmla };
const char* attn_backend_name(AttnBackend b);
// "auto" | "cudnn" | "hmla"; anything else is a ConfigError naming `what` and the known values.
AttnBackend parse_attn_backend(const std::string& name, const std::string& what);
// Whether this build has the cuDNN path (configured with the cudnn-frontend headers).
bool attn_cudnn_built();

// Pointers with their strides in elements; the last dimension of every tensor is contiguous.
// v may alias k (latent MQA: the value is the first Dv channels of the key).
struct AttnDenseParams {
  DType dtype = DType::f32;  // of q, k, v, out, dout, dq, dk, dv
  int64_t b = 0, s = 0, H = 0, Hkv = 0, Dqk = 0, Dv = 0;
  int64_t sq = 0, q_row0 = 0;  // query rows and the global position of the first (sq + q_row0 <= s)
  float scale = 0.f;
  const void* q = nullptr;  // [b, sq, H, Dqk]
  int64_t q_bstride = 0, q_rstride = 0, q_hstride = 0;
  const void* k = nullptr;  // [b, s, Hkv, Dqk]
  int64_t k_bstride = 0, k_rstride = 0, k_hstride = 0;
  const void* v = nullptr;  // [b, s, Hkv, Dv]
  int64_t v_bstride = 0, v_rstride = 0, v_hstride = 0;
  const int32_t* doc_start = nullptr;  // [b, s]
  const int32_t* doc_end = nullptr;    // [b, s] exclusive (the GPU backward's query range per key)
  const float* sink = nullptr;         // [H] or null
  void* out = nullptr;                 // [b, sq, H, Dv] contiguous
  float* lse = nullptr;                // [b, H, sq] contiguous, f32
  // Backward only.
  const void* dout = nullptr;  // [b, sq, H, Dv] contiguous
  void* dq = nullptr;          // [b, sq, H, Dqk] contiguous
  void* dk = nullptr;          // [b, s, Hkv, Dqk] contiguous
  void* dv = nullptr;          // [b, s, Hkv, Dv] contiguous
  float* dsink = nullptr;      // [H] or null
  // The cuDNN path's: the backend asked for (auto_ resolved to the process's choice), and the
  // host layout's document count and longest document (its ragged batch and sequence bounds).
  AttnBackend backend = AttnBackend::auto_;
  int64_t ndocs = 0, max_doc = 0;
};

struct AttnDenseInputs {
  Tensor q;                         // [b, sq, H, Dqk] (sq = s unless a row slice)
  Tensor k;                         // [b, s, Hkv, Dqk]
  Tensor v;                         // [b, s, Hkv, Dv]
  const DocLayout* layout = nullptr;
  Tensor sink;                      // [H] f32, optional
  float scale = 0.f;                // explicit: m^2 / sqrt(Dn + Dr) for MLA
  int64_t q_row0 = 0;               // global position of q's first row
  AttnBackend backend = AttnBackend::auto_;  // the caller's choice (the model: the programme's key)
};

struct AttnDenseSaved {
  Tensor out;  // [b, sq, H, Dv]
  Tensor lse;  // [b, H, sq] f32
};

struct AttnDenseGrads {
  Tensor dq, dk, dv;  // shapes of q, k, v
  Tensor dsink;       // [H] f32, defined iff the inputs have a sink
};

// Whether the backend of the inputs' device runs the forward and the backward on them (their plans,
// hmla/ops/backend.h): f32 on the CPU; bf16 on CUDA (in a CUDA build) with Dqk and Dv multiples of 16.
bool attn_dense_supports(const AttnDenseInputs& in);

// Into preallocated tensors (validated) ...
void attn_dense_fwd(const AttnDenseInputs& in, AttnDenseSaved& saved);
void attn_dense_bwd(const AttnDenseInputs& in, const AttnDenseSaved& saved, const Tensor& dout,
                    AttnDenseGrads& grads);
// ... or allocating them on the inputs' device; dsink is the given tensor (the sink's gradient
// added into it, e.g. a gradient arena's view), else zeros.
AttnDenseSaved attn_dense_fwd(const AttnDenseInputs& in);
AttnDenseGrads attn_dense_bwd(const AttnDenseInputs& in, const AttnDenseSaved& saved,
                              const Tensor& dout, const Tensor& dsink = {});

}  // namespace hmla

// The family's backend entries (op_list.h).
#define HMLA_ATTN_DENSE_PARAMS(X) X(AttnDenseParams)
#define HMLA_ATTN_DENSE_OPS(X)              \
  X(void, attn_dense_fwd, AttnDenseParams)  \
  X(void, attn_dense_bwd, AttnDenseParams)
