// A V4 stack's attention mass (docs/v4_attention.md "Attention mass"; src/model/v4_mass.cpp): each
// layer kind's share of the softmax on the window keys, the compressed entries and the sink, on the
// tiny V4-Flash-like stack (configs/deepseek_v4_tiny.json: sliding, CSA, HCA, CSA; window 16, CSA
// rate 4, HCA 16, top-k 8) over packed documents with padding and a pad token inside a document
// (attended, no loss row), its sinks drawn so that every part carries mass:
// - per layer against the softmax materialised in float64 from the forward's own f32 q, keys and
//   entries (the mode's entries: every visible one, or the top-k in dsa_sparse), within a bound
//   derived from the two f32 log-sum-exps it is computed from (lse_of, Oracle);
// - the three fractions sum to 1; the step with the mass is the step without it, bit for bit;
//   dsa_warmup's indexer-only step measures the same mass as the full step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "hmla/core/layout.h"
#include "hmla/model/losses.h"
#include "hmla/model/model.h"
#include "hmla/model/v4_tables.h"
#include "testing.h"
#include "v4_internal.h"

namespace hmla {
namespace {

const std::string kFlash = std::string(HMLA_SOURCE_DIR) + "/configs/deepseek_v4_tiny.json";
constexpr double kU = 0x1p-24;  // f32's unit roundoff

ModelConfig in_mode(LayerMode mode) {
  ModelConfig c = load_model_config(kFlash, LayerModesFrom::programme);
  set_all_modes(c, mode);
  return c;
}

// The stack in `mode` (seed 5), every layer's sink N(0.5, 1) (init_model's are 0).
Model model(LayerMode mode) {
  const ModelConfig c = in_mode(mode);
  Model m = build_model(c, v4_indexer_layers(c));
  init_model(m, 5);
  const int64_t H = c.num_attention_heads;
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) {
    std::vector<float> sink = testing::randn(size_t(H), 40 + uint64_t(L));
    for (float& x : sink) x += 0.5f;
    m.params.at(layer_prefix(L) + "attn.attn_sink").copy_from(Tensor::from_vector<float>({H}, sink));
  }
  return m;
}

// Row 0: documents [0, 50), [50, 64), a pad token at 20 (inside the first: attended, no loss row);
// row 1: [0, 13), [13, 58), padding from 58.
Batch packed(const ModelConfig& c) {
  const int64_t b = 2, s = 64;
  const std::vector<float> r = testing::randn(size_t(b * s), 17);
  std::vector<int32_t> ids;
  for (float x : r) ids.push_back(int32_t(3 + std::abs(int64_t(x * 1000)) % (c.vocab_size - 3)));
  ids[20] = int32_t(c.pad_token_id);
  for (int64_t t = 58; t < s; ++t) ids[size_t(s + t)] = int32_t(c.pad_token_id);
  Batch batch;
  batch.input_ids = Tensor::from_vector<int32_t>({b, s}, ids);
  batch.layout = layout_from_cu_seqlens(s, {{0, 50, 64}, {0, 13, 58}});
  return batch;
}

// One f32 log-sum-exp's error against its exact value over logits z_j = scale q . k_j (A_j = scale
// sum_i |q_i k_i|) and the sink: the dot products (sgemm, any order) are off by at most gamma(d + 1)
// A_j (d products and the scale's rounding), which moves the lse by at most their largest; the sum
// of n + 1 exponentials (online rescaling included) by (n + 4) u relative, each exponential's
// argument z - m rounded by u |z - m| <= u (|z| + |m|), and log and the final m + log by u (|log| +
// |lse|): delta <= max_j gamma(d + 1) A_j + u ((n + 4) + 2 (max |z| + |sink|) + 2 |lse|).
struct Lse {
  double lse = 0, delta = 0;
};

Lse lse_of(const std::vector<double>& z, const std::vector<double>& a, double sink, int64_t d) {
  double m = sink, big = std::abs(sink), err = 0;
  for (double x : z) m = std::max(m, x), big = std::max(big, std::abs(x));
  double sum = std::exp(sink - m);
  for (double x : z) sum += std::exp(x - m);
  const double gamma = double(d + 1) * kU / (1 - double(d + 1) * kU);
  for (double x : a) err = std::max(err, gamma * x);
  const double lse = m + std::log(sum);
  return {lse, err + kU * (double(z.size() + 4) + 2 * (big + std::abs(sink)) + 2 * std::abs(lse))};
}

// The layer's fractions in float64: per loss row and head the softmax over the window keys, the
// entries it attends (every visible one; dsa_sparse: the visible ones of its top-k, once each) and
// the sink, materialised; summed over the (row, head) pairs, with `bound` the sum of each pair's
// bound on a fraction's error: 2 (2 delta(lse) + delta(lse_ws)) (window = e^{ws - lse} - e^{sink -
// lse} moves by at most that much, entries and sink by less; the 2 is STYLE.md's rule).
struct Oracle {
  double part[3] = {0, 0, 0};  // window, entries, sink
  double bound = 0;
  int64_t pairs = 0;
};

Oracle oracle(const ModelConfig& c, const V4AttnSaved& sv, const std::vector<float>& sink, const DocLayout& layout,
              const std::vector<float>& rw) {
  const int64_t b = layout.b, s = layout.s, H = c.num_attention_heads, d = c.v4.head_dim, W = c.v4.sliding_window;
  const int64_t n_e = sv.comp.e.n, k = sv.idx.defined() ? sv.idx.size(2) : 0;
  const double scale = double(float(1.0 / std::sqrt(double(d))));
  const std::vector<float> q = sv.q.to_vector<float>(), kv = sv.kv.to_vector<float>();
  const std::vector<float> ent = n_e > 0 ? sv.comp.ent.to_vector<float>() : std::vector<float>();
  const std::vector<int32_t> last = n_e > 0 ? sv.ent_last.to_vector<int32_t>() : std::vector<int32_t>(),
                             doc = n_e > 0 ? sv.ent_doc.to_vector<int32_t>() : std::vector<int32_t>(),
                             idx = k > 0 ? sv.idx.to_vector<int32_t>() : std::vector<int32_t>();
  const int32_t* st = layout.doc_start.data<int32_t>();
  Oracle o;
  for (int64_t r = 0; r < b; ++r)
    for (int64_t t = 0; t < s; ++t) {
      if (!(rw[size_t(r * s + t)] > 0.f)) continue;
      const int64_t start = st[r * s + t];
      std::set<int64_t> entries;  // the attended ones
      for (int64_t e = 0; e < n_e; ++e) {
        const bool seen = doc[size_t(r * n_e + e)] == start && last[size_t(r * n_e + e)] <= t;
        bool chosen = k == 0;
        for (int64_t i = 0; i < k; ++i) chosen |= idx[size_t((r * s + t) * k + i)] == e;
        if (seen && chosen) entries.insert(e);
      }
      for (int64_t h = 0; h < H; ++h) {
        const float* qh = q.data() + ((r * s + t) * H + h) * d;
        std::vector<double> zw, aw, ze, ae;
        auto logit = [&](const float* key, std::vector<double>& z, std::vector<double>& a) {
          double dot = 0, abs = 0;
          for (int64_t i = 0; i < d; ++i) {
            const double term = double(qh[i]) * double(key[i]);
            dot += term, abs += std::abs(term);
          }
          z.push_back(scale * dot), a.push_back(scale * abs);
        };
        for (int64_t u = std::max(start, t - W + 1); u <= t; ++u) logit(kv.data() + (r * s + u) * d, zw, aw);
        for (int64_t e : entries) logit(ent.data() + (r * n_e + e) * d, ze, ae);
        std::vector<double> z = zw, a = aw;
        z.insert(z.end(), ze.begin(), ze.end()), a.insert(a.end(), ae.begin(), ae.end());
        const Lse all = lse_of(z, a, sink[size_t(h)], d), ws = lse_of(zw, aw, sink[size_t(h)], d);
        double pw = 0, pe = 0;
        for (double x : zw) pw += std::exp(x - all.lse);
        for (double x : ze) pe += std::exp(x - all.lse);
        o.part[0] += pw, o.part[1] += pe, o.part[2] += std::exp(double(sink[size_t(h)]) - all.lse);
        o.bound += 2 * (2 * all.delta + ws.delta);
        ++o.pairs;
      }
    }
  return o;
}

struct Layer {
  V4Kind kind;
  double mass[4];  // v4_attn_mass's sums: window, entries, sink, pairs
  Oracle ref;
};

// Every layer of the stack in `mode` on one random input x [b, s, D] (the attention block's input).
std::vector<Layer> layers(LayerMode mode) {
  const Model m = model(mode);
  const ModelConfig& c = m.cfg;
  const Batch batch = packed(c);
  const int64_t b = batch.layout.b, s = batch.layout.s, D = c.hidden_size;
  const Tensor x = Tensor::from_vector<float>({b, s, D}, testing::randn(size_t(b * s * D), 31));
  const Tensor rw = loss_row_weights(batch.layout, &batch.input_ids, c.pad_token_id);
  const V4Tensors w = v4_tensors(m.params, c);
  const V4Rows rows = v4_rows(c, s, m.device(), Comm::self());
  std::vector<Layer> out;
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) {
    V4AttnSaved sv;
    const Tensor y = Tensor::empty({b * s, D}, DType::f32);
    v4_attention_fwd(c, L, w.layers[size_t(L)].attn, x, batch.layout, rows, sv, y);
    const Tensor acc = Tensor::zeros({4}, DType::f64);
    v4_attn_mass(c, w.layers[size_t(L)].attn, x, batch.layout, rows, sv, rw, acc);
    Layer l{c.v4.kind(L), {}, oracle(c, sv, w.layers[size_t(L)].attn.sink.to_vector<float>(), batch.layout,
                                      rw.to_vector<float>())};
    const std::vector<double> a = acc.to_vector<double>();
    std::copy(a.begin(), a.end(), l.mass);
    out.push_back(l);
  }
  return out;
}

void expect_oracle(LayerMode mode) {
  for (const Layer& l : layers(mode)) {
    const double n = double(l.ref.pairs);
    ASSERT_EQ(l.mass[3], n);
    const double bound = l.ref.bound / n;  // of the mean's error: the mean of the pairs' bounds
    for (int p = 0; p < 3; ++p) {
      const double got = l.mass[p] / n, want = l.ref.part[p] / n, err = std::abs(got - want);
      std::printf("%s %s part %d: %.9f against %.9f, error %.3g, bound %.3g (%.2g of it)\n", mode_name(mode),
                  v4_kind_name(l.kind), p, got, want, err, bound, err / bound);
      EXPECT_LE(err, bound) << v4_kind_name(l.kind) << " part " << p;
      if (p != 1 || l.kind != V4Kind::sliding) {
        EXPECT_GT(want, 0.01) << "every part carries mass";
      }
    }
    // The three sum to 1 per pair in f64 (a few ulps each).
    EXPECT_NEAR((l.mass[0] + l.mass[1] + l.mass[2]) / n, 1.0, 1e-13);
    if (l.kind == V4Kind::sliding) {
      EXPECT_EQ(l.mass[1], 0.0);  // no entry: lse_ws is lse itself
    }
  }
}

TEST(V4Mass, EachLayerAgainstTheFloat64SoftmaxDense) { expect_oracle(LayerMode::mha); }

// dsa_sparse: a CSA layer's entries are its top-k's (8 of up to 12 visible here); the mass is over
// what it attends.
TEST(V4Mass, EachLayerAgainstTheFloat64SoftmaxSparse) { expect_oracle(LayerMode::dsa_sparse); }

struct Stepped {
  StepStats st;
  std::vector<float> grads;
  std::vector<double> mass;  // [3 kinds, 4]
};

Stepped step(const Model& m, const Batch& batch, bool mass, bool backbone = true) {
  const Tensor garena = Tensor::zeros({m.arena.numel()}, DType::f32);
  io::TensorMap g = arena_views(m.table, garena);
  StepOptions o;
  o.backbone = backbone;
  if (mass) o.attn_mass = Tensor::zeros({3, 4}, DType::f64);
  Stepped r;
  r.st = model_step(m, batch, o, g);
  r.grads = garena.to_vector<float>();
  if (mass) r.mass = o.attn_mass.to_vector<double>();
  return r;
}

// The model's step with the mass is the step without it, bit for bit; each kind's row counts its
// layers' (row, head) pairs (sliding 1 layer, CSA 2, HCA 1; H heads; the batch's loss rows) and its
// fractions sum to 1; dsa_warmup's indexer-only step (backbone false) measures the same mass.
TEST(V4Mass, TheStepIsUnchangedAndCountsEveryKind) {
  for (LayerMode mode : {LayerMode::mha, LayerMode::dsa_warmup, LayerMode::dsa_sparse}) {
    const Model m = model(mode);
    const Batch batch = packed(m.cfg);
    const Stepped off = step(m, batch, false), on = step(m, batch, true);
    EXPECT_EQ(on.grads, off.grads) << mode_name(mode);
    EXPECT_EQ(on.st.lm_loss, off.st.lm_loss);
    EXPECT_TRUE(on.st.indexer_kl == off.st.indexer_kl ||
                (std::isnan(on.st.indexer_kl) && std::isnan(off.st.indexer_kl)));
    const double rows = double(loss_row_count(batch.layout, &batch.input_ids, m.cfg.pad_token_id));
    const double H = double(m.cfg.num_attention_heads), per_kind[3] = {1, 2, 1};
    for (int k = 0; k < 3; ++k) {
      const double* row = on.mass.data() + 4 * k;
      EXPECT_EQ(row[3], per_kind[k] * rows * H) << k;
      EXPECT_NEAR((row[0] + row[1] + row[2]) / row[3], 1.0, 1e-13) << k;
    }
    EXPECT_EQ(on.mass[1], 0.0);  // sliding: no entries
    if (mode == LayerMode::dsa_warmup) {
      EXPECT_EQ(step(m, batch, true, false).mass, on.mass);
    }
  }
}

}  // namespace
}  // namespace hmla
