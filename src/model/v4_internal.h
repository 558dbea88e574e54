// What the DeepSeek-V4 model's files share, private to src/model: the attention block as a
// forward/backward pair (v4_attention.cpp; a hybrid_mla layer's: v4_hybrid.cpp) and the saved state
// the model (v4_model.cpp) keeps for it, an mHC block's entry and backward and a block's typed views
// (v4_model.cpp and the MTP layers, v4_mtp.cpp). docs/deepseek_v4_math.md section 4 is the math,
// section 0 its surprises, section 14 the MTP layers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "hmla/core/layout.h"
#include "hmla/core/tensor.h"
#include "hmla/model/config.h"
#include "hmla/model/mla_layer.h"
#include "hmla/model/v4_model.h"
#include "hmla/ops/compress.h"
#include "hmla/ops/mhc.h"
#include "hmla/ops/nn.h"

namespace hmla {

// The two RoPE tables of a forward over s rows ([s, r / 2], attention factor folded in): main
// (sliding layers) and compress (layers with a compressor, their entries and indexer).
struct V4Ropes {
  RopeCache main, compress;
};
V4Ropes v4_ropes(const ModelConfig& c, int64_t s, Device dev);

// A compressor's pooled entries and what their backward reads: the projections kvc, gc
// [b, s, coff * w], the entries' list, the pooled rows before the norm [b, n, w] and their rstd
// [b * n], the entries after norm and RoPE [b, n, w], and the entries' RoPE tables [b * n, r / 2].
struct V4Compressed {
  Tensor kvc, gc;
  CompressedEntries e;
  Tensor pooled, rstd, ent;
  RopeCache rope;
};

// The attention block's saved state over N = b s rows (x is the block's input, attn_norm's output).
struct V4AttnSaved {
  int64_t m = 0;                  // the layer's compress rate (0: sliding)
  bool csa = false;               // a CSA layer: its compressor pools two overlapped series
  LayerMode mode = LayerMode::mha;  // the layer's mode (DESIGN.md section 10: CSA dense unless dsa_sparse)
  bool indexer = false;           // a CSA layer in a dsa mode: icomp, qI, wI hold its indexer's forward
  Tensor qa, rstd_qa, qr;         // [N, Rq], [N], [N, Rq]: q LoRA before and after q_norm
  Tensor qb, rstd_q, q;           // [N, H d], [N H], [N, H d]: before the per-head norm; normed and roped
  Tensor kvr, rstd_kv, kv;        // [N, d], [N], [N, d]
  V4Compressed comp;              // CSA / HCA
  Tensor ent_last, ent_doc;       // [b, n_e] i32 (attn_compressed's metadata)
  Tensor idx;                     // CSA in dsa_sparse: [b, s, index_topk] i32 (else undefined: dense)
  V4Compressed icomp;             // the indexer's compressor (its entries kI = icomp.ent)
  Tensor qI, wI;                  // [N, nI dI] roped, [N, nI] (scales folded in)
  Tensor core, lse;               // [b, s, H, d], [b, H, s]: the attention core's output
  Tensor o, ya;                   // [N, H d] after the inverse RoPE, [N, G Ro] the grouped projection
};

// The block's pieces, shared by the forward below and decoding (v4_decode.cpp), on x [b, s, D]
// (N = b s rows, each batch row at the s positions of rc [s, r / 2]):
// q (qa, rstd_qa, qr, qb, rstd_q, q) and K = V (kvr, rstd_kv, kv) of sv, normed and roped.
void v4_attn_project(const ModelConfig& c, const V4AttnTensors& w, const Tensor& x, const RopeCache& rc,
                     V4AttnSaved& sv);
// From sv.core [b, s, H, d]: sv.o (the inverse RoPE at the query's row), sv.ya and y [N, D].
void v4_attn_output(const ModelConfig& c, const V4AttnTensors& w, const Tensor& x, const RopeCache& rc,
                    V4AttnSaved& sv, const Tensor& y);
// Compressed entries from pooled rows [n, width]: ent [n, width] = RoPE(norm(pooled)) at the rows
// of rc [n, r / 2] (each entry's window's first position); rstd [n].
void v4_entries_norm_rope(const ModelConfig& c, const V4CompressorTensors& w, const Tensor& pooled,
                          const RopeCache& rc, const Tensor& ent, const Tensor& rstd);
// The CSA indexer's queries qI [N, nI dI] (from qr = sv.qr, roped) and head weights wt [N, nI]
// (weights_proj(x), both scales folded in), written.
void v4_index_queries(const ModelConfig& c, const V4AttnTensors& w, const Tensor& x, const Tensor& qr,
                      const RopeCache& rc, const Tensor& qI, const Tensor& wt);

// y [N, D] = the attention block of x [b, s, D] (layer L, weights w), sv filled.
void v4_attention_fwd(const ModelConfig& c, int64_t L, const V4AttnTensors& w, const Tensor& x,
                      const DocLayout& layout, const V4Ropes& ropes, V4AttnSaved& sv, const Tensor& y);
// What a backward does besides the LM loss's chain (the MLA layer's MlaBackwardOptions).
struct V4BackwardOptions {
  bool backbone = true;  // false (dsa_warmup): only the indexer's KL and its backward; dx is not written
  Tensor row_weight;     // [b, s] f32 mask / valid_rows: given, a CSA layer in a dsa mode trains its indexer
  Tensor kl_acc;         // f64 [1]: the layer's sum_t rw kl(t) ADDED (without coeff)
};
// dx [N, D] written from dy [N, D] (with the backbone); every weight's gradient added into g. The
// indexer gets no gradient from the LM loss (docs/deepseek_v4_math.md section 0, item 7): only from
// its KL (docs/csa_indexer_kl.md), dense in dsa_warmup, over the top-k in dsa_sparse.
void v4_attention_bwd(const ModelConfig& c, const V4AttnTensors& w, const V4AttnTensors& g, const Tensor& x,
                      const DocLayout& layout, const V4Ropes& ropes, const V4AttnSaved& sv, const Tensor& dy,
                      const Tensor& dx, const V4BackwardOptions& opt = {});

// A hybrid_mla layer's attention state: the config it runs with (hybrid_mla_config(c, layer)) and
// the MLA layer's saved tensors (mla_layer.h), the indexer's and its selection included in dsa modes.
struct V4HybridSaved {
  ModelConfig cfg;
  int64_t layer = 0;
  MlaSaved mla;
};
// y [N, D] = hybrid_mla layer L's attention of x [b, s, D] (attn_norm's output; w: its self_attn.*
// tensors; an MTP layer's too, L = num_hidden_layers + i), as an MLA layer in c.mode(L); sv filled.
void v4_hybrid_fwd(const ModelConfig& c, int64_t L, const AttnTensors& w, const Tensor& x, const DocLayout& layout,
                   V4HybridSaved& sv, const Tensor& y);

struct V4HybridBackward {
  bool backbone = true;  // false: only the indexer's backward (its KL), dy and dx unused (train_indexer_only)
  Tensor row_weight;     // [b, s] the indexer KL's loss-row weights (needed where the layer runs its indexer)
  Tensor kl_acc;         // optional f64 [1] on the device: the KL sum is added into it
};
// The backward of v4_hybrid_fwd: with the backbone dx [N, D] written from dy [N, D]; every weight
// gradient ADDED into g (views of the gradient arena in the same names), the indexer's from its KL
// only. Returns the layer's KL sum (sum_t rw kl, without coeff) where it runs an indexer: NaN when
// kl_acc took it; 0 elsewhere.
double v4_hybrid_bwd(const V4HybridSaved& sv, const AttnTensors& w, const AttnTensors& g, const Tensor& x,
                     const DocLayout& layout, const Tensor& dy, const Tensor& dx, const V4HybridBackward& opt);

// One mHC block's mixers and collapsed input (the attention's or the MoE's half of a layer), views
// the caller keeps: the entry's saved rstd and z, the collapsed input xin [N, D], post [N, n], comb
// [N, n, n], the norm's output nx [N, D] and rstd [N].
struct V4Block {
  MhcSaved& hc;
  Tensor &xin, &post, &comb, &nx, &rstd;
};

// The block's entry on the streams x [N, n, D]: mhc_pre, then the sublayer's RMSNorm (weight norm_w).
inline void v4_block_entry(const ModelConfig& c, const MhcWeights& w, const Tensor& norm_w, const Tensor& x, V4Block b) {
  const int64_t N = x.size(0), n = c.v4.hc_mult, D = c.hidden_size;
  const Device dev = x.device();
  auto f32 = [dev](const Shape& sh) { return Tensor::empty(sh, DType::f32, dev); };
  b.hc = {f32({N}), f32({N, (2 + n) * n})};
  b.xin = f32({N, D});
  b.post = f32({N, n});
  b.comb = f32({N, n, n});
  b.nx = f32({N, D});
  b.rstd = f32({N});
  const float eps = float(c.rms_norm_eps);
  mhc_pre_fwd(x, w, c.v4.hc_sinkhorn_iters, eps, float(c.v4.hc_eps), b.xin, b.post, b.comb, b.hc);
  rmsnorm_fwd(b.xin, norm_w, eps, b.nx, b.rstd);
}

// The block's backward from dout (the gradient reaching its output streams) and the sublayer's
// backward `sub` (dy -> dnx): the gradient reaching its input streams x (y: the sublayer's output).
template <class Sub>
Tensor v4_block_backward(const ModelConfig& c, const MhcWeights& w, const MhcWeights& g, const Tensor& norm_w,
                         const Tensor& dnorm_w, const Tensor& x, const Tensor& y, const V4Block& b, const Tensor& dout,
                         Sub sub) {
  const int64_t N = x.size(0), n = c.v4.hc_mult, D = c.hidden_size;
  const Device dev = x.device();
  auto f32 = [dev](const Shape& sh) { return Tensor::empty(sh, DType::f32, dev); };
  Tensor dx = f32({N, n, D}), dy = f32({N, D}), dpost = f32({N, n}), dcomb = f32({N, n, n});
  mhc_post_bwd(dout, x, y, b.post, b.comb, dx, dy, dpost, dcomb);
  Tensor dnx = f32({N, D}), dxin = f32({N, D}), dx2 = f32({N, n, D});
  sub(dy, dnx);
  rmsnorm_bwd(dnx, b.xin, norm_w, b.rstd, dxin, dnorm_w);
  mhc_pre_bwd(dxin, dpost, dcomb, x, w, b.hc, c.v4.hc_sinkhorn_iters, float(c.v4.hc_eps), dx2, g);
  add(dx.view({N, n * D}), dx2.view({N, n * D}), dx.view({N, n * D}));
  return dx;
}

// Typed views of layer L's block tensors under `pre` (model.layers.{L}. or mtp.{i}.; weights or their
// gradients), its attention's kv norm named attn.<kv_norm> (v4_tables.cpp).
V4LayerTensors v4_block_tensors(const io::TensorMap& t, const ModelConfig& c, int64_t L, const std::string& pre,
                                const std::string& kv_norm = "norm.weight");

// A hash_moe layer L's experts for token ids (any shape, i32): tid2eid's rows, [ids.numel(), k] i32
// (v4_model.cpp).
Tensor hash_experts(const Model& m, int64_t L, const Tensor& ids);

// The multi-token-prediction layers (v4_mtp.cpp; docs/deepseek_v4_math.md section 14) in a step
// with opt.mtp_coeff > 0, on the stack's last streams x_final [N, n, D] of the forward whose RoPE
// tables are `ropes`: their loss coeff / D sum_k CE_k goes into the backward: every mtp.{i}.*
// tensor's gradient and the shared embedding's and head's (views g of `grads`) are added into,
// the streams' gradient ADDED into dx [N, n, D]; the hybrid_mla MTP layers that run their indexer
// (v4_mtp_kl_layers) add their KL sum into kl_acc (f64 [1]) and their indexer's gradient. Returns the
// mean over the depths of their CE means (without coeff), also added into opt.mtp_loss when it is
// given. Without opt.backbone (dsa_warmup): the depths' forwards and those indexers' KL backward
// only; dx, the loss and every other gradient untouched; returns 0.
double v4_mtp_step(const Model& m, const DeviceBatch& in, const StepOptions& opt, const V4Ropes& ropes,
                   const Tensor& x_final, const V4Tensors& w, const V4Tensors& g, io::TensorMap& grads, const Tensor& dx,
                   const Tensor& kl_acc);

}  // namespace hmla
