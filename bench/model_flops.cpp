// The model FLOPs of one training step (train_bench.h's model_flops; docs/cuda.md, docs/bench.md):
// 6 x the non-embedding parameters a token uses x tokens, plus the attention cores and the
// indexers by the FlashAttention convention over the pairs the layout's documents allow. MLA
// models and DeepSeek-V4 stacks (window, compressed entries, hybrid_mla layers) alike.
#include <algorithm>

#include "train_bench.h"

namespace hmla::bench {

namespace {

// Pairs (t, j) with j in A(t), and with at most `cap` of them per row (the sparse selection).
double valid_pairs(const DocLayout& layout, int64_t cap) {
  const std::vector<int32_t> ds = layout.doc_start.to_vector<int32_t>();
  double n = 0;
  for (int64_t r = 0; r < layout.b; ++r)
    for (int64_t t = 0; t < layout.s; ++t) {
      const int64_t a = t - ds[r * layout.s + t] + 1;
      if (a > 0) n += double(cap > 0 ? std::min(a, cap) : a);
    }
  return n;
}

// Per query row at document position p = t - doc_start (padding rows have none): the window keys
// min(p + 1, W) and the visible entries of rate m, floor((p + 1) / m), at most cap (0: all).
double window_pairs(const DocLayout& layout, int64_t W) { return valid_pairs(layout, W); }
double entry_pairs(const DocLayout& layout, int64_t m, int64_t cap) {
  const std::vector<int32_t> ds = layout.doc_start.to_vector<int32_t>();
  double n = 0;
  for (int64_t r = 0; r < layout.b; ++r)
    for (int64_t t = 0; t < layout.s; ++t) {
      const int64_t a = t - ds[r * layout.s + t] + 1;
      if (a > 0) n += double(cap > 0 ? std::min(a / m, cap) : a / m);
    }
  return n;
}

// One MLA layer's attention core and indexer in `mode` (c: the layer's geometry).
double mla_layer_flops(const ModelConfig& c, LayerMode mode, const DocLayout& layout) {
  const double H = double(c.num_attention_heads), passes = mode == LayerMode::dsa_warmup ? 1.0 : 3.5;
  const double pairs = valid_pairs(layout, 0);
  double f = 0;
  if (mode == LayerMode::dsa_sparse) {
    const double Wa = double(c.kv_lora_rank + c.qk_rope_head_dim), sel = valid_pairs(layout, c.index_topk + c.index_window);
    f += passes * H * 2.0 * (Wa + double(c.kv_lora_rank)) * sel;
  } else if (mode == LayerMode::mqa_full_causal) {
    f += passes * H * 2.0 * double(2 * c.kv_lora_rank + c.qk_rope_head_dim) * pairs;
  } else {
    f += passes * H * 2.0 * double(c.qk_head_dim() + c.v_head_dim) * pairs;
  }
  if (is_dsa(mode)) {
    const double HIDI = double(c.index_n_heads * c.index_head_dim);
    const double cand = mode == LayerMode::dsa_sparse ? valid_pairs(layout, c.index_topk) : pairs;
    const double Dqk = mode == LayerMode::dsa_sparse ? double(c.kv_lora_rank + c.qk_rope_head_dim) : double(c.qk_head_dim());
    f += 2.0 * HIDI * pairs + (6.0 * HIDI + 2.0 * H * Dqk) * cand;
  }
  return f;
}

// One DeepSeek-V4 layer's attention core (one K = V head of head_dim: 2 (d + d) per pair and head)
// over its window and entries, and a CSA layer's indexer in the DSA modes: the top-k's scores
// (dsa_sparse: 2 HI DI per visible entry) and the KL (6 HI DI + 2 H d per candidate entry).
double v4_layer_flops(const ModelConfig& c, int64_t L, const DocLayout& layout) {
  const LayerMode mode = c.mode(L);
  if (c.v4.is_hybrid_mla(L)) return mla_layer_flops(hybrid_mla_config(c, L), mode, layout);
  const V4Config& v = c.v4;
  const double H = double(c.num_attention_heads), d = double(v.head_dim);
  const double passes = mode == LayerMode::dsa_warmup ? 1.0 : 3.5;
  const int64_t m = v.compress_rate(L);
  const bool csa = v.kind(L) == V4Kind::csa, selected = csa && mode == LayerMode::dsa_sparse;
  double pairs = window_pairs(layout, v.sliding_window);
  if (m > 0) pairs += entry_pairs(layout, m, selected ? c.index_topk : 0);
  double f = passes * H * 2.0 * (d + d) * pairs;
  if (csa && is_dsa(mode)) {
    const double HIDI = double(c.index_n_heads * c.index_head_dim);
    if (selected) f += 2.0 * HIDI * entry_pairs(layout, m, 0);
    f += (6.0 * HIDI + 2.0 * H * d) * entry_pairs(layout, m, selected ? c.index_topk : 0);
  }
  return f;
}

}  // namespace

double model_flops(const ModelConfig& c, LayerMode mode, const DocLayout& layout, int64_t params,
                   int64_t embedding_params, int64_t indexer_params) {
  const double tokens = double(layout.b * layout.s);
  // A V4 stack's MTP layers compute as layers num_hidden_layers + i when they are parameters.
  const int64_t layers = c.num_hidden_layers + (c.is_v4() && c.v4.mtp_params ? c.form.num_nextn_predict_layers : 0);
  double idle = 0;  // the routed experts a token does not use, per MoE layer
  for (int64_t l = 0; l < layers; ++l)
    if (c.is_moe_layer(std::min(l, c.num_hidden_layers - 1)))
      idle += double(c.moe.n_routed_experts - c.moe.num_experts_per_tok) * 3.0 * double(c.moe.moe_intermediate_size) *
              double(c.hidden_size);
  const bool warmup = mode == LayerMode::dsa_warmup;
  // A V4 CSA layer has its indexer in every mode (transformers' form); it runs in the DSA modes only.
  const double idx = c.is_v4() && !is_dsa(mode) ? 0.0 : double(indexer_params);
  const double backbone = double(params - embedding_params - indexer_params) - idle;
  double f = (warmup ? 2.0 : 6.0) * backbone * tokens + 6.0 * idx * tokens;
  for (int64_t l = 0; l < layers; ++l)
    f += c.is_v4() ? v4_layer_flops(c, l, layout) : l < c.num_hidden_layers ? mla_layer_flops(c, mode, layout) : 0.0;
  return f;
}

}  // namespace hmla::bench
