// The hybrid_mla attention sublayer of a DeepSeek-V4 stack (DESIGN.md section 10; v4_internal.h):
// the MLA layer of sections 1-6 (mla_forward / mla_backward, unchanged) on the layer's derived
// config hybrid_mla_config(c, L): its own heads, ranks and head widths, the forced window
// index_window = sliding_window, the sink, the main RoPE and the layer's mode. The V4 block around
// it (mHC, attn_norm, MoE) is v4_model.cpp's. CPU; context parallelism is the MLA layer's own.
#include "hmla/model/mla_layer.h"
#include "v4_internal.h"

namespace hmla {

namespace {

MlaLayer hybrid_layer(const V4HybridSaved& sv, int64_t L, const AttnTensors& w) {
  return MlaLayer{&sv.cfg, L, false, w, AttnBackend::auto_};
}

}  // namespace

void v4_hybrid_fwd(const ModelConfig& c, int64_t L, const AttnTensors& w, const Tensor& x, const DocLayout& layout,
                   V4HybridSaved& sv, const Tensor& y, Comm& cp, const RopeCache& rope) {
  sv.cfg = hybrid_mla_config(c, L);
  sv.layer = L;
  sv.mla = MlaSaved{};
  sv.mla.rope = rope;
  const Tensor out = mla_forward(hybrid_layer(sv, L, w), x, layout, sv.mla, cp);  // [b, s, D]
  Tensor(y).copy_from(out.view(y.shape()));                                   // y is the caller's view
}

double v4_hybrid_bwd(const V4HybridSaved& sv, const AttnTensors& w, const AttnTensors& g, const Tensor& x,
                     const DocLayout& layout, const Tensor& dy, const Tensor& dx, const V4HybridBackward& opt,
                     Comm& cp) {
  const MlaLayer layer = hybrid_layer(sv, sv.layer, w);
  const bool kl = sv.cfg.runs_indexer(sv.layer);
  if (!opt.backbone && !kl) return 0;  // frozen, and no indexer to train
  MlaBackwardOptions mo;
  mo.backbone = opt.backbone;
  mo.grads = g;  // the weight gradients land in the caller's views (added)
  if (kl) mo.row_weight = opt.row_weight, mo.kl_acc = opt.kl_acc;
  const MlaGrads r = mla_backward(layer, x, layout, sv.mla, opt.backbone ? dy.view(x.shape()) : Tensor(), mo, cp);
  if (opt.backbone) Tensor(dx).copy_from(r.dx.view(dx.shape()));
  return kl ? r.indexer_kl : 0;
}

}  // namespace hmla
