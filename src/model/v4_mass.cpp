// A V4 attention layer's attention mass (v4_internal.h; docs/v4_attention.md "Attention mass"): per
// query row t and head h, the share of its one softmax on the window keys, the compressed entries
// and the sink, from two log-sum-exps: the forward's lse (window + attended entries + sink) and
// lse_ws of the same core without entries (window + sink):
//   sink = e^{sink_h - lse},  window = e^{lse_ws - lse} - sink,  entries = 1 - e^{lse_ws - lse}.
// The second core runs only on layers that have entries (sliding: lse_ws = lse) and only reads.
// Sums on the host in f64 (the V4 layers run on the CPU so far; on it nothing is copied), over this
// rank's rows (context parallelism: the step's all-reduce adds the ranks').
#include <cmath>
#include <vector>

#include "v4_internal.h"

namespace hmla {

void v4_attn_mass(const ModelConfig& c, const V4AttnTensors& w, const Tensor& x, const DocLayout& layout,
                  const V4Rows& rows, const V4AttnSaved& sv, const Tensor& row_weight, const Tensor& acc) {
  const int64_t b = x.size(0), s = x.size(1), H = c.num_attention_heads;
  Tensor lse_ws = sv.lse;
  if (sv.comp.e.n > 0) {  // the same q, window, sink and scale, no entry (n_e = 0)
    AttnCompressedInputs in = v4_core_inputs(c, w, x, sv, layout, rows);
    in.ent = in.ent_last = in.ent_doc = in.idx = Tensor();
    lse_ws = attn_compressed_fwd(in).lse;
  }
  const std::vector<float> lse = sv.lse.to_vector<float>(), ws = lse_ws.to_vector<float>(),
                           rw = row_weight.to_vector<float>();
  const std::vector<float> sink =
      w.sink.defined() ? w.sink.to_vector<float>() : std::vector<float>(size_t(H), -INFINITY);
  double sum[4] = {0, 0, 0, 0};  // window, entries, sink, (row, head) pairs
  for (int64_t r = 0; r < b; ++r)
    for (int64_t t = 0; t < s; ++t) {
      if (!(rw[size_t(r * s + t)] > 0.f)) continue;  // not a loss row (padding: lse = +inf)
      for (int64_t h = 0; h < H; ++h) {
        const size_t i = size_t((r * H + h) * s + t);
        const double p_sink = std::exp(double(sink[size_t(h)]) - double(lse[i]));
        const double p_ws = std::exp(double(ws[i]) - double(lse[i]));
        const double part[3] = {p_ws - p_sink, 1 - p_ws, p_sink};  // window, entries, sink
        for (int k = 0; k < 3; ++k) sum[k] += part[k];
        sum[3] += 1;
      }
    }
  std::vector<double> a = acc.to_vector<double>();
  for (size_t k = 0; k < 4; ++k) a[k] += sum[k];
  Tensor(acc).copy_from(Tensor::from_vector<double>({4}, a));  // a view of the caller's buffer
}

}  // namespace hmla
