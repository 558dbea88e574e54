// Indexer forward/backward on the CPU. qI = wq_b cq (per head: rope on the first Dr channels,
// rotate-half layout), kI = rope(LayerNorm(wk x)), w = weights_proj x * HI^-1/2 * DI^-1/2.
#include "hmla/model/indexer.h"

#include <cmath>
#include <cstring>
#include <random>

#include "cpu_kernels.h"
#include "hmla/dist/cp.h"
#include "cpu_kernels.h"
#include "rope_cache.h"

namespace hmla {

namespace {
constexpr float kNormEps = 1e-6f;
const float* W(const io::TensorMap& w, const char* name) { return w.at(name).data<float>(); }
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

void indexer_forward(const ModelConfig& c, const io::TensorMap& w, const Tensor& x, const Tensor& cq,
                     const DocLayout& layout, IndexerState& sv, Comm& cp) {
  const int64_t b = x.size(0), s = x.size(1), N = b * s, hid = c.hidden_size;
  const int64_t HI = c.index_n_heads, DI = c.index_head_dim, Rq = c.q_lora_rank, Dr = c.qk_rope_head_dim;
  const RowShard sh = row_shard(cp, layout.s);
  const RopeCache rc = rope_cache(c, s, sh.row0);
  const float* X = x.data<float>();
  sv.sc.layout = &layout;
  sv.sc.q_row0 = sh.row0;
  sv.sc.qI = Tensor::empty({b, s, HI, DI}, DType::f32);
  cpu::linear_fwd(sv.sc.qI.data<float>(), HI * DI, cq.data<float>(), Rq, W(w, "indexer.wq_b.weight"), N, Rq, HI * DI);
  cpu::rope(cpu::RopeLayout::half, sv.sc.qI.data<float>(), HI * DI, DI, HI, N, s, Dr, rc.cos.data(), rc.sin.data(),
            false);
  sv.kpre = Tensor::empty({N, DI}, DType::f32);
  sv.k_mean = Tensor::empty({N}, DType::f32);
  sv.k_rstd = Tensor::empty({N}, DType::f32);
  Tensor kI = Tensor::empty({b, s, DI}, DType::f32);
  cpu::linear_fwd(sv.kpre.data<float>(), DI, X, hid, W(w, "indexer.wk.weight"), N, hid, DI);
  cpu::layernorm_fwd(kI.data<float>(), sv.k_mean.data<float>(), sv.k_rstd.data<float>(), sv.kpre.data<float>(),
                     W(w, "indexer.k_norm.weight"), W(w, "indexer.k_norm.bias"), N, DI, kNormEps);
  cpu::rope(cpu::RopeLayout::half, kI.data<float>(), DI, 0, 1, N, s, Dr, rc.cos.data(), rc.sin.data(), false);
  sv.sc.kI = cp_all_gather_rows(cp, kI);  // the indexer's key: DI wide, of every row
  sv.sc.w = Tensor::empty({b, s, HI}, DType::f32);
  cpu::linear_fwd(sv.sc.w.data<float>(), HI, X, hid, W(w, "indexer.weights_proj.weight"), N, hid, HI);
  const float ws = head_weight_scale(c);
  float* wp = sv.sc.w.data<float>();
  for (int64_t i = 0; i < N * HI; ++i) wp[i] *= ws;
}

void indexer_backward(const ModelConfig& c, const io::TensorMap& w, const Tensor& x, const Tensor& cq,
                      const IndexerState& sv, const IndexerKlResult& kl, io::TensorMap& grads, Comm& cp) {
  const int64_t s = x.size(1), N = x.size(0) * s, hid = c.hidden_size;
  const int64_t HI = c.index_n_heads, DI = c.index_head_dim, Rq = c.q_lora_rank, Dr = c.qk_rope_head_dim;
  const RopeCache rc = rope_cache(c, s, sv.sc.q_row0);
  for (const ParamSpec& p : indexer_param_table(c)) grads[p.name] = Tensor::empty(p.shape, DType::f32);
  auto dW = [&](const char* name) { return grads.at(name).data<float>(); };
  const float* X = x.data<float>();

  Tensor dq = kl.dqI.clone();  // rope's transpose, in place
  cpu::rope(cpu::RopeLayout::half, dq.data<float>(), HI * DI, DI, HI, N, s, Dr, rc.cos.data(), rc.sin.data(), true);
  cpu::linear_bwd(nullptr, 0, 0.f, dW("indexer.wq_b.weight"), dq.data<float>(), HI * DI, cq.data<float>(), Rq,
                  W(w, "indexer.wq_b.weight"), N, Rq, HI * DI);

  // This rank's rows of dkI, summed over every rank's queries.
  Tensor dk = cp.size() > 1 ? cp_reduce_scatter_rows(cp, kl.dkI) : kl.dkI.clone();
  Tensor dkpre = Tensor::empty({N, DI}, DType::f32);
  cpu::rope(cpu::RopeLayout::half, dk.data<float>(), DI, 0, 1, N, s, Dr, rc.cos.data(), rc.sin.data(), true);
  cpu::layernorm_bwd(dkpre.data<float>(), dW("indexer.k_norm.weight"), dW("indexer.k_norm.bias"), dk.data<float>(),
                     sv.kpre.data<float>(), W(w, "indexer.k_norm.weight"), sv.k_mean.data<float>(),
                     sv.k_rstd.data<float>(), N, DI);
  cpu::linear_bwd(nullptr, 0, 0.f, dW("indexer.wk.weight"), dkpre.data<float>(), DI, X, hid, W(w, "indexer.wk.weight"),
                  N, hid, DI);

  Tensor dwr = kl.dw.clone();
  const float ws = head_weight_scale(c);
  float* g = dwr.data<float>();
  for (int64_t i = 0; i < N * HI; ++i) g[i] *= ws;
  cpu::linear_bwd(nullptr, 0, 0.f, dW("indexer.weights_proj.weight"), g, HI, X, hid,
                  W(w, "indexer.weights_proj.weight"), N, hid, HI);
}

namespace {
std::vector<float> row_mask(const DocLayout& layout, const Tensor* input_ids, int64_t pad) {
  const int64_t b = layout.b, s = layout.s;
  std::vector<int64_t> ids;
  if (input_ids) {
    HMLA_CHECK(input_ids->shape() == Shape({b, s}), ShapeError, "input_ids must be [b, s] = ", shape_str({b, s}));
    if (input_ids->dtype() == DType::i64) {
      ids = input_ids->to_vector<int64_t>();
    } else {
      for (int32_t v : input_ids->to_vector<int32_t>()) ids.push_back(v);
    }
  }
  std::vector<float> m(b * s);
  for (int64_t r = 0; r < b; ++r)
    for (int64_t t = 0; t < s; ++t)
      m[r * s + t] = (!input_ids || (ids[r * s + t] != pad && !layout.is_padding(r, t))) ? 1.f : 0.f;
  return m;
}
}  // namespace

int64_t loss_row_count(const DocLayout& layout, const Tensor* input_ids, int64_t pad) {
  int64_t n = 0;
  for (float v : row_mask(layout, input_ids, pad)) n += v > 0.f;
  return n;
}

Tensor loss_row_weights(const DocLayout& layout, const Tensor* input_ids, int64_t pad, int64_t global_valid) {
  std::vector<float> m = row_mask(layout, input_ids, pad);
  int64_t count = 0;
  for (float v : m) count += v > 0.f;
  const int64_t valid = global_valid > 0 ? global_valid : std::max<int64_t>(count, 1);
  for (float& v : m) v /= float(valid);
  return Tensor::from_vector<float>({layout.b, layout.s}, m);
}

}  // namespace hmla
