// Indexer forward/backward, on ops. qI = wq_b cq (per head: rope on the first Dr channels, in the
// family's layout: rotate-half for deepseek_v32, interleaved pairs for glm_moe_dsa), kI =
// rope(LayerNorm(wk x)), w = weights_proj x * HI^-1/2 * DI^-1/2.
#include "hmla/model/indexer.h"

#include <cmath>
#include <cstring>
#include <random>

#include "hmla/dist/cp.h"
#include "hmla/ops/backend.h"
#include "hmla/ops/nn.h"
#include "model_internal.h"

namespace hmla {

namespace {
constexpr float kNormEps = 1e-6f;
RopeLayout rope_layout(const ModelConfig& c) {
  return c.indexer_rope_interleaved() ? RopeLayout::interleaved : RopeLayout::half;
}
float head_weight_scale(const ModelConfig& c) {
  return static_cast<float>(1.0 / std::sqrt(double(c.index_n_heads)) / std::sqrt(double(c.index_head_dim)));
}
}  // namespace

std::vector<ParamSpec> indexer_param_table(const ModelConfig& c) {
  const int64_t HI = c.index_n_heads, DI = c.index_head_dim, hid = c.hidden_size;
  return {{"indexer.wq_b.weight", {HI * DI, c.q_lora_rank}},
          {"indexer.wk.weight", {DI, hid}},
          {"indexer.k_norm.weight", {DI}},
          {"indexer.k_norm.bias", {DI}},
          {"indexer.weights_proj.weight", {HI, hid}}};
}

int indexer_init_missing(io::TensorMap& w, const ModelConfig& c, uint64_t seed) {
  int created = 0;
  std::mt19937_64 rng(seed);
  for (const ParamSpec& p : indexer_param_table(c)) {
    if (w.count(p.name)) continue;
    Tensor t = Tensor::empty(p.shape, DType::f32);
    float* v = t.data<float>();
    if (p.name == "indexer.k_norm.weight") {
      std::fill(v, v + t.numel(), 1.f);
    } else if (p.name == "indexer.k_norm.bias") {
      std::fill(v, v + t.numel(), 0.f);
    } else {
      std::normal_distribution<float> nd(0.f, static_cast<float>(c.initializer_range));
      for (int64_t i = 0; i < t.numel(); ++i) v[i] = nd(rng);
    }
    w[p.name] = t;
    ++created;
  }
  return created;
}

void indexer_forward(const ModelConfig& c, const IndexerTensors& w, const Tensor& x, const Tensor& cq,
                     const DocLayout& layout, const RopeCache& rc, IndexerState& sv, Comm& cp) {
  const int64_t b = x.size(0), s = x.size(1), N = b * s;
  const int64_t HI = c.index_n_heads, DI = c.index_head_dim, Dr = c.qk_rope_head_dim;
  const RowShard sh = row_shard(cp, layout.s);
  sv.sc.layout = &layout;
  sv.sc.q_row0 = sh.row0;
  const DType dt = compute_dtype(x.device());  // kept between ops in it (DESIGN.md section 4)
  const Device dev = x.device();
  // Each saved tensor in its slot: the activation arena's view the caller set, else a new one.
  saved_slot(sv.sc.qI, {b, s, HI, DI}, dt, dev);
  linear_fwd(cq, w.wq_b, sv.sc.qI.view({N, HI * DI}));
  rope(sv.sc.qI.slice(3, 0, Dr), rc.cos, rc.sin, rope_layout(c), false);
  saved_slot(sv.kpre, {N, DI}, dt, dev);
  saved_slot(sv.k_mean, {N}, DType::f32, dev);
  saved_slot(sv.k_rstd, {N}, DType::f32, dev);
  const bool one_rank = cp.size() == 1;  // the key written into its slot, else gathered into it
  if (one_rank) saved_slot(sv.sc.kI, {b, s, DI}, dt, dev);
  Tensor kI = one_rank ? sv.sc.kI : Tensor::empty({b, s, DI}, dt, dev);
  linear_fwd(x, w.wk, sv.kpre);
  layernorm_fwd(sv.kpre, w.k_norm_weight, w.k_norm_bias, kNormEps, kI.view({N, DI}),
                sv.k_mean, sv.k_rstd);
  rope(kI.view({b, s, 1, DI}).slice(3, 0, Dr), rc.cos, rc.sin, rope_layout(c), false);
  if (!one_rank) {  // the indexer's key: DI wide, of every row
    const Tensor all = cp_all_gather_rows(cp, kI);
    if (sv.sc.kI.defined()) saved_slot(sv.sc.kI, all.shape(), dt, dev).copy_from(all);
    else sv.sc.kI = all;
  }
  saved_slot(sv.sc.w, {b, s, HI}, DType::f32, dev);
  linear_fwd(x, w.weights_proj, sv.sc.w);
  scale(sv.sc.w, head_weight_scale(c), sv.sc.w);
}

void indexer_backward(const ModelConfig& c, const IndexerTensors& w, const Tensor& x, const Tensor& cq,
                      const RopeCache& rc, const IndexerState& sv, const IndexerKlResult& kl,
                      const IndexerTensors& dw, Comm& cp) {
  const int64_t s = x.size(1), N = x.size(0) * s;
  const int64_t HI = c.index_n_heads, DI = c.index_head_dim, Dr = c.qk_rope_head_dim;

  Tensor dq = kl.dqI.clone();  // rope's transpose, in place
  rope(dq.slice(3, 0, Dr), rc.cos, rc.sin, rope_layout(c), true);
  linear_bwd(dq.view({N, HI * DI}), cq, w.wq_b, dw.wq_b, Tensor());

  // This rank's rows of dkI, summed over every rank's queries.
  Tensor dk = cp.size() > 1 ? cp_reduce_scatter_rows(cp, kl.dkI) : kl.dkI.clone();
  Tensor dkpre = Tensor::empty({N, DI}, DType::f32, x.device());
  rope(dk.view({x.size(0), s, 1, DI}).slice(3, 0, Dr), rc.cos, rc.sin, rope_layout(c), true);
  layernorm_bwd(dk.view({N, DI}), sv.kpre, w.k_norm_weight, sv.k_mean, sv.k_rstd, dkpre,
                dw.k_norm_weight, dw.k_norm_bias);
  linear_bwd(dkpre, x, w.wk, dw.wk, Tensor());

  Tensor dwr = kl.dw.clone();
  scale(dwr, head_weight_scale(c), dwr);
  linear_bwd(dwr, x, w.weights_proj, dw.weights_proj, Tensor());
}

}  // namespace hmla
