// DeepSeek-V4 decoding with a KV cache (hmla/model/decode.h, v4_decode.cpp) on the transformers
// fixture model (tests/hf/make_v4_fixtures.py: window 4, CSA rate 4, HCA rate 8, index_topk 3, s = 36,
// so 9 window ends per CSA layer and 4 per HCA layer): token by token, every position's logits are
// the full forward's (model_logits) over the same prefix, each CSA step's selection is the
// fixture's, the greedy continuation is the one repeated full forwards give, the cache's tensors
// are O(window + s / m) per layer, and plan_decode counts them to the byte.
//
// The bound. Decoding and the forward compute the same sums in other orders (one row's products
// against the forward's sgemm over all rows; the window and the entries in one softmax through
// the dense op instead of attn_compressed). Each is an f32 evaluation of transformers' float64
// logits, so each is held to STYLE.md's rule against them, B = 2 e_f32 + 8 ulp(max|logits|), with
// e_f32 the f32 transformers model's error on the fixture (logits_f32; the existing test holds the
// forward to the same B). Then |decode - forward| <= |decode - f64| + |forward - f64| <= 2 B.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "v4_fixture.h"
#include "hmla/io/safetensors.h"
#include "hmla/model/decode.h"
#include "hmla/model/model.h"

namespace hmla {
namespace {

using testing::joined;

// The fixture (v4_fixture.h) with its input_ids as a flat list.
struct Fixture : testing::V4Fixture {
  int64_t b = batch.input_ids.size(0), s = batch.input_ids.size(1);
  std::vector<int32_t> ids = batch.input_ids.to_vector<int32_t>();  // [b, s]
  // The full forward's logits of the last row of `prefix` (one document) [V].
  std::vector<float> forward_last(const std::vector<int32_t>& prefix) const {
    const int64_t n = int64_t(prefix.size()), V = c.vocab_size;
    const Tensor l = model_logits(m, Batch{Tensor::from_vector<int32_t>({1, n}, prefix), layout_causal(1, n)});
    const std::vector<float> all = l.to_vector<float>();
    return {all.end() - V, all.end()};
  }
};

double max_diff(const std::vector<float>& a, const float* b, size_t n) {
  double e = 0;
  for (size_t i = 0; i < n; ++i) e = std::max(e, std::abs(double(a[i]) - double(b[i])));
  return e;
}

int64_t argmax(const std::vector<float>& v) { return std::max_element(v.begin(), v.end()) - v.begin(); }

TEST(V4Decode, EveryPositionIsTheFullForwardOfItsPrefix) {
  Fixture fx;
  const ModelConfig& c = fx.c;
  const int64_t V = c.vocab_size, K = c.index_topk;
  double worst_ref = 0, worst_fwd = 0;
  for (int64_t row = 0; row < fx.b; ++row) {
    KvCache cache = kv_cache(fx.m, fx.s);
    std::vector<int32_t> prefix;
    for (int64_t t = 0; t < fx.s; ++t) {
      const int32_t id = fx.ids[size_t(row * fx.s + t)];
      prefix.push_back(id);
      std::vector<Tensor> topk;
      const std::vector<float> dec = decode_step(fx.m, cache, std::span<const int32_t>(&id, 1), &topk).to_vector<float>();
      ASSERT_EQ(cache.len, t + 1);
      const std::vector<float> fwd = fx.forward_last(prefix);
      double e_ref = 0;
      for (int64_t v = 0; v < V; ++v)
        e_ref = std::max(e_ref, std::abs(double(dec[size_t(v)]) - fx.ref[size_t((row * fx.s + t) * V + v)]));
      const double e_fwd = max_diff(dec, fwd.data(), size_t(V));
      EXPECT_LE(e_ref, fx.bound) << "row " << row << " position " << t;
      EXPECT_LE(e_fwd, 2 * fx.bound) << "row " << row << " position " << t;
      worst_ref = std::max(worst_ref, e_ref), worst_fwd = std::max(worst_fwd, e_fwd);
      // Each CSA layer's selection: the fixture's (transformers') set at this row.
      for (int64_t L = 0; L < c.num_hidden_layers; ++L) {
        if (c.v4.layer_types[size_t(L)] != V4Kind::csa) {
          EXPECT_FALSE(topk[size_t(L)].defined());
          continue;
        }
        const Tensor want = fx.F.at("layer" + std::to_string(L) + ".topk");  // [b, s, kw]
        const int64_t kw = want.size(2);
        const std::vector<int32_t> g = topk[size_t(L)].to_vector<int32_t>(), w = want.to_vector<int32_t>();
        ASSERT_EQ(int64_t(g.size()), K);
        std::set<int32_t> gs(g.begin(), g.end()), ws(w.begin() + (row * fx.s + t) * kw, w.begin() + (row * fx.s + t + 1) * kw);
        gs.erase(-1), ws.erase(-1);
        EXPECT_EQ(gs, ws) << "layer " << L << " row " << row << " position " << t;
      }
    }
    // The cache: per layer the window's W rows, each compressor's window (CSA: and the previous
    // a-series) and s / m entries; nothing grows with s but the entries.
    const int64_t W = c.v4.sliding_window, d = c.v4.head_dim, dI = c.index_head_dim;
    ASSERT_EQ(int64_t(cache.v4.size()), c.num_hidden_layers);
    EXPECT_TRUE(cache.ka.empty() && cache.kI.empty());
    for (int64_t L = 0; L < c.num_hidden_layers; ++L) {
      const V4LayerCache& lc = cache.v4[size_t(L)];
      const V4Kind kind = c.v4.layer_types[size_t(L)];
      const int64_t m = c.v4.compress_rate(L);
      EXPECT_EQ(lc.window.shape(), (Shape{W, d}));
      auto check = [&](const V4CompressorCache& cc, int64_t w, bool csa) {
        EXPECT_EQ(cc.kv.shape(), (Shape{m, (csa ? 2 : 1) * w})) << L;
        EXPECT_EQ(cc.gate.shape(), (Shape{m, (csa ? 2 : 1) * w})) << L;
        EXPECT_EQ(cc.prev_kv.defined(), csa) << L;
        if (csa) {
          EXPECT_EQ(cc.prev_kv.shape(), (Shape{m, w})) << L;
          EXPECT_EQ(cc.prev_gate.shape(), (Shape{m, w})) << L;
        }
        EXPECT_EQ(cc.entries.shape(), (Shape{fx.s / m, w})) << L;
      };
      if (kind == V4Kind::sliding) {
        EXPECT_FALSE(lc.comp.kv.defined()) << L;
      } else {
        check(lc.comp, d, kind == V4Kind::csa);
      }
      if (kind == V4Kind::csa) {
        check(lc.index, dI, true);
      } else {
        EXPECT_FALSE(lc.index.kv.defined()) << L;
      }
    }
  }
  std::printf("decode against transformers' float64: %.3g, against the full forward: %.3g (B = %.3g)\n", worst_ref,
              worst_fwd, fx.bound);
}

TEST(V4Decode, GreedyContinuationIsRepeatedFullForwards) {
  Fixture fx;
  const int64_t prompt = 6, total = 40;  // past several windows of every layer (W 4, m 4 and 8)
  std::vector<int32_t> seq(fx.ids.begin(), fx.ids.begin() + prompt), by_forward = seq;
  KvCache cache = kv_cache(fx.m, total);
  std::vector<float> logits = decode_step(fx.m, cache, seq).to_vector<float>();  // the prompt at once
  double worst = 0, margin = 1e30;
  while (int64_t(seq.size()) < total) {
    const std::vector<float> fwd = fx.forward_last(by_forward);
    worst = std::max(worst, max_diff(logits, fwd.data(), fwd.size()));
    std::vector<float> sorted = fwd;
    std::sort(sorted.rbegin(), sorted.rend());
    margin = std::min(margin, double(sorted[0] - sorted[1]));
    by_forward.push_back(int32_t(argmax(fwd)));
    seq.push_back(int32_t(argmax(logits)));
    ASSERT_EQ(seq, by_forward) << "step " << seq.size();
    if (int64_t(seq.size()) < total) logits = decode_step(fx.m, cache, std::span<const int32_t>(&seq.back(), 1)).to_vector<float>();
  }
  EXPECT_LE(worst, 2 * fx.bound);
  std::printf("greedy: %lld tokens, largest logit difference %.3g (2 B = %.3g), smallest top-2 margin %.3g\n",
              static_cast<long long>(total - prompt), worst, 2 * fx.bound, margin);
  KvCache small = kv_cache(fx.m, 2);
  EXPECT_THROW(decode_step(fx.m, small, std::span<const int32_t>(seq.data(), 3)), ShapeError);  // over the cache
  const int32_t bad = int32_t(fx.c.vocab_size);
  EXPECT_THROW(decode_step(fx.m, small, std::span<const int32_t>(&bad, 1)), ShapeError);
  EXPECT_EQ(small.len, 0);
}

TEST(V4Decode, PlanCountsTheCache) {
  Fixture fx;
  const int64_t positions = 37;  // not a multiple of either rate
  KvCache cache = kv_cache(fx.m, positions);
  int64_t bytes = 0;
  auto add = [&](const Tensor& t) { bytes += t.defined() ? t.numel() * 4 : 0; };
  for (const V4LayerCache& lc : cache.v4) {
    add(lc.window);
    for (const V4CompressorCache* cc : {&lc.comp, &lc.index}) {
      add(cc->kv), add(cc->gate), add(cc->prev_kv), add(cc->prev_gate), add(cc->entries);
    }
  }
  MemoryPlan plan, keys;
  plan_decode(plan, fx.c, {"positions", positions});
  // The plan's last line is a step's keys (a temporary): window + the most entries one layer reads.
  const int64_t d = fx.c.v4.head_dim, W = fx.c.v4.sliding_window;
  keys.add("keys", {{"", W + positions / fx.c.v4.hca_rate}, {"", d}}, 4);
  EXPECT_EQ(plan.total(), bytes + keys.total());
}

}  // namespace
}  // namespace hmla
