// Incremental decoding with a latent KV cache (`hmla generate`; docs/mla_layer.md, "Decoding"):
// per layer and cached position the shared key ka(j) = [c(j) ; rope(k_pe(j))] (Rkv + Dr), and for
// dsa_sparse layers the indexer key kI(j) (DI), so a new token costs one row of every projection
// plus attention over the cached keys instead of a forward over the whole sequence. Every mode
// attends in the absorbed latent MQA form (DESIGN.md section 4: the same scores as MHA, so the
// logits equal the full forward's up to f32 reassociation). CPU only.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "hmla/core/size_check.h"
#include "hmla/model/model.h"

namespace hmla {

// A DeepSeek-V4 compressor's decoding state (v4_decode.cpp; rate m, entry width w: head_dim for
// the attention's, index_head_dim for the CSA indexer's; C = 2 w for CSA, w for HCA).
struct V4CompressorCache {
  Tensor kv, gate;            // [m, C] f32: the current window's tokens' projections (wkv x, wgate x)
  Tensor prev_kv, prev_gate;  // CSA: [m, w] f32, the previous window's a-series (channels [0, w))
  Tensor entries;             // [capacity / m, w] f32: entry e (normed, roped at e m) at row e
};

// A DeepSeek-V4 layer's decoding state: O(sliding_window + capacity / m) rows, no mHC state.
struct V4LayerCache {
  Tensor window;            // [min(sliding_window, capacity), head_dim] f32: K = V of position p at row p % rows
  V4CompressorCache comp;   // CSA and HCA layers (else undefined)
  V4CompressorCache index;  // CSA layers: the indexer's own compressor (else undefined)
};

struct KvCache {
  int64_t capacity = 0;    // positions the cache holds at most
  int64_t len = 0;         // positions cached so far (the next token's position)
  std::vector<Tensor> ka;  // per layer [capacity, Rkv + Dr] f32
  std::vector<Tensor> kI;  // per layer [capacity, DI] f32, dsa_sparse layers only (else undefined)
  std::vector<V4LayerCache> v4;  // a deepseek_v4 model's, per layer (ka and kI then stay empty)
};

// What decoding up to `positions` positions keeps or builds at once, beyond the parameters: the
// cache, and one layer's temporaries over a chunk of `positions` rows (a prefill). Lower bounds.
void plan_decode(MemoryPlan& plan, const ModelConfig& c, const SizeFactor& positions);

// An empty cache for `capacity` positions (1 .. max_position_embeddings). ConfigError on a model
// that is not on the CPU.
KvCache kv_cache(const Model& m, int64_t capacity);

// Runs `ids` (one document, at positions cache.len, cache.len + 1, ...) through the model: a
// prefill when they are many, a decode step when one. Appends their keys to the cache and
// returns the logits of the last of them [vocab_size] f32. With `topk`, each layer's selection
// table of these rows ([n, K + W] i32; undefined for layers other than dsa_sparse; DeepSeek-V4:
// the CSA layers' [n, index_topk] entry indices, -1 pads). ShapeError when ids is empty or would
// overflow the cache.
Tensor decode_step(const Model& m, KvCache& cache, std::span<const int32_t> ids,
                   std::vector<Tensor>* topk = nullptr);

// DeepSeek-V4 models (v4_decode.cpp): what plan_decode, kv_cache and decode_step dispatch to for a
// deepseek_v4 config. A token at position t costs one row of every projection and, per layer,
// attention over its window and its visible entries (HCA: every entry made so far; CSA: the
// indexer's top-k over them), O(sliding_window + t / m); ids run one by one (the prefill too).
void plan_v4_decode(MemoryPlan& plan, const ModelConfig& c, const SizeFactor& positions);
KvCache v4_kv_cache(const Model& m, int64_t capacity);
Tensor v4_decode_step(const Model& m, KvCache& cache, std::span<const int32_t> ids, std::vector<Tensor>* topk);

}  // namespace hmla
