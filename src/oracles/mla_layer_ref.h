// Naive MLA attention layer (mha form) in any precision, forward and backward: the float64
// instance is the oracle the layer's f32 forms (mha, mqa_full_causal, split kv_b_proj) are tested
// against; the float32 instance measures a naive implementation's error (the STYLE.md rule).
// Written from DESIGN.md's definitions on plain loops; the attention core is attn_dense_ref.
#pragma once
#include <cstdint>
#include <vector>

namespace hmla::ref {

// Rq = 0: q_proj instead of the q LoRA. Sink: softmax_offset non-empty.
struct MlaDims {
  int64_t b, s, hid, H, Dn, Dr, Dv, Rq, Rkv;
};

// Linear weights [out, in] (y = x W^T), norms [width]; the names of the layer's tensors.
template <class T>
struct MlaRefWeights {
  std::vector<T> q_proj, q_a_proj, q_a_layernorm, q_b_proj;  // q_proj [H Dqk, hid] or the LoRA
  std::vector<T> kv_a_proj_with_mqa;                         // [Rkv + Dr, hid]
  std::vector<T> kv_a_layernorm;                             // [Rkv]
  std::vector<T> kv_b_proj;                                  // [H (Dn + Dv), Rkv]
  std::vector<T> o_proj;                                     // [hid, H Dv]
  std::vector<T> softmax_offset;                             // [H] or empty
};

template <class T>
struct MlaRefResult {
  std::vector<T> y, dx;  // [b, s, hid]
  MlaRefWeights<T> dw;   // the same fields as the weights (empty where the weight is)
};

// x, dy [b, s, hid]; cos/sin [s, Dr / 2] (interleaved pairs (2i, 2i + 1) rotate by angle i);
// doc_start [b, s] (DocLayout convention); L = sum(y * dy) defines the gradients (dy empty:
// forward only).
template <class T>
MlaRefResult<T> mla_layer_ref(const MlaDims& d, const MlaRefWeights<T>& w, const std::vector<T>& x,
                              const std::vector<T>& cos, const std::vector<T>& sin,
                              const std::vector<int32_t>& doc_start, T scale, T eps, const std::vector<T>& dy);

}  // namespace hmla::ref
