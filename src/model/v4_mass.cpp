// A V4 attention layer's attention mass (v4_internal.h; docs/v4_attention.md "Attention mass"): per
// query row t and head h, the share of its one softmax on the window keys, the compressed entries
// and the sink, from two log-sum-exps: the forward's lse (window + attended entries + sink) and
// lse_ws of the same core without entries (window + sink):
//   sink = e^{sink_h - lse},  window = e^{lse_ws - lse} - sink,  entries = 1 - e^{lse_ws - lse}.
// The second core runs only on layers that have entries (sliding: lse_ws = lse) and only reads.
// Sums in f64 on the model's device (attn_compressed_mass: nothing is read back), over this rank's
// rows (context parallelism: the step's all-reduce adds the ranks').
#include "v4_internal.h"

namespace hmla {

void v4_attn_mass(const ModelConfig& c, const V4AttnTensors& w, const Tensor& x, const DocLayout& layout,
                  const V4Rows& rows, const V4AttnSaved& sv, const Tensor& row_weight, const Tensor& acc) {
  Tensor lse_ws = sv.lse;
  if (sv.comp.e.n > 0) {  // the same q, window, sink and scale, no entry (n_e = 0)
    AttnCompressedInputs in = v4_core_inputs(c, w, x, sv, layout, rows);
    in.ent = in.ent_last = in.ent_doc = in.idx = Tensor();
    lse_ws = attn_compressed_fwd(in).lse;
  }
  attn_compressed_mass(sv.lse, lse_ws, w.sink, row_weight, acc);
}

}  // namespace hmla
