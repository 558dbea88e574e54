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
#include "hmla/dist/cp.h"
#include "hmla/model/config.h"
#include "hmla/model/mla_layer.h"
#include "hmla/model/v4_model.h"
#include "hmla/ops/compress.h"
#include "hmla/ops/compressed_attention.h"
#include "hmla/ops/backend.h"
#include "hmla/ops/mhc.h"
#include "hmla/ops/nn.h"
#include "model_internal.h"

namespace hmla {

// What every layer of one V4 forward shares: this rank's rows of the layout (context parallelism,
// DESIGN.md section 8: rows [sh.row0, sh.row0 + sh.rows) of sh.s; one rank: all of them) with its
// context-parallel group, and the RoPE tables ([rows, r / 2], attention factor folded in) of those
// rows: main (sliding layers) and compress (layers with a compressor and their indexer), and the
// compress table of every row (the entries', at each window's first position).
// The micro-batch's V4 tables (batch: each compress rate's entries, uploaded with the batch; null:
// a layer makes its rate's on the host and uploads them) and the per-head q norm's weight (ones
// [head_dim]) go with them.
struct V4Rows {
  RopeCache main, compress, compress_all;
  RopeCache hybrid;  // the hybrid_mla layers' (their MLA config's RoPE), where the stack has some
  RowShard sh;
  Comm* cp = nullptr;
  const DeviceBatch* batch = nullptr;
  Tensor ones;
  bool sharded() const { return cp->size() > 1; }
};
// What the V4 layers compute with: the compute views where the device has them (Model::compute_params).
inline const io::TensorMap& v4_compute_views(const Model& m) {
  return m.compute_params.empty() ? m.params : m.compute_params;
}
// n ones, f32, on the host.
inline Tensor host_ones(int64_t n) { return Tensor::from_vector<float>({n}, std::vector<float>(size_t(n), 1.f)); }
// For a step's micro-batch `in`: the tables from the model's constants (uploaded once), in's entries.
V4Rows v4_rows(const Model& m, const DeviceBatch& in, Comm& cp);
// For s rows on dev without a batch (tests, tools): the tables made and uploaded here.
V4Rows v4_rows(const ModelConfig& c, int64_t s, Device dev, Comm& cp);

// Rank r's compressed entries under context parallelism (v4_cp.cpp): the entries whose window ends
// in r's rows, per batch row a contiguous range [lo, lo + n) of the entry list, rank-major
// [R * b]; P = the most any (rank, batch row) owns.
struct EntryOwners {
  std::vector<int64_t> lo, n;
  int64_t b = 0, P = 0;
};

// A compressor's pooled entries and what their backward reads: the projections kvc, gc
// [b, s, coff * w], the entries' list, the pooled rows before the norm [b, n, w] and their rstd
// [b * n], the entries after norm and RoPE [b, n, w], and the entries' RoPE tables [b * n, r / 2].
// Context parallelism (v4_cp.cpp): kvc, gc hold the frame (the rank's rows after the `halo` rows
// before them, from f0), pooled, rstd and rope this rank's owned entries (`own`, firsts in the
// frame's rows, P per batch row), ent every entry (gathered).
struct V4Compressed {
  Tensor kvc, gc;
  CompressedEntries e;
  Tensor pooled, rstd, ent;
  RopeCache rope;
  int64_t halo = 0, f0 = 0;
  EntryOwners owners;
  CompressedEntries own;
  DocLayout frame;
};

// Context parallelism's exchanges for the V4 attention (v4_cp.cpp; docs/deepseek_v4.md "Context
// parallelism"). A compressor of rate m reads up to `halo` rows (m - 1; CSA 2m - 1) before an
// entry's last row: each rank pools the entries whose window ends in its rows from a frame of its
// rows and the halo rows before them, then the entries are all-gathered (their width is the
// narrowest form a key has); the backward reduce-scatters the entries' gradients to their owners and
// returns the halo rows' gradients to theirs.
EntryOwners entry_owners(const CompressedEntries& e, int64_t m, const RowShard& sh, int R);
// The frame of local [b, rows, C]: rows [f0, row0 + rows), f0 = max(0, row0 - halo).
Tensor cp_frame(Comm& cp, const RowShard& sh, const Tensor& local, int64_t halo);
// The frame's gradient [b, nf, C] -> this rank's rows' [b, rows, C]: its own rows plus the halo
// rows of later ranks' frames that are its rows, in rank order.
Tensor cp_frame_grad(Comm& cp, const RowShard& sh, const Tensor& dframe, int64_t halo);
// The frame's layout: rows [f0, f0 + nf) of `layout`, documents that start before f0 starting at it.
DocLayout frame_layout(const DocLayout& layout, int64_t f0, int64_t nf);
// This rank's owned entries' first rows [b, P] (-1 pads), minus `shift` (the frame's f0, or 0).
CompressedEntries own_entries(const CompressedEntries& e, const EntryOwners& o, int rank, int64_t shift);
// Owned entries [b, P, W] of every rank -> every entry [b, n, W].
Tensor cp_gather_entries(Comm& cp, const EntryOwners& o, const Tensor& own, int64_t n);
// Every entry's gradient [b, n, W] (this rank's share) -> this rank's owned ones [b, P, W], summed
// over the ranks.
Tensor cp_scatter_entry_grads(Comm& cp, const EntryOwners& o, const Tensor& dent);

// The attention block's saved state over N = b s rows (x is the block's input, attn_norm's output);
// activations in the compute dtype (v4_act), rstd and lse f32.
struct V4AttnSaved {
  int64_t m = 0;                  // the layer's compress rate (0: sliding)
  bool csa = false;               // a CSA layer: its compressor pools two overlapped series
  LayerMode mode = LayerMode::mha;  // the layer's mode (DESIGN.md section 10: CSA dense unless dsa_sparse)
  bool indexer = false;           // a CSA layer in a dsa mode: icomp, qI, wI hold its indexer's forward
  Tensor qa, rstd_qa, qr;         // [N, Rq], [N], [N, Rq]: q LoRA before and after q_norm
  Tensor qb, rstd_q, q;           // [N, H d], [N H], [N, H d]: before the per-head norm; normed and roped
  Tensor kvr, rstd_kv, kv;        // [N, d], [N], [N, d]
  Tensor kv_all;                  // context parallelism: every row's kv [b, S, d] (gathered)
  V4Compressed comp;              // CSA / HCA
  Tensor ent_last, ent_doc;       // [b, n_e] i32 (attn_compressed's metadata)
  Tensor idx;                     // CSA in dsa_sparse: [b, s, index_topk] i32 (else undefined: dense)
  V4Compressed icomp;             // the indexer's compressor (its entries kI = icomp.ent)
  Tensor qI, wI;                  // [N, nI dI] roped, [N, nI] (scales folded in)
  Tensor core, lse;               // [b, s, H, d], [b, H, s]: the attention core's output
  Tensor ya;                      // [N, G Ro] the grouped projection's first product (o = RoPE^T(core),
                                  // [N, H d], is not kept: the backward makes it again from core)
};

// The block's pieces, shared by the forward below and decoding (v4_decode.cpp), on x [b, s, D]
// (N = b s rows, each batch row at the s positions of rc [s, r / 2]):
// q (qa, rstd_qa, qr, qb, rstd_q, q) and K = V (kvr, rstd_kv, kv) of sv, normed and roped (ones:
// [head_dim] of ones on x's device, the per-head norm's weight).
void v4_attn_project(const ModelConfig& c, const V4AttnTensors& w, const Tensor& x, const RopeCache& rc,
                     const Tensor& ones, V4AttnSaved& sv);
// From sv.core [b, s, H, d]: o (the inverse RoPE at the query's row), sv.ya and y [N, D].
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
                      const DocLayout& layout, const V4Rows& rows, V4AttnSaved& sv, const Tensor& y);
// The attention core's inputs (attn_compressed) of the layer whose forward filled sv on x [b, s, D]:
// what its forward and backward hand the core.
AttnCompressedInputs v4_core_inputs(const ModelConfig& c, const V4AttnTensors& w, const Tensor& x,
                                    const V4AttnSaved& sv, const DocLayout& layout, const V4Rows& rows);
// The layer's attention mass (v4_mass.cpp; docs/v4_attention.md "Attention mass") from its forward's
// state sv on x [b, s, D]: over the rows with row_weight [b, s] > 0 and every head, the sums of the
// probability on the window keys, the compressed entries (those it attends) and the sink, and the
// count of (row, head) pairs, ADDED into acc (f64 [4] on the model's device).
void v4_attn_mass(const ModelConfig& c, const V4AttnTensors& w, const Tensor& x, const DocLayout& layout,
                  const V4Rows& rows, const V4AttnSaved& sv, const Tensor& row_weight, const Tensor& acc);

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
                      const DocLayout& layout, const V4Rows& rows, const V4AttnSaved& sv, const Tensor& dy,
                      const Tensor& dx, const V4BackwardOptions& opt = {});

// A hybrid_mla layer's attention state: the config it runs with (hybrid_mla_config(c, layer)) and
// the MLA layer's saved tensors (mla_layer.h), the indexer's and its selection included in dsa modes.
struct V4HybridSaved {
  ModelConfig cfg;
  int64_t layer = 0;
  MlaSaved mla;
};
// y [N, D] = hybrid_mla layer L's attention of x [b, s, D] (attn_norm's output; w: its self_attn.*
// tensors; an MTP layer's too, L = num_hidden_layers + i), as an MLA layer in c.mode(L); sv filled. cp:
// the context-parallel group (x: this rank's rows of the layout's, mla_forward's convention).
// rope: the MLA layer's RoPE tables of x's rows on its device (V4Rows::hybrid; undefined: made here).
void v4_hybrid_fwd(const ModelConfig& c, int64_t L, const AttnTensors& w, const Tensor& x, const DocLayout& layout,
                   V4HybridSaved& sv, const Tensor& y, Comm& cp = Comm::self(), const RopeCache& rope = {});

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
                     const DocLayout& layout, const Tensor& dy, const Tensor& dx, const V4HybridBackward& opt,
                     Comm& cp = Comm::self());

// Precision (DESIGN.md section 7): what a V4 layer keeps between ops is in its device's compute
// dtype (f32 on the CPU, bf16 on CUDA); the mHC streams, their mixers, the sublayers' outputs that
// mhc_post reads, the compressors' pooling, statistics (rstd, lse) and every gradient stay f32.
inline Tensor v4_act(Device dev, const Shape& sh) { return Tensor::empty(sh, compute_dtype(dev), dev); }

// One mHC block's mixers and collapsed input (the attention's or the MoE's half of a layer), views
// the caller keeps: the entry's saved rstd and z, the collapsed input xin [N, D], post [N, n], comb
// [N, n, n], the norm's output nx [N, D] (the sublayer's input, compute dtype) and rstd [N].
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
  b.nx = v4_act(dev, {N, D});
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
// the streams' gradient ADDED into dx [N, n, D]; the MTP layers that run their indexer
// (v4_mtp_kl_layers) add their KL sum into kl_acc (hybrid_mla) or kl_acc_csa (CSA; f64 [1] each)
// and their indexer's gradient. Returns the
// mean over the depths of their CE means (without coeff); with opt.stats, NaN: it is added into
// kStatMtp on the device. Without opt.backbone (dsa_warmup): the depths' forwards and those indexers' KL backward
// only; dx, the loss and every other gradient untouched; returns 0.
double v4_mtp_step(const Model& m, const DeviceBatch& in, const StepOptions& opt, const V4Rows& ropes,
                   const Tensor& x_final, const V4Tensors& w, const V4Tensors& g, io::TensorMap& grads, const Tensor& dx,
                   const Tensor& kl_acc, const Tensor& kl_acc_csa);

}  // namespace hmla
