// One MLA attention layer, forward and backward, from the attention input x (the output of
// input_layernorm) to o_proj's output (DESIGN.md sections 2 to 6), in the layer's mode: mha and
// dsa_warmup run per-head K/V through kv_b_proj and a dense MHA core (dsa_warmup adds the indexer
// and its dense KL); mqa_full_causal runs absorbed latent MQA, dense over the per-document causal
// set; dsa_sparse runs absorbed latent MQA over the indexer's selection with the sparse KL. Which
// core runs is latent_mqa_enabled(config, layer); every step is an op of hmla/ops.
#pragma once
#include <string>
#include <vector>

#include "hmla/core/layout.h"
#include "hmla/core/size_check.h"
#include "hmla/dist/comm.h"
#include "hmla/io/safetensors.h"
#include "hmla/model/config.h"
#include "hmla/model/indexer.h"
#include "hmla/model/params.h"
#include "hmla/ops/attention.h"

namespace hmla {

// The attention's own tensors, in checkpoint form (kv_b_proj) or split (k_b_proj/v_b_proj) form;
// with `indexer`, followed by the five indexer tensors (indexer_param_table).
std::vector<ParamSpec> mla_param_table(const ModelConfig& c, bool split_kv_b_proj, bool indexer = false);

// kv_b_proj [H(Dn+Dv), Rkv] <-> k_b_proj [H, Rkv, Dn] + v_b_proj [H, Dv, Rkv]; bit-exact copies
// (new tensors; the other form's fields are cleared).
void split_kv_b_proj(AttnTensors& w, const ModelConfig& c);
void fold_kv_b_proj(AttnTensors& w, const ModelConfig& c);

// Checks that `w` holds exactly the table's tensors with their shapes (clear error otherwise).
void check_mla_weights(const io::TensorMap& w, const ModelConfig& c, bool split_kv_b_proj, bool indexer,
                       const std::string& what);

struct MlaLayer {
  const ModelConfig* cfg = nullptr;
  int64_t layer = 0;
  bool split_kv_b_proj = false;  // w holds k_b_proj/v_b_proj instead of kv_b_proj
  AttnTensors w;                 // the layer's tensors (hmla/model/params.h)
  AttnBackend attn_backend = AttnBackend::auto_;  // the dense attention's on CUDA (hmla/ops/attention.h)
  LayerMode mode() const { return cfg->layer_modes[layer]; }
  bool latent() const { return latent_mqa_enabled(*cfg, layer); }
};

// What the backward needs, named (STYLE.md: no hidden tape). N = b * s rows of this rank's
// queries; NS = b * S key rows (S = s without context parallelism).
struct MlaSaved {
  RopeCache rope;          // this rank's rows' RoPE tables: set by the caller to share one per
                           // forward (the model does), else computed by mla_forward
  Tensor qa, rstd_q, cq;   // q latent before/after RMSNorm [N, Rq], rstd [N] (Rq > 0)
  Tensor q;                // [N, H, Dn + Dr], rope applied
  Tensor kva, rstd_kv;     // kv_a output [N, Rkv + Dr], rstd [N]
  Tensor ka;               // [NS, 1, Rkv + Dr] the shared key [c ; rope(k_pe)] of every key row
  Tensor k, v;             // mha: [NS, H, Dn + Dr], [NS, H, Dn + Dv] (v: a view of its Dv part)
  Tensor qabs;             // mqa: [N, H, Rkv + Dr]
  AttnDenseSaved att;      // core output [b, s, H, Dv or Rkv] and lse (dense or sparse core)
  Tensor lse_c;            // dsa_sparse: [b, H, s] logsumexp over S(t) only (the KL's lseC)
  Tensor o;                // [N, H, Dv] input of o_proj
  IndexerState ind;        // dsa modes, layers with their own indexer
  Tensor topk;             // dsa modes: [b, s, K + W] i32 selection table (global key positions);
                           // a "shared" layer (IndexShare) in dsa_sparse: its source layer's, set
                           // by the caller before mla_forward
  bool in_arena = false;   // the slots of mla_fields hold the activation arena's views (the model
                           // sets them); else each forward allocates them afresh
};

// One tensor the attention keeps from its forward for its backward, as the activation arena
// holds it (STYLE.md: one table is the only place the order of saved tensors is written). core:
// the attention core's output and statistics, which activation recomputation drops after the
// forward and rebuilds (then not in the arena). slot: where MlaSaved holds it.
struct MlaField {
  std::string name;
  Shape shape;
  DType dtype;
  bool core = false;
  Tensor& (*slot)(MlaSaved&) = nullptr;
};
// Layer L's saved tensors, in arena order, for b x s query rows over S key rows (S = s without
// context parallelism) with the compute dtype `compute` (f32 on the CPU, bf16 on CUDA: the
// statistics and the indexer's head weights stay f32, the table i32); recompute: without the core.
// Depends on the layer's mode (c.layer_modes[L]) and whether it runs its own indexer. mla_forward
// writes into the slots the caller set (views of the arena), and allocates the others itself.
std::vector<MlaField> mla_fields(const ModelConfig& c, int64_t L, int64_t b, int64_t s, int64_t S, DType compute,
                                 bool recompute);

struct MlaBackwardOptions {
  Tensor row_weight;     // [b, s] loss-row weights of this rank's rows for the indexer's KL
  Tensor kl_acc;         // optional f64 [1] on the device: the KL sum is added into it (IndexerKlInputs)
  bool backbone = true;  // false: skip the backbone's backward (train_indexer_only)
  AttnTensors grads;     // optional: the layer's tensors' gradients (e.g. views of a
                         // gradient arena) to ADD the weight gradients into (hmla/ops/nn.h)
};

struct MlaGrads {
  Tensor dx;               // [b, s, hidden]; undefined without the backbone's backward
  AttnTensors dweights;    // the gradients of the weights the call reached (indexer.* only without
                           // the backbone's backward): opt.grads with this call's gradients
                           // added, or new tensors holding them where opt.grads has none; under
                           // context parallelism this rank's share
  double indexer_loss = 0; // coeff * sum_t rw kl (dsa modes; NaN when opt.kl_acc took the sum)
  double indexer_kl = 0;   // sum_t rw kl, for logging (NaN likewise)
};

// Context parallelism (DESIGN.md section 8): `cp` is the group sharing the sequence; x and dy are
// this rank's rows [b, s / R, hidden] (row_shard), `layout` covers all S rows in global positions.
// The forward all-gathers the shared key [c ; rope(k_pe)] (and the indexer's key), the backward
// reduce-scatters their gradients; everything else stays on the rank's rows. With Comm::self()
// (one rank) s = S.
Tensor mla_forward(const MlaLayer& L, const Tensor& x, const DocLayout& layout, MlaSaved& saved,
                   Comm& cp = Comm::self());
// Activation recomputation of the attention core: drop its output and lse after the forward,
// rebuild them (bit-identical: the core is deterministic) right before the backward. Everything
// the indexer's gradient needs survives (its inputs and selection are not part of the core).
void mla_drop_core(MlaSaved& saved);
void mla_recompute_core(const MlaLayer& L, const Tensor& x, const DocLayout& layout, MlaSaved& saved,
                        const Comm& cp = Comm::self());

// Bytes one rank sends per layer under context parallelism over R ranks (ring all-gather and
// reduce-scatter, Comm::bytes_sent's convention): the forward gathers the shared key (Rkv + Dr
// wide) and, in dsa modes, the indexer key (DI wide); the backward reduce-scatters the shared
// key's gradient when the backbone's backward runs and the indexer key's in dsa modes. Counted in
// f32, the CPU's compute dtype (on CUDA the forward's gathers move bf16: half of `forward`).
struct CpTraffic {
  int64_t forward = 0, backward = 0;
};
// indexer = false: a "shared" layer of indexer_types (IndexShare), which gathers no indexer key.
CpTraffic mla_cp_traffic(const ModelConfig& c, LayerMode mode, int64_t b, int64_t s, int64_t R, bool backbone,
                         bool indexer = true);

// What `layers` layers in `mode` keep per forward over rows x s query rows (queries, per-head
// keys and values or absorbed queries, the indexer's scores and selection table), added to `plan`
// as lower bounds named by the fields that drive them; the activations in the device's compute
// dtype `compute` (mla_forward keeps them in it), the tables in i32. indexer = false: "shared"
// layers of indexer_types (IndexShare), which keep no indexer state and read their source's table.
void mla_memory_plan(MemoryPlan& plan, const ModelConfig& c, LayerMode mode, const SizeFactor& layers,
                     const SizeFactor& rows, const SizeFactor& s, DType compute, bool indexer = true);

MlaGrads mla_backward(const MlaLayer& L, const Tensor& x, const DocLayout& layout,
                      const MlaSaved& saved, const Tensor& dy, const MlaBackwardOptions& opt = {},
                      Comm& cp = Comm::self());

}  // namespace hmla
