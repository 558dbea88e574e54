// The training step's device scalars (hmla/ops/optim.h) on the CUDA backend, emulated: the scalar
// ops add into device accumulators and bring nothing back, in the order the host sums had; the
// optimizer step costs one read-back however many tensors it updates; the clip scale and the
// finite gate are computed on the device with the host's formula; and a non-finite gradient or
// loss moves no weight and no moment although the host learns of it only after the launches.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "hmla/core/cuda.h"
#include "hmla/core/error.h"
#include "hmla/core/layout.h"
#include "hmla/model/config.h"
#include "hmla/ops/nn.h"
#include "hmla/ops/optim.h"
#include "hmla/train/optim.h"

namespace hmla {
namespace {

#define HMLA_NEED_DEVICE() \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"

// The emulated trainer's model (CUDA kernel widths) with `layers` layers, on dev.
Model emu_model(int layers, Device dev) {
  ModelConfig c = load_model_config(std::string(HMLA_SOURCE_DIR) + "/tests/cuda/emu/emu_model.json");
  c.num_hidden_layers = layers;
  c.layer_modes.assign(size_t(layers), c.layer_modes.at(0));
  Model m = build_model(c, std::vector<bool>(size_t(layers), true), dev);
  init_model(m, 3);
  return m;
}

std::vector<float> randoms(int64_t n, float scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = nd(rng);
  return v;
}

// A gradient arena of the model's table on its device, N(0, scale) entries.
Tensor gradients(const Model& m, float scale, uint64_t seed) {
  return Tensor::from_vector<float>({m.arena.numel()}, randoms(m.arena.numel(), scale, seed)).on(m.device());
}

std::vector<uint32_t> bits(const Tensor& t) {
  const std::vector<float> v = t.to_vector<float>();
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

// Weights and both moments, bit for bit.
std::vector<uint32_t> state_bits(const Model& m, const Optimizer& o) {
  std::vector<uint32_t> all = bits(m.arena);
  for (const auto& [name, t] : o.state()) {
    const std::vector<uint32_t> b = bits(t);
    all.insert(all.end(), b.begin(), b.end());
  }
  return all;
}

// Before: one read-back per sum (each per-row or per-chunk partial vector came back). Now the
// sums stay on the device: the only bytes back are cross_entropy's check of its targets (N i32
// and N f32 weights; the token-id validation of issue 27 removes it), and chained calls sum as
// one: acc after two chunks equals one call over all rows, bit for bit.
TEST(StepStats, ScalarOpsAddOnTheDeviceInHostOrder) {
  HMLA_NEED_DEVICE();
  const int64_t N = 24, V = 70, n = 5000;
  const Device dev = Device::cuda;
  const Tensor logits = Tensor::from_vector<float>({N, V}, randoms(N * V, 2.f, 1)).on(dev);
  std::vector<int32_t> tg(static_cast<size_t>(N));
  std::vector<float> w(size_t(N), 1.f);
  for (int64_t i = 0; i < N; ++i) tg[size_t(i)] = int32_t((i * 7) % V);
  w[3] = 0.f;
  const Tensor target = Tensor::from_vector<int32_t>({N}, tg).on(dev), wt = Tensor::from_vector<float>({N}, w).on(dev);
  const Tensor acc = Tensor::zeros({2}, DType::f64, dev);
  const Tensor one = acc.slice(0, 0, 1), two = acc.slice(0, 1, 2);
  CudaCounters c0 = cuda_counters();
  cross_entropy_into(logits, target, wt, {}, one);
  CudaCounters d = cuda_counters() - c0;
  EXPECT_LE(d.syncs, 2) << "cross_entropy: the loss is read back";
  EXPECT_LE(d.d2h_bytes, N * 8) << "cross_entropy: more than its target check came back";
  for (int64_t r0 : {0, 10}) {  // two chunks into the other slot
    const int64_t r1 = r0 == 0 ? 10 : N;
    cross_entropy_into(logits.slice(0, r0, r1), target.slice(0, r0, r1), wt.slice(0, r0, r1), {}, two);
  }
  const std::vector<double> ce = acc.to_vector<double>();
  EXPECT_EQ(ce[0], ce[1]) << "chunks chained through the accumulator must sum as one call";
  EXPECT_EQ(ce[0], cross_entropy(logits, target, wt)) << "the host-returning entry";
  EXPECT_GT(ce[0], 0.0);

  const Tensor x = Tensor::from_vector<float>({n}, randoms(n, 1.f, 2)).on(dev);
  const Tensor y = Tensor::from_vector<float>({n / 2}, randoms(n / 2, 3.f, 3)).on(dev);
  const Tensor ss = Tensor::zeros({1}, DType::f64, dev);
  c0 = cuda_counters();
  sum_squares_into(x, ss);
  sum_squares_into(y, ss);
  d = cuda_counters() - c0;
  EXPECT_EQ(d.syncs, 0) << "sum_squares read something back";
  EXPECT_EQ(d.d2h_bytes, 0);
  EXPECT_EQ(ss.to_vector<double>()[0], sum_squares(y, sum_squares(x))) << "a running sum over two tensors";
}

// The optimizer step reads its stats back once, whatever the number of tensors (before: two
// read-backs per tensor, sum_squares's partials, and one more per Muon matrix).
TEST(StepStats, TheOptimizerStepReadsBackOnce) {
  HMLA_NEED_DEVICE();
  for (const char* opt : {"adamw", "muon"}) {
    for (int layers : {1, 3}) {
      Model m = emu_model(layers, Device::cuda);
      Tensor garena = gradients(m, 1e-2f, 5);
      io::TensorMap g = arena_views(m.table, garena);
      OptimSettings o;
      o.optimizer = opt;
      Optimizer optim(m, o, false);
      const CudaCounters c0 = cuda_counters();
      const OptimStats st = optim.step(m, g, 0);
      const CudaCounters d = cuda_counters() - c0;
      std::printf("%s, %d layers (%zu tensors): %lld syncs, %lld launches, %lld bytes back\n", opt, layers,
                  m.table.size(), (long long)d.syncs, (long long)d.launches, (long long)d.d2h_bytes);
      EXPECT_EQ(d.syncs, 1) << opt << ", " << layers << " layers";
      EXPECT_EQ(d.d2h_bytes, int64_t(kStatCount * sizeof(double))) << opt << ", " << layers << " layers";
      EXPECT_TRUE(std::isfinite(st.grad_norm_backbone) && st.grad_norm_backbone > 0);
    }
  }
}

// A MoE layer's forward and backward wait for the device no more than a dense layer's: the
// dispatch's per-expert bounds stay on the device (grouped products), where the per-expert loop
// before them read them back once per MoE layer and pass. One steady micro-batch step (its LM loss
// into a device stats buffer, so nothing is read back) of the emulated model with dense MLPs and
// with layer 1 MoE (emu_model_moe.json): both without a wait or a read-back.
TEST(StepStats, AMoeStepWaitsNoMoreThanADenseOne) {
  HMLA_NEED_DEVICE();
  std::mt19937 rng(7);
  std::vector<int32_t> ids(2 * 16);
  for (int32_t& v : ids) v = int32_t(1 + rng() % 200);
  const Batch bt{Tensor::from_vector<int32_t>({2, 16}, ids), layout_from_cu_seqlens(16, {{0, 16}, {0, 7, 16}})};
  CudaCounters per[2];
  for (int moe = 0; moe < 2; ++moe) {
    const ModelConfig c = load_model_config(std::string(HMLA_SOURCE_DIR) + "/tests/cuda/emu/" +
                                            (moe ? "emu_model_moe.json" : "emu_model.json"));
    ASSERT_EQ(c.is_moe_layer(1), moe == 1);
    Model m = build_model(c, std::vector<bool>(size_t(c.num_hidden_layers), true), Device::cuda);
    init_model(m, 3);
    const Tensor garena = Tensor::zeros({m.arena.numel()}, DType::f32, Device::cuda);
    io::TensorMap grads = arena_views(m.table, garena);
    StepOptions o;
    o.stats = Tensor::zeros({kStatCount}, DType::f64, Device::cuda);
    model_step(m, bt, o, grads);  // the first makes the shape's caches (RoPE tables)
    const CudaCounters c0 = cuda_counters();
    model_step(m, bt, o, grads);
    per[moe] = cuda_counters() - c0;
    std::printf("%s: %lld syncs, %lld launches, %lld bytes up, %lld back\n", moe ? "moe" : "dense",
                (long long)per[moe].syncs, (long long)per[moe].launches, (long long)per[moe].h2d_bytes,
                (long long)per[moe].d2h_bytes);
  }
  EXPECT_EQ(per[0].syncs, 0);
  EXPECT_EQ(per[1].syncs, per[0].syncs);
  EXPECT_EQ(per[1].d2h_bytes, 0);
  EXPECT_EQ(per[1].h2d_bytes, per[0].h2d_bytes);  // the micro-batch only
}

// The clip scale on the device is the host's formula on the read-back norms, bit for bit, and the
// update uses it: AdamW's first moment after one step from 0 is (1 - b1) (g * gscale). The
// backbone is clipped (norm far above 1), the indexers are not (clip above their norm).
TEST(StepStats, TheClipScaleIsTheHostFormula) {
  HMLA_NEED_DEVICE();
  Model m = emu_model(1, Device::cuda);
  Tensor garena = gradients(m, 1e-1f, 7);
  io::TensorMap g = arena_views(m.table, garena);
  OptimSettings o;
  o.clip_backbone = 1.0, o.clip_indexer = 1e6;
  Optimizer optim(m, o, false);
  const Tensor stats = Tensor::zeros({kStatCount}, DType::f64, m.device());
  optim.launch_step(m, g, 0, stats, Tensor::zeros({1}, DType::f32, m.device()));
  const std::vector<double> s = stats.to_vector<double>();
  EXPECT_EQ(s[kStatNormBackbone], std::sqrt(s[kStatSsBackbone]));
  EXPECT_EQ(s[kStatNormIndexer], std::sqrt(s[kStatSsIndexer]));
  ASSERT_GT(s[kStatNormBackbone], 10 * o.clip_backbone);
  ASSERT_LT(s[kStatNormIndexer], o.clip_indexer);
  const float scale_b = float(o.clip_backbone / s[kStatNormBackbone]);
  EXPECT_EQ(s[kStatScaleBackbone], double(scale_b));
  EXPECT_EQ(s[kStatScaleIndexer], 1.0);
  EXPECT_EQ(s[kStatFinite], 1.0);
  // m = b1 * 0 + (1 - b1) * (g * gscale): two roundings on the device as on the host, so a
  // contraction or reassociation moves it by at most ~2 ulp; a wrong scale by its own factor.
  const float b1 = float(o.beta1);
  for (const char* name : {"model.layers.0.mlp.up_proj.weight", "model.layers.0.self_attn.indexer.wk.weight"}) {
    const bool idx = is_indexer_tensor(name);
    const float gs = idx ? 1.f : scale_b;
    const std::vector<float> gv = g.at(name).to_vector<float>();
    const Tensor mt = arena_views(m.table, optim.state().at("optimizer.m")).at(name);
    const std::vector<float> mv = mt.to_vector<float>();
    for (size_t i = 0; i < gv.size(); i += 37) {
      const float want = (1 - b1) * (gv[i] * gs);
      EXPECT_NEAR(mv[i], want, 4 * std::numeric_limits<float>::epsilon() * std::fabs(want)) << name << " [" << i << "]";
    }
  }
}

// A non-finite gradient element (either group, NaN or inf) stops the step before anything moves:
// the same DivergenceError as on the CPU, and weights, m and v bit for bit as they were, with
// AdamW and with Muon (whose momentum, Newton-Schulz and update all run before the read-back).
TEST(StepStats, ANonFiniteGradientMovesNothing) {
  HMLA_NEED_DEVICE();
  for (const char* opt : {"adamw", "muon"}) {
    Model m = emu_model(1, Device::cuda);
    OptimSettings o;
    o.optimizer = opt;
    Optimizer optim(m, o, false);
    Tensor garena = gradients(m, 1e-2f, 9);
    io::TensorMap g = arena_views(m.table, garena);
    optim.step(m, g, 0);  // moments not zero
    struct Poison {
      const char* tensor;
      float value;
      const char* message;
    };
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    for (const Poison& p : {Poison{"model.layers.0.mlp.up_proj.weight", nan, "the backbone's gradient norm is "},
                            Poison{"model.layers.0.self_attn.indexer.wk.weight", inf,
                                   "the indexers' gradient norm is inf"}}) {
      Tensor gp = gradients(m, 1e-2f, 11);
      io::TensorMap gpv = arena_views(m.table, gp);
      gpv.at(p.tensor).slice(0, 1, 2).copy_from(Tensor::from_vector<float>({1, gpv.at(p.tensor).size(1)},
                                                    std::vector<float>(size_t(gpv.at(p.tensor).size(1)), p.value)));
      const std::vector<uint32_t> before = state_bits(m, optim);
      try {
        optim.step(m, gpv, 1);
        ADD_FAILURE() << opt << ": a non-finite gradient in " << p.tensor << " was applied";
      } catch (const DivergenceError& e) {
        EXPECT_NE(std::string(e.what()).find(p.message), std::string::npos) << e.what();
      }
      EXPECT_TRUE(state_bits(m, optim) == before) << opt << ": " << p.tensor << " moved weights or moments";
    }
  }
}

// A rank's non-finite loss (bad > 0: an infinite KL can come with a finite gradient) closes the
// gate with finite norms: nothing moves, and the norms are still reported.
TEST(StepStats, ABadLossClosesTheGate) {
  HMLA_NEED_DEVICE();
  Model m = emu_model(1, Device::cuda);
  OptimSettings o;
  Optimizer optim(m, o, false);
  Tensor garena = gradients(m, 1e-2f, 13);
  io::TensorMap g = arena_views(m.table, garena);
  const std::vector<uint32_t> before = state_bits(m, optim);
  const Tensor stats = Tensor::zeros({kStatCount}, DType::f64, m.device());
  optim.launch_step(m, g, 0, stats, Tensor::from_vector<float>({1}, {1.f}).on(m.device()));
  const std::vector<double> s = stats.to_vector<double>();
  EXPECT_EQ(s[kStatFinite], 0.0);
  EXPECT_TRUE(std::isfinite(s[kStatNormBackbone]) && s[kStatNormBackbone] > 0);
  EXPECT_TRUE(state_bits(m, optim) == before) << "a step with a non-finite loss moved weights or moments";
  // And stats_losses is that verdict: a NaN KL slot gives bad = 1, finite ones 0.
  const Tensor bad = Tensor::zeros({1}, DType::f32, m.device());
  stats_losses(stats, bad);
  EXPECT_EQ(bad.to_vector<float>()[0], 0.f);
  stats.slice(0, kStatKl, kStatKl + 1).copy_from(Tensor::from_vector<double>({1}, {std::nan("")}));
  stats_losses(stats, bad);
  EXPECT_EQ(bad.to_vector<float>()[0], 1.f);
}

}  // namespace
}  // namespace hmla
