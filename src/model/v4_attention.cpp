// The DeepSeek-V4 attention block on ops (v4_internal.h; docs/deepseek_v4_math.md sections 4-6):
//   qr = q_norm(x wq_a^T); q = RoPE(unweighted_rms_per_head(qr wq_b^T)); kv = RoPE(norm(x wkv^T));
//   entries (CSA / HCA) = RoPE(norm(compress(x wkv_c^T, x wgate_c^T))) at each window's first row;
//   CSA: the indexer's top-k over its own entries (qI = RoPE(qr wq_b_I^T), w = x weights_proj^T);
//   core = attn_compressed (window + entries + sink, K = V); o = RoPE^T(core) at the query's row;
//   y = (o grouped wo_a^T) wo_b^T.
// Rows are N = b s (context parallelism: this rank's s rows of the layout's; keys and entries come
// from every row, gathered: v4_cp.cpp), every activation contiguous, in the compute dtype (v4_act:
// bf16 on CUDA) but the compressors' pooling and the indexer's head weights (f32); RoPE rotates the last
// r channels of a head as interleaved pairs. The backward runs the same chain in reverse; the inverse RoPE on the
// output is the transposed rotation (with the attention factor folded into cos and sin, exactly
// transformers' apply_rotary_pos_emb(out, cos, -sin)), so its backward is the forward rotation.
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "hmla/dist/cp.h"
#include "hmla/ops/compressed_attention.h"
#include "hmla/ops/compressed_index.h"
#include "hmla/ops/nn.h"
#include "v4_internal.h"

namespace hmla {

namespace {

struct Dims {
  int64_t b, s, N, D, H, d, r, Rq, G, Ro;
  Device dev;
};

Dims dims(const ModelConfig& c, const Tensor& x) {
  return {x.size(0), x.size(1), x.size(0) * x.size(1), c.hidden_size, c.num_attention_heads, c.v4.head_dim,
          c.qk_rope_head_dim, c.q_lora_rank, c.v4.o_groups, c.v4.o_lora_rank, x.device()};
}

Tensor f32(const Dims& d, const Shape& sh) { return Tensor::empty(sh, DType::f32, d.dev); }
Tensor act(const Dims& d, const Shape& sh) { return v4_act(d.dev, sh); }

// RoPE on the last r channels of every head of t [rows, heads * width], rows of `rows_per_seq`
// positions each (the table's rows); transpose: the transposed rotation.
void rope_last(const Tensor& t, int64_t heads, int64_t width, int64_t r, int64_t rows_per_seq, const RopeCache& rc,
               bool transpose) {
  const int64_t seqs = t.size(0) / rows_per_seq;
  rope(t.view({seqs, rows_per_seq, heads, width}).slice(3, width - r, width), rc.cos, rc.sin, RopeLayout::interleaved,
       transpose);
}

// The entries' RoPE tables: row e of the table holds the angle of its window's first row (rope_row
// [n] i32 on the device; padding entries: row 0, their pooled rows are 0 and stay 0), gathered from
// the tables of every row rc.
RopeCache entry_rope(const RopeCache& rc, const Tensor& rope_row) {
  const int64_t n = rope_row.numel(), half = rc.cos.size(1);
  const Device dev = rc.cos.device();
  RopeCache e{Tensor::empty({n, half}, DType::f32, dev), Tensor::empty({n, half}, DType::f32, dev)};
  embedding_fwd(rope_row, rc.cos, e.cos);
  embedding_fwd(rope_row, rc.sin, e.sin);
  return e;
}

// Rate m's entry tables of the layout: the micro-batch's (uploaded with it), else made here.
V4BatchEntries entry_tables(const V4Rows& rows, const DocLayout& layout, int64_t m, Device dev) {
  if (rows.batch && rows.batch->v4_entries.count(m)) return rows.batch->v4_entries.at(m);
  V4BatchEntries t = v4_entry_tables(layout, m);
  t.entries.device_first = t.first = t.first.on(dev);
  t.last = t.last.on(dev), t.doc = t.doc.on(dev), t.rope_row = t.rope_row.on(dev);
  return t;
}

// A compressor (rate m, width w, CSA's two series when overlap) over x [b, s, D]. Context
// parallelism: this rank pools its own entries from its frame, then every entry is gathered (v4_cp.cpp).
V4Compressed compress_entries(const ModelConfig& mc, const Dims& d, const V4CompressorTensors& w, const Tensor& x,
                              const DocLayout& layout, const V4BatchEntries& t, int64_t m, int64_t width, bool overlap,
                              const V4Rows& rows) {
  V4Compressed c;
  c.e = t.entries;
  if (c.e.n == 0) return c;
  const int64_t C = (overlap ? 2 : 1) * width, n = c.e.n;
  const Tensor xr = x.view({d.N, d.D});
  c.kvc = f32(d, {d.b, d.s, C});
  c.gc = f32(d, {d.b, d.s, C});
  linear_fwd(xr, w.wkv, c.kvc.view({d.N, C}));
  linear_fwd(xr, w.wgate, c.gc.view({d.N, C}));
  CompressedEntries pool = c.e;  // the entries this rank pools, in the rows of `at`
  const DocLayout* at = &layout;
  if (rows.sharded()) {
    Comm& cp = *rows.cp;
    c.halo = (overlap ? 2 : 1) * m - 1;
    c.f0 = std::max<int64_t>(0, rows.sh.row0 - c.halo);
    c.owners = entry_owners(c.e, m, rows.sh, cp.size());
    c.kvc = cp_frame(cp, rows.sh, c.kvc, c.halo);
    c.gc = cp_frame(cp, rows.sh, c.gc, c.halo);
    c.frame = frame_layout(layout, c.f0, c.kvc.size(1));
    c.own = own_entries(c.e, c.owners, cp.rank(), c.f0);
    pool = c.own, at = &c.frame;
  }
  const int64_t np = pool.n;
  c.pooled = f32(d, {d.b, np, width});
  compress_fwd(c.kvc, c.gc, w.ape, pool, *at, overlap, c.pooled);
  c.rstd = f32(d, {d.b * np});
  if (rows.sharded()) {  // the owned entries' rows (context parallelism runs on the host's tables)
    const Tensor own = own_entries(c.e, c.owners, rows.cp->rank(), 0).first;
    std::vector<int32_t> r(size_t(own.numel()));
    for (size_t i = 0; i < r.size(); ++i) r[i] = std::max<int32_t>(own.data<int32_t>()[i], 0);
    c.rope = entry_rope(rows.compress_all, Tensor::from_vector<int32_t>({own.numel()}, r).on(d.dev));
  } else {
    c.rope = entry_rope(rows.compress_all, t.rope_row);
  }
  Tensor ent = act(d, {d.b, np, width});
  v4_entries_norm_rope(mc, w, c.pooled.view({d.b * np, width}), c.rope, ent.view({d.b * np, width}), c.rstd);
  c.ent = rows.sharded() ? cp_gather_entries(*rows.cp, c.owners, ent, n) : ent;
  return c;
}

void compress_backward(const Dims& d, const V4CompressorTensors& w, const V4CompressorTensors& g, const Tensor& x,
                       const DocLayout& layout, const V4Compressed& c, bool overlap, const Tensor& dent,
                       const Tensor& dx, const V4Rows& rows) {
  const int64_t np = c.pooled.size(1), width = c.ent.size(2), C = c.kvc.size(2), nf = c.kvc.size(1);
  const Tensor de = (rows.sharded() ? cp_scatter_entry_grads(*rows.cp, c.owners, dent) : dent.clone()).view({d.b * np, width});
  rope_last(de, 1, width, d.r, d.b * np, c.rope, true);
  Tensor dpooled = f32(d, {d.b, np, width}), dkvc = f32(d, {d.b, nf, C}), dgc = f32(d, {d.b, nf, C});
  rmsnorm_bwd(de, c.pooled.view({d.b * np, width}), w.norm, c.rstd, dpooled.view({d.b * np, width}), g.norm);
  compress_bwd(dpooled, c.kvc, c.gc, w.ape, rows.sharded() ? c.own : c.e, rows.sharded() ? c.frame : layout, overlap,
               dkvc, dgc, g.ape);
  if (rows.sharded()) {  // the frame's rows -> this rank's (the halo rows' gradients to their ranks)
    dkvc = cp_frame_grad(*rows.cp, rows.sh, dkvc, c.halo);
    dgc = cp_frame_grad(*rows.cp, rows.sh, dgc, c.halo);
  }
  const Tensor xr = x.view({d.N, d.D});
  linear_bwd(dkvc.view({d.N, C}), xr, w.wkv, g.wkv, dx, 1.f);
  linear_bwd(dgc.view({d.N, C}), xr, w.wgate, g.wgate, dx, 1.f);
}

// The CSA indexer's forward (its compressor's entries, its queries and head weights) into sv.
void index_forward(const ModelConfig& c, const Dims& d, const V4AttnTensors& w, const Tensor& x, V4AttnSaved& sv,
                   const DocLayout& layout, const V4BatchEntries& t, const V4Rows& rows) {
  HMLA_CHECK(w.iwq_b.defined(), ConfigError, "a CSA layer runs ", mode_name(sv.mode), " without its indexer's tensors");
  const int64_t nI = c.index_n_heads, dI = c.index_head_dim;
  sv.icomp = compress_entries(c, d, w.icomp, x, layout, t, sv.m, dI, true, rows);
  sv.qI = act(d, {d.N, nI * dI});
  sv.wI = f32(d, {d.N, nI});
  v4_index_queries(c, w, x, sv.qr, rows.compress, sv.qI, sv.wI);
}

CompressedIndexInputs index_inputs(const ModelConfig& c, const Dims& d, const V4AttnSaved& sv, const DocLayout& layout,
                                   const V4Rows& rows) {
  CompressedIndexInputs in;
  in.qI = sv.qI.view({d.b, d.s, c.index_n_heads, c.index_head_dim});
  in.kI = sv.icomp.ent;
  in.w = sv.wI.view({d.b, d.s, c.index_n_heads});
  in.ent_last = sv.ent_last;
  in.ent_doc = sv.ent_doc;
  in.layout = &layout;
  in.q_row0 = rows.sh.row0;
  return in;
}

// The core's inputs: this rank's queries at their rows, every row's window keys (gathered under
// context parallelism, as the MLA layer's latent) and every entry.
AttnCompressedInputs core_inputs(const ModelConfig& c, const Dims& d, const V4AttnTensors& w, const V4AttnSaved& sv,
                                 const DocLayout& layout, const V4Rows& rows) {
  AttnCompressedInputs in;
  in.q = sv.q.view({d.b, d.s, d.H, d.d});
  in.kv = rows.sharded() ? sv.kv_all : sv.kv.view({d.b, d.s, d.d});
  in.q_row0 = rows.sh.row0;
  if (sv.comp.e.n > 0) {
    in.ent = sv.comp.ent;
    in.ent_last = sv.ent_last;
    in.ent_doc = sv.ent_doc;
    in.idx = sv.idx;  // CSA: the selection; HCA: undefined, every visible entry
  }
  in.layout = &layout;
  in.sink = w.sink;
  in.scale = float(1.0 / std::sqrt(double(d.d)));
  in.window = c.v4.sliding_window;
  return in;
}

// The grouped output's first product as one batched matmul over the G groups: group g's
// [N, H d / G] slice of o against rows [g Ro, (g + 1) Ro) of wo_a.
Tensor groups(const Tensor& t, const Dims& d, int64_t width) { return t.view({d.N, d.G, width}).transpose(0, 1); }

// o [N, H d] = RoPE^T(core) at the query's rows: the forward's, and the backward's again (an
// elementwise pass is cheaper than keeping [N, H d]).
Tensor output_rows(const Dims& d, const Tensor& core, const RopeCache& rc) {
  const Tensor o = core.clone().view({d.N, d.H * d.d});
  rope_last(o, d.H, d.d, d.r, d.s, rc, true);
  return o;
}

}  // namespace

AttnCompressedInputs v4_core_inputs(const ModelConfig& c, const V4AttnTensors& w, const Tensor& x,
                                    const V4AttnSaved& sv, const DocLayout& layout, const V4Rows& rows) {
  return core_inputs(c, dims(c, x), w, sv, layout, rows);
}

namespace {

// The RoPE tables of a V4Rows (main: the sliding layers'; compress: the compressor's and its
// indexer's; hybrid: the hybrid_mla layers' MLA tables) from make(key, host tables), on the device.
template <class Make>
V4Rows rows_with(const ModelConfig& c, int64_t s, Comm& cp, Make make) {
  V4Rows v;
  v.sh = row_shard(cp, s);
  v.cp = &cp;
  const int64_t r = c.qk_rope_head_dim, mp = c.max_position_embeddings;
  auto tables = [&](const char* name, const RopeConfig& rope, int64_t rows, int64_t row0) {
    return make(std::string(name) + "." + std::to_string(rows) + "." + std::to_string(row0),
                [&, rows, row0] { return rope_cache(rope_tables(rope, r, mp), rows, row0); });
  };
  v.main = tables("main", c.rope, v.sh.rows, v.sh.row0);
  v.compress = tables("compress", c.v4.compress_rope, v.sh.rows, v.sh.row0);
  v.compress_all = v.sharded() ? tables("compress", c.v4.compress_rope, s, 0) : v.compress;
  for (int64_t L = 0; L < c.num_hidden_layers + c.form.num_nextn_predict_layers; ++L)
    if (c.v4.is_hybrid_mla(L)) {  // every hybrid_mla layer's config has the same RoPE
      const ModelConfig h = hybrid_mla_config(c, L);
      v.hybrid = make("hybrid." + std::to_string(v.sh.rows) + "." + std::to_string(v.sh.row0),
                      [&] { return rope_cache(h, v.sh.rows, v.sh.row0); });
      break;
    }
  return v;
}

}  // namespace

V4Rows v4_rows(const ModelConfig& c, int64_t s, Device dev, Comm& cp) {
  V4Rows v = rows_with(c, s, cp, [dev](const std::string&, const std::function<RopeCache()>& host) {
    const RopeCache h = host();
    return RopeCache{h.cos.on(dev), h.sin.on(dev)};
  });
  v.ones = host_ones(c.v4.head_dim).on(dev);
  return v;
}

V4Rows v4_rows(const Model& m, const DeviceBatch& in, Comm& cp) {
  const ModelConfig& c = m.cfg;
  V4Rows v = rows_with(c, in.layout.s, cp, [&m](const std::string& key, const std::function<RopeCache()>& host) {
    RopeCache h;  // made once per key
    auto part = [&](bool cos) {
      return [&, cos] {
        if (!h.cos.defined()) h = host();
        return cos ? h.cos : h.sin;
      };
    };
    return RopeCache{m.constant("v4.rope." + key + ".cos", part(true)), m.constant("v4.rope." + key + ".sin", part(false))};
  });
  v.batch = &in;
  v.ones = m.constant("v4.ones", [&c] { return host_ones(c.v4.head_dim); });
  return v;
}

void v4_attn_project(const ModelConfig& c, const V4AttnTensors& w, const Tensor& x, const RopeCache& rc,
                     const Tensor& ones, V4AttnSaved& sv) {
  const Dims d = dims(c, x);
  const float eps = float(c.rms_norm_eps);
  const Tensor xr = x.view({d.N, d.D});
  sv.qa = act(d, {d.N, d.Rq});
  sv.rstd_qa = f32(d, {d.N});
  sv.qr = act(d, {d.N, d.Rq});
  linear_fwd(xr, w.wq_a, sv.qa);
  rmsnorm_fwd(sv.qa, w.q_norm, eps, sv.qr, sv.rstd_qa);
  sv.qb = act(d, {d.N, d.H * d.d});
  sv.rstd_q = f32(d, {d.N * d.H});
  sv.q = act(d, {d.N, d.H * d.d});
  linear_fwd(sv.qr, w.wq_b, sv.qb);
  rmsnorm_fwd(sv.qb.view({d.N * d.H, d.d}), ones, eps, sv.q.view({d.N * d.H, d.d}), sv.rstd_q);
  rope_last(sv.q, d.H, d.d, d.r, d.s, rc, false);
  sv.kvr = act(d, {d.N, d.d});
  sv.rstd_kv = f32(d, {d.N});
  sv.kv = act(d, {d.N, d.d});
  linear_fwd(xr, w.wkv, sv.kvr);
  rmsnorm_fwd(sv.kvr, w.norm, eps, sv.kv, sv.rstd_kv);
  rope_last(sv.kv, 1, d.d, d.r, d.s, rc, false);
}

void v4_attn_output(const ModelConfig& c, const V4AttnTensors& w, const Tensor& x, const RopeCache& rc,
                    V4AttnSaved& sv, const Tensor& y) {
  const Dims d = dims(c, x);
  const Tensor o = output_rows(d, sv.core, rc);
  const int64_t Hg = d.H * d.d / d.G;
  sv.ya = act(d, {d.N, d.G * d.Ro});
  matmul(groups(o, d, Hg), Trans::no, w.wo_a.view({d.G, d.Ro, Hg}), Trans::yes, groups(sv.ya, d, d.Ro));
  linear_fwd(sv.ya, w.wo_b, y);
}

void v4_entries_norm_rope(const ModelConfig& c, const V4CompressorTensors& w, const Tensor& pooled,
                          const RopeCache& rc, const Tensor& ent, const Tensor& rstd) {
  const int64_t n = pooled.size(0), width = pooled.size(1);
  rmsnorm_fwd(pooled, w.norm, float(c.rms_norm_eps), ent, rstd);
  rope_last(ent, 1, width, c.qk_rope_head_dim, n, rc, false);
}

void v4_index_queries(const ModelConfig& c, const V4AttnTensors& w, const Tensor& x, const Tensor& qr,
                      const RopeCache& rc, const Tensor& qI, const Tensor& wt) {
  const Dims d = dims(c, x);
  const int64_t nI = c.index_n_heads, dI = c.index_head_dim;
  linear_fwd(qr, w.iwq_b, qI);
  rope_last(qI, nI, dI, d.r, d.s, rc, false);
  linear_fwd(x.view({d.N, d.D}), w.iweights, wt);
  scale(wt, float(1.0 / std::sqrt(double(nI)) / std::sqrt(double(dI))), wt);
}

void v4_attention_fwd(const ModelConfig& c, int64_t L, const V4AttnTensors& w, const Tensor& x,
                      const DocLayout& layout, const V4Rows& rows, V4AttnSaved& sv, const Tensor& y) {
  const Dims d = dims(c, x);
  HMLA_CHECK(d.s == rows.sh.rows && layout.s == rows.sh.s, ShapeError, "V4 attention: x has ", d.s,
             " rows, this rank's shard of the layout's ", layout.s, " has ", rows.sh.rows);
  const V4Kind kind = c.v4.kind(L);  // an MTP layer's too (L >= num_hidden_layers)
  const RopeCache& rc = kind == V4Kind::sliding ? rows.main : rows.compress;
  sv.m = c.v4.compress_rate(L);
  sv.csa = kind == V4Kind::csa;
  sv.mode = c.mode(L);
  v4_attn_project(c, w, x, rc, rows.ones, sv);
  if (rows.sharded()) sv.kv_all = cp_all_gather_rows(*rows.cp, sv.kv.view({d.b, d.s, d.d}));
  if (sv.m > 0) {
    const V4BatchEntries t = entry_tables(rows, layout, sv.m, d.dev);
    sv.comp = compress_entries(c, d, w.comp, x, layout, t, sv.m, d.d, sv.csa, rows);
    if (sv.comp.e.n > 0) sv.ent_last = t.last, sv.ent_doc = t.doc;
    // DESIGN.md section 10: a CSA layer attends every visible entry (no indexer) but in dsa_sparse;
    // in the dsa modes its indexer runs (dsa_warmup: for the KL only).
    sv.indexer = c.runs_indexer(L) && sv.comp.e.n > 0;
    if (sv.indexer) index_forward(c, d, w, x, sv, layout, t, rows);
    if (sv.indexer && sv.mode == LayerMode::dsa_sparse)
      sv.idx = compressed_index_topk(index_inputs(c, d, sv, layout, rows), c.index_topk);
  }
  sv.core = act(d, {d.b, d.s, d.H, d.d});
  sv.lse = f32(d, {d.b, d.H, d.s});
  attn_compressed_fwd(core_inputs(c, d, w, sv, layout, rows), AttnCompressedSaved{sv.core, sv.lse});
  v4_attn_output(c, w, x, rc, sv, y);
}

namespace {

// The CSA indexer's KL (docs/csa_indexer_kl.md: dense over every visible entry in dsa_warmup, over
// the top-k in dsa_sparse) and its backward into the indexer's tensors only: qI = RoPE(qr wq_b^T)
// (qr detached), kI = the indexer compressor's entries of x (detached), w = x weights_proj^T scaled.
void indexer_backward(const ModelConfig& c, const Dims& d, const V4AttnTensors& w, const V4AttnTensors& g,
                      const Tensor& x, const DocLayout& layout, const V4Rows& rows, const V4AttnSaved& sv,
                      const V4BackwardOptions& opt) {
  const int64_t nI = c.index_n_heads, dI = c.index_head_dim;
  const RopeCache& rc = rows.compress;
  CompressedIndexKlInputs in;
  in.sc = index_inputs(c, d, sv, layout, rows);
  in.q = sv.q.view({d.b, d.s, d.H, d.d});
  in.ent = sv.comp.ent;
  in.lse = sv.lse;
  in.scale = float(1.0 / std::sqrt(double(d.d)));
  in.row_weight = opt.row_weight;
  in.coeff = float(c.indexer_loss_coeff);
  in.kl_acc = opt.kl_acc;
  const bool sparse = sv.mode == LayerMode::dsa_sparse;
  if (sparse) in.topk = sv.idx;
  const CompressedIndexKlResult r = sparse ? compressed_index_kl_sparse(in) : compressed_index_kl_dense(in);
  const Tensor dq = r.dqI.clone().view({d.N, nI * dI});
  rope_last(dq, nI, dI, d.r, d.s, rc, true);
  linear_bwd(dq, sv.qr, w.iwq_b, g.iwq_b, Tensor());
  compress_backward(d, w.icomp, g.icomp, x, layout, sv.icomp, true, r.dkI, Tensor(), rows);
  const Tensor dwI = r.dw.clone().view({d.N, nI});
  scale(dwI, float(1.0 / std::sqrt(double(nI)) / std::sqrt(double(dI))), dwI);
  linear_bwd(dwI, x.view({d.N, d.D}), w.iweights, g.iweights, Tensor());
}

}  // namespace

void v4_attention_bwd(const ModelConfig& c, const V4AttnTensors& w, const V4AttnTensors& g, const Tensor& x,
                      const DocLayout& layout, const V4Rows& rows, const V4AttnSaved& sv, const Tensor& dy,
                      const Tensor& dx, const V4BackwardOptions& opt) {
  const Dims d = dims(c, x);
  const RopeCache& rc = sv.m == 0 ? rows.main : rows.compress;
  if (sv.indexer && opt.row_weight.defined()) indexer_backward(c, d, w, g, x, layout, rows, sv, opt);
  if (!opt.backbone) return;
  const Tensor xr = x.view({d.N, d.D});
  const int64_t Hg = d.H * d.d / d.G;
  // The grouped output: dya = dy wo_b; per group dwo_a[g] += dya_g^T o_g, do_g = dya_g wo_a[g].
  Tensor dya = f32(d, {d.N, d.G * d.Ro}), dout = f32(d, {d.N, d.H * d.d});
  linear_bwd(dy, sv.ya, w.wo_b, g.wo_b, dya);
  const Tensor o = output_rows(d, sv.core, rc);
  matmul(groups(dya, d, d.Ro), Trans::yes, groups(o, d, Hg), Trans::no, g.wo_a.view({d.G, d.Ro, Hg}), 1.f, 1.f);
  matmul(groups(dya, d, d.Ro), Trans::no, w.wo_a.view({d.G, d.Ro, Hg}), Trans::no, groups(dout, d, Hg));
  rope_last(dout, d.H, d.d, d.r, d.s, rc, false);  // o = R^T core, so dcore = R do
  // The core reads and returns its compute dtype (bf16 on CUDA; on the CPU the tensors themselves).
  const AttnCompressedGrads cg = attn_compressed_bwd(core_inputs(c, d, w, sv, layout, rows),
                                                     AttnCompressedSaved{sv.core, sv.lse},
                                                     compute_operand(dout.view({d.b, d.s, d.H, d.d})), g.sink);
  // q: RoPE^T, the per-head norm, wq_b, q_norm, wq_a.
  const Tensor dq = converted(cg.dq, DType::f32).view({d.N, d.H * d.d});
  rope_last(dq, d.H, d.d, d.r, d.s, rc, true);
  Tensor dqb = f32(d, {d.N, d.H * d.d}), dones = Tensor::zeros({d.d}, DType::f32, d.dev);
  rmsnorm_bwd(dq.view({d.N * d.H, d.d}), sv.qb.view({d.N * d.H, d.d}), rows.ones, sv.rstd_q,
              dqb.view({d.N * d.H, d.d}), dones);
  Tensor dqr = f32(d, {d.N, d.Rq}), dqa = f32(d, {d.N, d.Rq});
  linear_bwd(dqb, sv.qr, w.wq_b, g.wq_b, dqr);
  rmsnorm_bwd(dqr, sv.qa, w.q_norm, sv.rstd_qa, dqa, g.q_norm);
  linear_bwd(dqa, xr, w.wq_a, g.wq_a, dx);
  // K = V (every row's gradient, this rank's rows' summed over the ranks): RoPE^T, norm, wkv.
  const Tensor dkv_all = converted(cg.dkv, DType::f32);
  const Tensor dkv = (rows.sharded() ? cp_reduce_scatter_rows(*rows.cp, dkv_all) : dkv_all).view({d.N, d.d});
  rope_last(dkv, 1, d.d, d.r, d.s, rc, true);
  Tensor dkvr = f32(d, {d.N, d.d});
  rmsnorm_bwd(dkv, sv.kvr, w.norm, sv.rstd_kv, dkvr, g.norm);
  linear_bwd(dkvr, xr, w.wkv, g.wkv, dx, 1.f);
  if (sv.comp.e.n > 0)
    compress_backward(d, w.comp, g.comp, x, layout, sv.comp, sv.csa, converted(cg.dent, DType::f32), dx, rows);
}

}  // namespace hmla
