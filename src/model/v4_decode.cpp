// Incremental decoding of DeepSeek-V4 models (decode.h; docs/deepseek_v4_math.md sections 4-9): a
// token at position t runs one row through every projection (the forward's pieces, v4_internal.h)
// and attends, per layer, in one softmax with the sink over its window (the cached K = V rows
// max(0, t - W + 1) .. t) and its visible entries (w < (t + 1) / m: HCA every one made so far, CSA
// the indexer's top-k over its own entries), as the forward computes row t (v4_attention.cpp): the
// same sums in another order. A compressor keeps its window's projections; when the window ends
// at t its entry is pooled by the forward's op (compress_fwd over this window, after the previous
// window's a-series for CSA), normed and roped at its first position. mHC needs no cache: the
// streams are per token. Tokens run one at a time (the prompt too); CPU only, like the V4 model.
// hybrid_mla layers have no cache here yet: a model with one is refused (plan and cache alike).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "hmla/model/decode.h"
#include "hmla/model/mlp.h"
#include "hmla/model/v4_model.h"
#include "hmla/ops/attention.h"
#include "hmla/ops/compress.h"
#include "hmla/ops/indexer.h"
#include "hmla/ops/mhc.h"
#include "hmla/ops/nn.h"
#include "v4_internal.h"

namespace hmla {

namespace {

Tensor f32(const Shape& s) { return Tensor::empty(s, DType::f32); }

// The token being decoded: its id, its position t and the two RoPE tables' rows at t.
struct Token {
  int32_t id;
  int64_t t;
  RopeCache main, compress;
};

struct Decoder {
  const Model& m;
  const ModelConfig& c;
  V4Tensors w;
  RopeTables main, compress;  // the entries take rows at their own positions
};

// Appends the token's projections (x [1, D]) to the compressor's window; when the window ends at
// t, entry e = t / m: the window pooled (CSA: after the previous window's a-series, none before
// window 0), normed and roped at e m into row e.
void compressor_step(const Decoder& dc, const V4CompressorTensors& w, const Tensor& x, int64_t t, int64_t m,
                     bool overlap, V4CompressorCache& cc) {
  const int64_t width = cc.entries.size(1), C = cc.kv.size(1), j = t % m, e = t / m;
  linear_fwd(x, w.wkv, cc.kv.slice(0, j, j + 1));
  linear_fwd(x, w.wgate, cc.gate.slice(0, j, j + 1));
  if (j < m - 1) return;
  const bool prev = overlap && e > 0;
  const int64_t rows = prev ? 2 * m : m;
  Tensor kv = cc.kv, gate = cc.gate;
  if (prev) {  // rows [0, m): the previous window (only its a-series is read), [m, 2m): this one
    kv = Tensor::zeros({rows, C}, DType::f32);
    gate = Tensor::zeros({rows, C}, DType::f32);
    kv.slice(0, 0, m).slice(1, 0, width).copy_from(cc.prev_kv);
    gate.slice(0, 0, m).slice(1, 0, width).copy_from(cc.prev_gate);
    kv.slice(0, m, rows).copy_from(cc.kv);
    gate.slice(0, m, rows).copy_from(cc.gate);
  }
  const DocLayout one = layout_causal(1, rows);
  CompressedEntries entry;
  entry.first = Tensor::from_vector<int32_t>({1, 1}, {int32_t(rows - m)}), entry.n = 1;
  Tensor pooled = f32({1, 1, width}), rstd = f32({1});
  compress_fwd(kv.view({1, rows, C}), gate.view({1, rows, C}), w.ape, entry, one, overlap, pooled);
  v4_entries_norm_rope(dc.c, w, pooled.view({1, width}), rope_cache(dc.compress, 1, e * m),
                       cc.entries.slice(0, e, e + 1), rstd);
  if (overlap) {
    cc.prev_kv.copy_from(cc.kv.slice(1, 0, width));
    cc.prev_gate.copy_from(cc.gate.slice(1, 0, width));
  }
}

// Layer L attends the CSA indexer's top-k (dsa_sparse on a CSA layer), else every entry made
// (DESIGN.md section 10).
bool selects(const ModelConfig& c, int64_t L) {
  return c.v4.layer_types.at(size_t(L)) == V4Kind::csa && c.layer_modes.at(size_t(L)) == LayerMode::dsa_sparse;
}

// The CSA indexer's top-k [index_topk] i32 over the `made` entries of its cache (all visible to
// t): the MLA indexer's op, whose score is the same sum_h w_h relu(qI_h . kI), on one query row
// after the `made` key rows, no forced window.
Tensor select_entries(const Decoder& dc, const V4AttnTensors& w, const Tensor& x, const V4AttnSaved& sv,
                      const RopeCache& rc, const V4CompressorCache& ic, int64_t made) {
  const ModelConfig& c = dc.c;
  const int64_t nI = c.index_n_heads, dI = c.index_head_dim, K = c.index_topk;
  if (made == 0) return Tensor::from_vector<int32_t>({K}, std::vector<int32_t>(size_t(K), -1));
  const Tensor qI = f32({1, nI * dI}), wt = f32({1, nI});
  v4_index_queries(c, w, x, sv.qr, rc, qI, wt);
  const DocLayout keys = layout_causal(1, made);
  IndexerScores sc;
  sc.qI = qI.view({1, 1, nI, dI});
  sc.kI = ic.entries.slice(0, 0, made).view({1, made, dI});
  sc.w = wt.view({1, 1, nI});
  sc.layout = &keys;
  sc.q_row0 = made - 1;
  return indexer_topk(sc, K, 0).view({K});
}

// Layer L's attention block for the token (a [1, D], attn_norm's output): y [1, D]. sel receives a
// CSA layer's selection.
Tensor attention(const Decoder& dc, int64_t L, const Tensor& a, const Token& tk, V4LayerCache& lc, Tensor& sel) {
  const ModelConfig& c = dc.c;
  const V4AttnTensors& w = dc.w.layers[size_t(L)].attn;
  const V4Kind kind = c.v4.layer_types.at(size_t(L));
  const int64_t m = c.v4.compress_rate(L), H = c.num_attention_heads, d = c.v4.head_dim, D = c.hidden_size,
                t = tk.t, rows = lc.window.size(0);
  const RopeCache& rc = kind == V4Kind::sliding ? tk.main : tk.compress;
  const Tensor x = a.view({1, 1, D});
  V4AttnSaved sv;
  v4_attn_project(c, w, x, rc, host_ones(c.v4.head_dim).on(x.device()), sv);
  lc.window.slice(0, t % rows, t % rows + 1).copy_from(sv.kv);
  std::vector<int64_t> entries;  // the entries the token attends to
  if (m > 0) {
    const int64_t made = (t + 1) / m;  // entry e is visible iff e < (t + 1) / m: all made so far
    compressor_step(dc, w.comp, a, t, m, kind == V4Kind::csa, lc.comp);
    if (selects(c, L)) {
      compressor_step(dc, w.icomp, a, t, m, true, lc.index);
      sel = select_entries(dc, w, x, sv, rc, lc.index, made);
      for (int32_t e : sel.to_vector<int32_t>())
        if (e >= 0) entries.push_back(e);
    } else {
      for (int64_t e = 0; e < made; ++e) entries.push_back(e);
    }
  }
  // Keys = values: the window's rows by position, then the entries; the query is the last key row
  // of one causal document, so it sees them all.
  const int64_t nw = std::min(t + 1, c.v4.sliding_window), S = nw + int64_t(entries.size());
  Tensor keys = f32({S, d});
  float* k = keys.data<float>();
  for (int64_t i = 0; i < nw; ++i)
    std::memcpy(k + i * d, lc.window.data<float>() + ((t - nw + 1 + i) % rows) * d, size_t(d) * sizeof(float));
  for (size_t i = 0; i < entries.size(); ++i)
    std::memcpy(k + (nw + int64_t(i)) * d, lc.comp.entries.data<float>() + entries[i] * d, size_t(d) * sizeof(float));
  const DocLayout one = layout_causal(1, S);
  AttnDenseInputs in;
  in.q = sv.q.view({1, 1, H, d});
  in.k = keys.view({1, S, 1, d});
  in.v = in.k;
  in.layout = &one;
  in.sink = w.sink;
  in.scale = float(1.0 / std::sqrt(double(d)));
  in.q_row0 = S - 1;
  sv.core = attn_dense_fwd(in).out;
  Tensor y = f32({1, D});
  v4_attn_output(c, w, x, rc, sv, y);
  return y;
}

// An mHC block's entry on the streams X [1, n, D]: the mixers and the normed collapsed input.
struct Entry {
  Tensor post, comb, normed;
};
Entry block_entry(const ModelConfig& c, const MhcWeights& w, const Tensor& norm_w, const Tensor& X) {
  const int64_t n = c.v4.hc_mult, D = c.hidden_size;
  const float eps = float(c.rms_norm_eps);
  Entry e{f32({1, n}), f32({1, n, n}), f32({1, D})};
  Tensor xin = f32({1, D}), rstd = f32({1});
  mhc_pre_fwd(X, w, c.v4.hc_sinkhorn_iters, eps, float(c.v4.hc_eps), xin, e.post, e.comb,
              MhcSaved{f32({1}), f32({1, (2 + n) * n})});
  rmsnorm_fwd(xin, norm_w, eps, e.normed, rstd);
  return e;
}

// One layer on the token's streams X [1, n, D] (replaced by the layer's output).
void layer(const Decoder& dc, int64_t L, const Token& tk, Tensor& X, V4LayerCache& lc, Tensor& sel) {
  const ModelConfig& c = dc.c;
  const V4LayerTensors& lw = dc.w.layers[size_t(L)];
  const int64_t n = c.v4.hc_mult, D = c.hidden_size;
  const Entry ea = block_entry(c, lw.hc_attn, lw.attn_norm, X);
  const Tensor ya = attention(dc, L, ea.normed, tk, lc, sel);
  Tensor mid = f32({1, n, D});
  mhc_post_fwd(X, ya, ea.post, ea.comb, mid);
  const Entry ef = block_entry(c, lw.hc_ffn, lw.ffn_norm, mid);
  const std::unique_ptr<Mlp> mlp = make_mlp(c, L, lw.mlp);
  if (c.v4.hash.at(size_t(L))) mlp->fixed = hash_experts(dc.m, L, Tensor::from_vector<int32_t>({1}, {tk.id}));
  std::vector<Tensor> saved;  // the MoE's activations: temporaries here
  for (const ActField& f : mlp->fields())
    saved.push_back(Tensor::empty(f.width ? Shape{1, f.width} : Shape{1}, f.ids ? DType::i32 : DType::f32));
  Tensor yf = f32({1, D});
  mlp->forward(ef.normed, saved, yf);
  X = f32({1, n, D});
  mhc_post_fwd(mid, yf, ef.post, ef.comb, X);
}

V4CompressorCache compressor_cache(int64_t m, int64_t width, bool overlap, int64_t capacity) {
  const int64_t C = (overlap ? 2 : 1) * width;
  V4CompressorCache cc;
  cc.kv = Tensor::zeros({m, C}, DType::f32);
  cc.gate = Tensor::zeros({m, C}, DType::f32);
  if (overlap) {
    cc.prev_kv = Tensor::zeros({m, width}, DType::f32);
    cc.prev_gate = Tensor::zeros({m, width}, DType::f32);
  }
  cc.entries = Tensor::zeros({capacity / m, width}, DType::f32);
  return cc;
}

// Before anything is planned or allocated: no hybrid_mla layer (one line naming it).
void check_decodable(const ModelConfig& c) {
  for (int64_t L = 0; L < c.num_hidden_layers; ++L)
    HMLA_CHECK(!c.v4.is_hybrid_mla(L), ConfigError, "deepseek_v4: layer ", L, " is hybrid_mla, and decoding (hmla "
               "generate) has no KV cache for hybrid_mla layers in V4 stacks yet; hmla forward runs the model");
}

}  // namespace

void plan_v4_decode(MemoryPlan& plan, const ModelConfig& c, const SizeFactor& positions) {
  check_decodable(c);
  const int64_t f = sizeof(float), d = c.v4.head_dim, dI = c.index_head_dim, W = c.v4.sliding_window;
  plan.add("the V4 cache's sliding windows",
           {{"num_hidden_layers", c.num_hidden_layers}, {"sliding_window", std::min(W, positions.value)}, {"head_dim", d}},
           f);
  int64_t keys = W;  // a step's key rows at most: the window and the entries one layer attends to
  for (const V4Kind kind : {V4Kind::csa, V4Kind::hca}) {
    int64_t layers = 0, m = 0, dense = 0;  // dense: layers that attend every entry made
    for (int64_t L = 0; L < c.num_hidden_layers; ++L)
      if (c.v4.layer_types[size_t(L)] == kind) ++layers, m = c.v4.compress_rate(L), dense += !selects(c, L);
    if (layers == 0) continue;
    const bool csa = kind == V4Kind::csa;
    const std::string name = csa ? "CSA" : "HCA", rate = std::to_string(m);
    const SizeFactor count{name + " layers", layers}, made{"(" + positions.name + ") / " + rate, positions.value / m};
    // Per compressor: kv and gate of the window [m, C], CSA also the previous a-series [m, w].
    plan.add("the V4 cache's " + name + " compressor windows",
             {count, {"2 x compress rate " + rate, 2 * m}, {csa ? "3 head_dim" : "head_dim", (csa ? 3 : 1) * d}}, f);
    plan.add("the V4 cache's " + name + " entries", {count, made, {"head_dim", d}}, f);
    if (csa && dense < layers) {
      plan.add("the V4 cache's CSA indexer compressor windows",
               {count, {"2 x compress rate " + rate, 2 * m}, {"3 index_head_dim", 3 * dI}}, f);
      plan.add("the V4 cache's CSA indexer entries", {count, made, {"index_head_dim", dI}}, f);
    }
    keys = std::max(keys, W + (dense > 0 ? made.value : std::min(c.index_topk, made.value)));
  }
  plan.add("a decode step's attention keys", {{"sliding_window + attended entries", keys}, {"head_dim", d}}, f);
}

KvCache v4_kv_cache(const Model& m, int64_t capacity) {
  const ModelConfig& c = m.cfg;
  check_decodable(c);
  KvCache cache;
  cache.capacity = capacity;
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) {
    const V4Kind kind = c.v4.layer_types.at(size_t(L));
    const int64_t rate = c.v4.compress_rate(L);
    V4LayerCache lc;
    lc.window = Tensor::zeros({std::min(c.v4.sliding_window, capacity), c.v4.head_dim}, DType::f32);
    if (rate > 0) lc.comp = compressor_cache(rate, c.v4.head_dim, kind == V4Kind::csa, capacity);
    if (selects(c, L)) lc.index = compressor_cache(rate, c.index_head_dim, true, capacity);
    cache.v4.push_back(std::move(lc));
  }
  return cache;
}

Tensor v4_decode_step(const Model& m, KvCache& cache, std::span<const int32_t> ids, std::vector<Tensor>* topk) {
  const ModelConfig& c = m.cfg;
  const int64_t n = int64_t(ids.size()), D = c.hidden_size, hc = c.v4.hc_mult, r = c.qk_rope_head_dim,
                mp = c.max_position_embeddings;
  HMLA_CHECK(n >= 1, ShapeError, "decode_step: no tokens to run");
  HMLA_CHECK(n <= cache.capacity - cache.len, ShapeError, "decode_step: ", n, " more tokens after ", cache.len,
             " overflow the KV cache of ", cache.capacity, " positions");
  HMLA_CHECK(int64_t(cache.v4.size()) == c.num_hidden_layers, ShapeError, "decode_step: the cache has ",
             cache.v4.size(), " DeepSeek-V4 layers, the model ", c.num_hidden_layers, " (a cache from v4_kv_cache)");
  for (const int32_t id : ids)
    HMLA_CHECK(id >= 0 && id < c.vocab_size, ShapeError, "decode_step: token id ", id, " is outside the vocabulary [0, ",
               c.vocab_size, ")");
  const Decoder dc{m, c, v4_tensors(m.params, c), rope_tables(c.rope, r, mp), rope_tables(c.v4.compress_rope, r, mp)};
  if (topk) {
    topk->assign(size_t(c.num_hidden_layers), Tensor());
    for (int64_t L = 0; L < c.num_hidden_layers; ++L)
      if (selects(c, L)) (*topk)[size_t(L)] = Tensor::empty({n, c.index_topk}, DType::i32);
  }
  Tensor X;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = cache.len;
    const Token tk{ids[size_t(i)], t, rope_cache(dc.main, 1, t), rope_cache(dc.compress, 1, t)};
    Tensor e0 = f32({1, D});
    embedding_fwd(Tensor::from_vector<int32_t>({1, 1}, {tk.id}), dc.w.embed, e0);
    X = f32({1, hc, D});
    for (int64_t k = 0; k < hc; ++k) scale(e0, 1.f, X.select(1, k));
    for (int64_t L = 0; L < c.num_hidden_layers; ++L) {
      Tensor sel;
      layer(dc, L, tk, X, cache.v4[size_t(L)], sel);
      if (topk && sel.defined()) (*topk)[size_t(L)].slice(0, i, i + 1).copy_from(sel.view({1, c.index_topk}));
    }
    cache.len = t + 1;
  }
  // The head on the last token only.
  const float eps = float(c.rms_norm_eps);
  Tensor hh = f32({1, D}), normed = f32({1, D}), rstd = f32({1}), logits = f32({1, c.vocab_size});
  mhc_head_fwd(X, dc.w.hc_head, eps, float(c.v4.hc_eps), hh, MhcSaved{f32({1}), f32({1, hc})});
  rmsnorm_fwd(hh, dc.w.norm, eps, normed, rstd);
  linear_fwd(normed, dc.w.head, logits);
  return logits.view({c.vocab_size});
}

}  // namespace hmla
