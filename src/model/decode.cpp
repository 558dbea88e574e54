// Decoding with a latent KV cache, on ops (decode.h). A step over n new rows at positions
// [P, P + n) runs every projection on those rows only, appends their shared keys (and dsa_sparse
// layers' indexer keys) to the cache, and attends over the S = P + n cached keys as a row slice
// of the key rows (the ops' q_row0, the same mechanism context parallelism uses). Letters as in
// mla_layer.cpp: H heads, Dn/Dr nope/rope widths, Dv value width, Rq/Rkv LoRA ranks, DI the
// indexer key's width.
#include "hmla/model/decode.h"

#include "hmla/model/indexer.h"
#include "hmla/model/mlp.h"
#include "hmla/ops/nn.h"
#include "hmla/ops/sparse_attention.h"

namespace hmla {

namespace {

struct Step {
  const ModelConfig& c;
  int64_t n, P, S;      // new rows, cached rows before the step, key rows after it
  RopeCache rope;       // of positions [P, S)
  DocLayout keys;       // one causal document over the S key rows
};

Tensor f32(const Shape& s) { return Tensor::empty(s, DType::f32); }

// The mha/dsa_warmup forward expands per-head keys from c; decoding absorbs W_kb into the query
// instead (the latent MQA form), for every mode: the same scores, cost O(S (Rkv + Dr)) per head.
Tensor kv_heads(const Tensor& kv_b_proj, const ModelConfig& c, int64_t r0, int64_t r1) {
  return kv_b_proj.view({c.num_attention_heads, c.qk_nope_head_dim + c.v_head_dim, c.kv_lora_rank}).slice(1, r0, r1);
}

Tensor per_head(const Tensor& t, int64_t c0, int64_t c1) { return t.slice(2, c0, c1).transpose(0, 1); }

// q [n, H, Dn + Dr] with rope applied, and cq [n, Rq] (Rq > 0), as mla_forward computes them.
Tensor queries(const Step& st, const AttnTensors& w, const Tensor& x2, Tensor& cq) {
  const ModelConfig& c = st.c;
  const int64_t H = c.num_attention_heads, Dqk = c.qk_head_dim();
  Tensor q = f32({st.n, H, Dqk});
  const Tensor q2 = q.view({st.n, H * Dqk});
  if (c.q_lora_rank > 0) {
    Tensor qa = f32({st.n, c.q_lora_rank}), rstd = f32({st.n});
    cq = f32({st.n, c.q_lora_rank});
    linear_fwd(x2, w.q_a_proj, qa);
    rmsnorm_fwd(qa, w.q_a_layernorm, float(c.rms_norm_eps), cq, rstd);
    linear_fwd(cq, w.q_b_proj, q2);
  } else {
    linear_fwd(x2, w.q_proj, q2);
  }
  rope(q.view({1, st.n, H, Dqk}).slice(3, c.qk_nope_head_dim, Dqk), st.rope.cos, st.rope.sin, RopeLayout::interleaved,
       false);
  return q;
}

// Writes the new rows' shared key [c ; rope(k_pe)] into ka's rows [P, S).
void append_key(const Step& st, const AttnTensors& w, const Tensor& x2, const Tensor& ka) {
  const int64_t Rkv = st.c.kv_lora_rank, Wa = Rkv + st.c.qk_rope_head_dim;
  Tensor kva = f32({st.n, Wa}), rstd = f32({st.n});
  const Tensor rows = ka.slice(0, st.P, st.S);
  linear_fwd(x2, w.kv_a_proj_with_mqa, kva);
  rmsnorm_fwd(kva.slice(1, 0, Rkv), w.kv_a_layernorm, float(st.c.rms_norm_eps), rows.slice(1, 0, Rkv), rstd);
  rows.slice(1, Rkv, Wa).copy_from(kva.slice(1, Rkv, Wa));
  rope(rows.view({1, st.n, 1, Wa}).slice(3, Rkv, Wa), st.rope.cos, st.rope.sin, RopeLayout::interleaved, false);
}

// dsa_sparse: the new rows' indexer key goes into kI's rows [P, S); their selection is ranked
// over every cached key.
Tensor select_keys(const Step& st, const AttnTensors& w, const Tensor& x, const Tensor& cq, const Tensor& kI) {
  IndexerState ind;
  const DocLayout own = layout_causal(1, st.n);  // indexer_forward's rows are the new ones alone
  indexer_forward(st.c, w.indexer, x, cq, own, st.rope, ind);
  kI.slice(0, st.P, st.S).copy_from(ind.sc.kI.view({st.n, st.c.index_head_dim}));
  ind.sc.kI = kI.slice(0, 0, st.S).view({1, st.S, st.c.index_head_dim});
  ind.sc.layout = &st.keys;
  ind.sc.q_row0 = st.P;
  return indexer_topk(ind.sc, st.c.index_topk, st.c.index_window);
}

// The attention of layer L over the cache for x [1, n, hidden]: o_proj's output [1, n, hidden].
// tables[L] receives a dsa_sparse layer's selection; a "shared" layer (IndexShare) attends over
// its source layer's, which ran earlier in this step.
Tensor attention(const Step& st, const Model& m, int64_t L, const Tensor& x, KvCache& cache,
                 std::vector<Tensor>& tables) {
  const ModelConfig& c = st.c;
  const AttnTensors& w = m.w.layers[L].attn;
  const int64_t H = c.num_attention_heads, Dn = c.qk_nope_head_dim, Dv = c.v_head_dim, Rkv = c.kv_lora_rank,
                Wa = Rkv + c.qk_rope_head_dim;
  const Tensor x2 = x.view({st.n, c.hidden_size});
  Tensor cq;
  const Tensor q = queries(st, w, x2, cq);
  append_key(st, w, x2, cache.ka[L]);
  Tensor qabs = f32({st.n, H, Wa});  // qabs_h = [q_nope_h W_kb_h ; q_pe_h]
  matmul(per_head(q, 0, Dn), Trans::no, kv_heads(w.kv_b_proj, c, 0, Dn), Trans::no, per_head(qabs, 0, Rkv));
  qabs.slice(2, Rkv, Wa).copy_from(q.slice(2, Dn, Dn + c.qk_rope_head_dim));
  const Tensor keys = cache.ka[L].slice(0, 0, st.S);
  const float scale = float(softmax_scale(c));
  Tensor oa;  // [1, n, H, Rkv]
  if (c.layer_modes[L] == LayerMode::dsa_sparse) {
    AttnSparseInputs in;
    in.q = qabs.view({1, st.n, H, Wa});
    in.kv = keys.view({1, st.S, Wa});
    in.Dv = Rkv;
    in.idx = c.indexer_shared(L) ? tables.at(size_t(c.indexer_source(L))) : select_keys(st, w, x, cq, cache.kI[L]);
    in.idx_origin = TableOrigin::own;
    in.K = c.index_topk;
    if (c.attention_sink) in.sink = w.softmax_offset;
    in.scale = scale;
    oa = attn_sparse_fwd(in).out;
    tables[size_t(L)] = in.idx;
  } else {  // every other mode attends densely over the document's causal set
    AttnDenseInputs in;
    in.q = qabs.view({1, st.n, H, Wa});
    in.k = keys.view({1, st.S, 1, Wa});
    in.v = in.k.slice(3, 0, Rkv);  // the value is the latent: the key's first Rkv channels
    in.layout = &st.keys;
    if (c.attention_sink) in.sink = w.softmax_offset;
    in.scale = scale;
    in.q_row0 = st.P;
    oa = attn_dense_fwd(in).out;
  }
  Tensor o = f32({st.n, H, Dv});  // o_h = oa_h W_vb_h^T
  matmul(per_head(oa.view({st.n, H, Rkv}), 0, Rkv), Trans::no, kv_heads(w.kv_b_proj, c, Dn, Dn + Dv), Trans::yes,
         per_head(o, 0, Dv));
  Tensor y = f32({1, st.n, c.hidden_size});
  linear_fwd(o.view({st.n, H * Dv}), w.o_proj, y);
  return y;
}

// One decoder layer on h [1, n, hidden], in place: the model's forward without what a backward
// keeps.
void layer(const Step& st, const Model& m, int64_t L, Tensor& h, KvCache& cache, std::vector<Tensor>& tables) {
  const ModelConfig& c = st.c;
  const LayerTensors& lw = m.w.layers[L];
  const float eps = float(c.rms_norm_eps);
  const int64_t n = st.n, hid = c.hidden_size;
  Tensor a = f32({1, n, hid}), mid = f32({1, n, hid}), mn = f32({n, hid}), rstd = f32({n});
  rmsnorm_fwd(h, lw.input_layernorm, eps, a, rstd);
  add_rmsnorm_fwd(h, attention(st, m, L, a, cache, tables), lw.post_attention_layernorm, eps, mid, mn, rstd);
  const std::unique_ptr<Mlp> mlp = make_mlp(c, L, lw);
  std::vector<Tensor> saved;  // the MLP's activations: temporaries here
  for (const ActField& f : mlp->fields())  // each in its dtype (a MoE layer's chosen experts i32)
    saved.push_back(Tensor::empty(f.width ? Shape{n, f.width} : Shape{n}, field_dtype(f, DType::f32)));
  h = f32({1, n, hid});
  mlp->forward(mn, saved, h);
  add(h, mid, h);
}

}  // namespace

void plan_decode(MemoryPlan& plan, const ModelConfig& c, const SizeFactor& positions) {
  if (c.is_v4()) return plan_v4_decode(plan, c, positions);
  int64_t sparse = 0;
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) sparse += c.layer_modes[L] == LayerMode::dsa_sparse && !c.indexer_shared(L);
  const int64_t f = sizeof(float);
  plan.add("the KV cache's latent keys", {{"num_hidden_layers", c.num_hidden_layers}, positions,
                                          {"kv_lora_rank + qk_rope_head_dim", c.kv_lora_rank + c.qk_rope_head_dim}},
           f);
  plan.add("the KV cache's indexer keys", {{"dsa_sparse layers", sparse}, positions, {"index_head_dim", c.index_head_dim}},
           f);
  plan.add("a prefill's hidden states and MLP activations",
           {positions, {"4 hidden_size + 3 intermediate_size", 4 * c.hidden_size + 3 * c.intermediate_size}}, f);
  // One layer's attention temporaries at a time, all of them in the latent form.
  mla_memory_plan(plan, c, sparse > 0 ? LayerMode::dsa_sparse : LayerMode::mqa_full_causal, {"", 1}, {"", 1},
                  positions, DType::f32);  // decoding runs on the CPU (kv_cache)
}

KvCache kv_cache(const Model& m, int64_t capacity) {
  const ModelConfig& c = m.cfg;
  HMLA_CHECK(m.device() == Device::cpu, ConfigError, "decoding with a KV cache runs on the CPU only; the model is on ",
             device_name(m.device()));
  HMLA_CHECK(capacity >= 1 && capacity <= c.max_position_embeddings, ShapeError, "a KV cache of ", capacity,
             " positions: it must hold 1 to max_position_embeddings = ", c.max_position_embeddings);
  if (c.is_v4()) return v4_kv_cache(m, capacity);
  KvCache cache;
  cache.capacity = capacity;
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) {
    cache.ka.push_back(Tensor::zeros({capacity, c.kv_lora_rank + c.qk_rope_head_dim}, DType::f32));
    cache.kI.push_back(c.layer_modes[L] == LayerMode::dsa_sparse && !c.indexer_shared(L)
                           ? Tensor::zeros({capacity, c.index_head_dim}, DType::f32)
                           : Tensor());
  }
  return cache;
}

Tensor decode_step(const Model& m, KvCache& cache, std::span<const int32_t> ids, std::vector<Tensor>* topk) {
  const ModelConfig& c = m.cfg;
  if (c.is_v4()) return v4_decode_step(m, cache, ids, topk);
  const int64_t n = int64_t(ids.size()), P = cache.len;
  HMLA_CHECK(n >= 1, ShapeError, "decode_step: no tokens to run");
  HMLA_CHECK(n <= cache.capacity - P, ShapeError, "decode_step: ", n, " more tokens after ", P,
             " overflow the KV cache of ", cache.capacity, " positions");
  HMLA_CHECK(int64_t(cache.ka.size()) == c.num_hidden_layers, ShapeError, "decode_step: the cache has ",
             cache.ka.size(), " layers, the model ", c.num_hidden_layers);
  const Step st{c, n, P, P + n, rope_cache(c, n, P), layout_causal(1, P + n)};
  Tensor h = f32({1, n, c.hidden_size});
  embedding_fwd(Tensor::from_vector<int32_t>({1, n}, std::vector<int32_t>(ids.begin(), ids.end())), m.w.embed_tokens,
                h.view({n, c.hidden_size}));
  std::vector<Tensor> tables(size_t(c.num_hidden_layers));  // this step's selections, per layer
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) layer(st, m, L, h, cache, tables);
  if (topk) {
    topk->assign(c.num_hidden_layers, Tensor());
    for (int64_t L = 0; L < c.num_hidden_layers; ++L)
      if (tables[L].defined()) (*topk)[L] = tables[L].view({n, c.index_topk + c.index_window});
  }
  cache.len = st.S;
  // Only the last row's logits are asked for: the final norm and the head on that row alone.
  const Tensor last = h.view({n, c.hidden_size}).slice(0, n - 1, n);
  Tensor normed = f32({1, c.hidden_size}), rstd = f32({1}), logits = f32({1, c.vocab_size});
  rmsnorm_fwd(last, m.w.norm, float(c.rms_norm_eps), normed, rstd);
  linear_fwd(normed, m.w.lm_head, logits);
  return logits.view({c.vocab_size});
}

}  // namespace hmla
