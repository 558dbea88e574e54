// The decoder layer's forward/backward pair (decoder_layer.h) on ops: the attention through
// mla_forward/mla_backward, the MLP through its Mlp, the residual stream's adds and norms here.
#include "hmla/model/decoder_layer.h"

#include <map>

#include "hmla/model/model.h"
#include "hmla/ops/nn.h"

namespace hmla {

namespace {

bool split_kv_b_proj_at(const Model& m, int64_t L) { return m.split_kv_b_proj && latent_mqa_enabled(m.cfg, L); }

// The attention's tensors of layer L: views of the arena, which holds kv_b_proj; k_b_proj/v_b_proj
// are copies split from it where split_kv_b_proj_at.
AttnTensors layer_attn(const Model& m, int64_t L) {
  AttnTensors w = m.wc.layers[L].attn;  // the products' weights in the compute dtype
  if (split_kv_b_proj_at(m, L)) split_kv_b_proj(w, m.cfg);
  return w;
}

// A split layer's gradients (k_b_proj/v_b_proj, new tensors) folded to kv_b_proj and added into
// the arena's views.
void add_split_grads(const MlaLayer& layer, AttnTensors into, MlaGrads& g) {
  if (g.dweights.k_b_proj.defined()) fold_kv_b_proj(g.dweights, *layer.cfg);
  const std::vector<Tensor*> dst = fields(into), src = fields(g.dweights);
  for (size_t i = 0; i < dst.size(); ++i)
    if (src[i]->defined()) add(*dst[i], *src[i], *dst[i]);
}

// The layer's own activations, in arena order, each with its slot in LayerSaved: the one place
// both are written.
struct OwnField {
  ActField f;
  Tensor& (*slot)(LayerSaved&);
};
std::vector<OwnField> own_fields(int64_t hidden) {
  return {{{"a", hidden}, [](LayerSaved& s) -> Tensor& { return s.a; }},
          {{"h_mid", hidden, true}, [](LayerSaved& s) -> Tensor& { return s.h_mid; }},
          {{"mn", hidden}, [](LayerSaved& s) -> Tensor& { return s.mn; }},
          {{"out", hidden, true}, [](LayerSaved& s) -> Tensor& { return s.out; }},
          {{"rstd1", 0}, [](LayerSaved& s) -> Tensor& { return s.rstd1; }},
          {{"rstd2", 0}, [](LayerSaved& s) -> Tensor& { return s.rstd2; }}};
}

Shape field_shape(const ActField& f, int64_t N) { return f.width ? Shape{N, f.width} : Shape{N}; }

}  // namespace

std::vector<ActField> layer_fields(const ModelConfig& c, int64_t L) {
  std::vector<ActField> f;
  for (const OwnField& o : own_fields(c.hidden_size)) f.push_back(o.f);
  for (const ActField& m : mlp_fields(c, L)) f.push_back(m);
  return f;
}


ArenaCursor::ArenaCursor(const std::vector<ActSpec>& t, Device dev) : table(t) {
  std::map<DType, int64_t> numel;
  for (const ActSpec& a : table) numel[a.dtype] += shape_numel(a.shape);
  for (const auto& [dt, n] : numel) flat[dt] = {Tensor::empty({n}, dt, dev), 0};
}

Tensor ArenaCursor::next(const Shape& shape) {
  HMLA_CHECK(i < table.size() && table[i].shape == shape, ShapeError, "activation arena: entry ", i, " is not ",
             shape_str(shape));
  auto& [arena, off] = flat.at(table[i].dtype);
  const int64_t n = shape_numel(shape);
  Tensor t = arena.slice(0, off, off + n).view(shape);
  off += n, ++i;
  return t;
}

void ArenaCursor::finish() const {
  HMLA_CHECK(i == table.size(), ShapeError, "activation arena: ", table.size() - i, " entries left unused");
}

void append_layer_table(std::vector<ActSpec>& table, const ModelConfig& c, int64_t L, const ActRows& r, DType compute) {
  const std::string pre = "layers." + std::to_string(L) + ".";
  for (const ActField& f : layer_fields(c, L)) table.push_back({pre + f.name, field_shape(f, r.b * r.s), field_dtype(f, compute)});
  for (const MlaField& f : mla_fields(c, L, r.b, r.s, r.S, compute, r.recompute))
    table.push_back({pre + "attn." + f.name, f.shape, f.dtype});
}

void take_layer_views(ArenaCursor& cur, const ModelConfig& c, int64_t L, const ActRows& r, DType compute, LayerSaved& sv) {
  const int64_t b = r.b, s = r.s, hidden = c.hidden_size;
  for (const OwnField& o : own_fields(hidden)) {
    const Tensor t = cur.next(field_shape(o.f, b * s));
    Tensor& slot = o.slot(sv);
    // The layer's hidden-width fields as [b, s, hidden], but mn: the MLP reads it as [N, hidden] rows.
    slot = o.f.width == hidden && &slot != &sv.mn ? t.view({b, s, hidden}) : t;
  }
  sv.mlp.clear();
  for (const ActField& f : mlp_fields(c, L)) sv.mlp.push_back(cur.next(field_shape(f, b * s)));
  for (const MlaField& f : mla_fields(c, L, b, s, r.S, compute, r.recompute)) f.slot(sv.attn) = cur.next(f.shape);
  sv.attn.in_arena = true;
}

DecoderLayer decoder_layer(const Model& m, int64_t L, const LayerTensors* grads) {
  DecoderLayer d{m, L, MlaLayer{&m.cfg, L, split_kv_b_proj_at(m, L), layer_attn(m, L), m.attn_backend},
                 make_mlp(m.cfg, L, m.wc.layers[L], grads)};
  d.mlp->ep = m.ep;
  return d;
}

void decoder_layer_forward(const DecoderLayer& d, const Tensor& h_in, const DocLayout& layout, LayerSaved& sv, Comm& cp,
                           bool drop_core) {
  const LayerTensors& lw = d.m.wc.layers[d.L];
  const float eps = float(d.m.cfg.rms_norm_eps);
  sv.h_in = h_in;
  rmsnorm_fwd(h_in, lw.input_layernorm, eps, sv.a, sv.rstd1);
  const Tensor y = mla_forward(d.attn, sv.a, layout, sv.attn, cp);
  if (drop_core) mla_drop_core(sv.attn);
  add_rmsnorm_fwd(h_in, y, lw.post_attention_layernorm, eps, sv.h_mid, sv.mn, sv.rstd2);
  d.mlp->forward(sv.mn, sv.mlp, sv.out);
  add(sv.out, sv.h_mid, sv.out);
}

LayerBackward decoder_layer_backward(const DecoderLayer& d, const Tensor& dout, const DocLayout& layout, LayerSaved& sv,
                                     const MlaBackwardOptions& opt, const LayerTensors& lg, bool recompute,
                                     Comm& cp) {
  const bool dsa = d.m.cfg.runs_indexer(d.L);  // a KL to train (shared layers have none)
  if (recompute) mla_recompute_core(d.attn, sv.a, layout, sv.attn, cp);
  MlaBackwardOptions mo = opt;
  if (!d.attn.split_kv_b_proj) mo.grads = lg.attn;  // straight into the arena
  LayerBackward r;
  if (!mo.backbone) {  // train_indexer_only: the indexers' KL alone
    if (!dsa) return r;
    MlaGrads g = mla_backward(d.attn, sv.a, layout, sv.attn, Tensor(), mo, cp);
    if (d.attn.split_kv_b_proj) add_split_grads(d.attn, lg.attn, g);
    r.indexer_kl = g.indexer_kl;
    return r;
  }
  const LayerTensors& lw = d.m.wc.layers[d.L];
  auto tmp = [&](const Shape& sh) { return Tensor::empty(sh, DType::f32, d.m.device()); };
  // out = h_mid + mlp(mn).
  Tensor dmn = tmp(sv.mn.shape());
  d.mlp->backward(dout, sv.mn, sv.mlp, dmn);
  Tensor dmid = tmp(sv.h_mid.shape());
  rmsnorm_bwd(dmn, sv.h_mid, lw.post_attention_layernorm, sv.rstd2, dmid, lg.post_attention_layernorm);
  add(dmid, dout, dmid);
  // h_mid = h_in + mla(input_layernorm(h_in)).
  MlaGrads g = mla_backward(d.attn, sv.a, layout, sv.attn, dmid, mo, cp);
  if (d.attn.split_kv_b_proj) add_split_grads(d.attn, lg.attn, g);
  if (dsa) r.indexer_kl = g.indexer_kl;
  r.dh_in = tmp(sv.h_in.shape());
  rmsnorm_bwd(g.dx, sv.h_in, lw.input_layernorm, sv.rstd1, r.dh_in, lg.input_layernorm);
  add(r.dh_in, dmid, r.dh_in);
  return r;
}

}  // namespace hmla
