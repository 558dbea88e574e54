// The MoE ops (hmla/ops/moe.h, docs/moe.md). On the CPU: the router's tie rule (the smaller index
// wins, in a group's rank and an expert's), the bias that chooses but does not weigh, the
// dispatch's order (slots grouped by expert, each expert's in token order) and the grouped
// products, which must give a per-expert loop of linear_fwd / linear_bwd bit for bit (MoeMlp's
// CPU bits did not change when it moved to them). On a CUDA device (the emulated one in
// test_cuda_emu) every op against the CPU over a case table: the routing, the dispatch and the
// gathers exactly (integer work or one rounding, the same formulas), the sums (route backward,
// combine, rowdot, grouped products) against float64 by the worst-case bound of their own f32
// summation (with bf16 operands, whose products are exact in f32). The whole MoE MLP's arithmetic
// against a float64 oracle is tests/model/test_moe.cpp's. The load-balancing ops' CUDA kernels
// equal the CPU's on their own case table.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "hmla/core/cuda.h"
#include "hmla/core/error.h"
#include "hmla/ops/backend.h"
#include "hmla/ops/moe.h"
#include "hmla/ops/nn.h"
#include "cases_moe.h"

namespace hmla {
namespace {

struct Routed {
  std::vector<int32_t> idx;
  std::vector<float> weight;
};

Routed route(const std::vector<float>& logits, const std::vector<float>& bias, int64_t G, int64_t TG, int64_t k,
             bool norm = true, float rsf = 1.f) {
  const int64_t E = int64_t(bias.size()), N = int64_t(logits.size()) / E;
  MoeRouting r{Tensor::empty({N, k}, DType::i32), Tensor::empty({N, k}, DType::f32), Tensor::empty({N, k}, DType::f32)};
  moe_route_fwd(Tensor::from_vector<float>({N, E}, logits), Tensor::from_vector<float>({E}, bias), {G, TG, norm, rsf}, r);
  return {r.idx.to_vector<int32_t>(), r.weight.to_vector<float>()};
}

TEST(MoeRouter, ExactTiesGoToTheSmallerIndex) {
  const std::vector<float> zero(8, 0.f);
  // Every score equal: groups 0 and 1 (of 4 groups of 2) are kept, experts 0, 1, 2 chosen in order.
  EXPECT_EQ(route(std::vector<float>(8, 0.5f), zero, 4, 2, 3).idx, std::vector<int32_t>({0, 1, 2}));
  // Groups 1 and 3 tie for the best (one kept): group 1's experts; inside it 2 and 3 tie: 2 first.
  EXPECT_EQ(route({0, 0, 2, 2, 0, 0, 2, 2}, zero, 4, 1, 2).idx, std::vector<int32_t>({2, 3}));
  // Experts 1 and 6 tie for the first place, 3 and 4 for the third: 1, 6, 3.
  EXPECT_EQ(route({0, 3, 0, 1, 1, 0, 3, 0}, zero, 1, 1, 3).idx, std::vector<int32_t>({1, 6, 3}));
  // A group is scored by its top two, not its top one: group 1 (1 + 1) beats group 0 (2 + -3).
  EXPECT_EQ(route({2, -3, 1, 1}, std::vector<float>(4, 0.f), 2, 1, 1).idx, std::vector<int32_t>({2}));
}

TEST(MoeRouter, TheBiasChoosesAndTheScoresWeigh) {
  // Expert 3's score is the smallest, but its bias makes it chosen first; its weight is its score.
  const std::vector<float> u{1.f, 0.5f, 0.f, -1.f};
  const Routed r = route(u, {0.f, 0.f, 0.f, 1.f}, 1, 1, 2, false, 2.f);
  EXPECT_EQ(r.idx, std::vector<int32_t>({3, 0}));
  EXPECT_FLOAT_EQ(r.weight[0], 2.f / (1.f + std::exp(1.f)));
  EXPECT_FLOAT_EQ(r.weight[1], 2.f / (1.f + std::exp(-1.f)));
  // Normalised: the chosen weights sum to routed_scaling_factor.
  const Routed n = route(u, {0.f, 0.f, 0.f, 1.f}, 1, 1, 2, true, 2.5f);
  EXPECT_NEAR(n.weight[0] + n.weight[1], 2.5f, 4 * FLT_EPSILON * 2.5f);
}

// DeepSeek-V4's router: s = sqrt(softplus(u)) (u above 20 passes softplus unchanged), one group,
// hash routing (the experts given), no bias. Forward: the choice and the weights from the
// definition; backward against the chain rule in float64 (itself checked by central differences
// of the float64 forward), hmla's f32 within twice the naive f32 chain rule's error plus 8 ulps.
template <class T>
T sqrtsoftplus(T u) { return std::sqrt(u > T(20) ? u : std::log1p(std::exp(u))); }
template <class T>
std::vector<T> v4_weights(const std::vector<T>& u, const std::vector<int32_t>& idx, int64_t E, int64_t k, T scale) {
  const int64_t N = int64_t(idx.size()) / k;
  std::vector<T> w(idx.size());
  for (int64_t t = 0; t < N; ++t) {
    T sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += sqrtsoftplus(u[size_t(t * E + idx[size_t(t * k + j)])]);
    for (int64_t j = 0; j < k; ++j) w[size_t(t * k + j)] = sqrtsoftplus(u[size_t(t * E + idx[size_t(t * k + j)])]) / (sum + T(1e-20)) * scale;
  }
  return w;
}
template <class T>
std::vector<T> v4_dlogits(const std::vector<T>& u, const std::vector<int32_t>& idx, const std::vector<T>& dw, int64_t E,
                          int64_t k, T scale) {
  const int64_t N = int64_t(idx.size()) / k;
  std::vector<T> du(u.size(), T(0));
  for (int64_t t = 0; t < N; ++t) {
    T S = 0, q = 0;
    for (int64_t j = 0; j < k; ++j) S += sqrtsoftplus(u[size_t(t * E + idx[size_t(t * k + j)])]);
    S += T(1e-20);
    for (int64_t j = 0; j < k; ++j) q += dw[size_t(t * k + j)] * sqrtsoftplus(u[size_t(t * E + idx[size_t(t * k + j)])]) / S * scale;
    for (int64_t j = 0; j < k; ++j) {
      const T x = u[size_t(t * E + idx[size_t(t * k + j)])], sj = sqrtsoftplus(x);
      const T dsp = x > T(20) ? T(1) : T(1) / (T(1) + std::exp(-x));
      du[size_t(t * E + idx[size_t(t * k + j)])] = (scale * dw[size_t(t * k + j)] - q) / S * dsp / (T(2) * sj);
    }
  }
  return du;
}

TEST(MoeRouter, DeepSeekV4SqrtSoftplusHashAndNoBias) {
  const int64_t N = 5, E = 6, k = 2;
  const float scale = 1.5f;
  std::vector<float> u(N * E);
  for (int64_t i = 0; i < N * E; ++i) u[size_t(i)] = float(std::sin(double(i) * 1.3) * 3.0);
  u[2] = 25.f;  // past softplus's threshold: chosen by token 0
  const std::vector<float> bias{0.f, 0.2f, -0.1f, 0.f, 0.3f, 0.f};
  const MoeRouter router{1, 1, true, scale, MoeScore::sqrtsoftplus};
  for (bool hash : {false, true}) {
    std::vector<int32_t> fixed;
    for (int64_t t = 0; t < N; ++t) fixed.push_back(int32_t(t % E)), fixed.push_back(int32_t((t + 3) % E));
    const MoeRouting r{Tensor::empty({N, k}, DType::i32), Tensor::empty({N, k}, DType::f32), Tensor::empty({N, k}, DType::f32)};
    const Tensor logits = Tensor::from_vector<float>({N, E}, u);
    moe_route_fwd(logits, hash ? Tensor() : Tensor::from_vector<float>({E}, bias), router, r,
                  hash ? Tensor::from_vector<int32_t>({N, k}, fixed) : Tensor());
    const std::vector<int32_t> idx = r.idx.to_vector<int32_t>();
    std::vector<int32_t> want = fixed;
    if (!hash)  // the top-k of s + bias, by the definition
      for (int64_t t = 0; t < N; ++t) {
        std::vector<std::pair<double, int32_t>> c;
        for (int32_t e = 0; e < E; ++e) c.push_back({-(sqrtsoftplus(double(u[size_t(t * E + e)])) + bias[size_t(e)]), e});
        std::sort(c.begin(), c.end());
        for (int64_t j = 0; j < k; ++j) want[size_t(t * k + j)] = c[size_t(j)].second;
      }
    EXPECT_EQ(idx, want) << (hash ? "hash" : "learned");
    const std::vector<double> u64(u.begin(), u.end());
    const std::vector<double> w64 = v4_weights<double>(u64, idx, E, k, scale);
    const std::vector<float> w32 = v4_weights<float>(u, idx, E, k, scale), got = r.weight.to_vector<float>();
    for (size_t i = 0; i < w64.size(); ++i)
      EXPECT_NEAR(got[i], w64[i], 2 * std::abs(double(w32[i]) - w64[i]) + 8 * std::ldexp(std::abs(w64[i]), -23)) << i;
    // Backward.
    std::vector<float> dw(N * k);
    for (size_t i = 0; i < dw.size(); ++i) dw[i] = float(std::cos(double(i) * 0.7));
    const std::vector<double> dw64(dw.begin(), dw.end());
    const std::vector<double> du64 = v4_dlogits<double>(u64, idx, dw64, E, k, scale);
    for (int64_t i = 0; i < N * E; ++i) {  // the float64 chain rule against central differences
      const double h = 1e-6;
      std::vector<double> up = u64, um = u64;
      up[size_t(i)] += h, um[size_t(i)] -= h;
      const std::vector<double> wp = v4_weights<double>(up, idx, E, k, scale), wm = v4_weights<double>(um, idx, E, k, scale);
      double fd = 0;
      for (size_t j = 0; j < wp.size(); ++j) fd += dw64[j] * (wp[j] - wm[j]) / (2 * h);
      EXPECT_NEAR(du64[size_t(i)], fd, 1e-7) << "the float64 chain rule at logit " << i;
    }
    Tensor dlogits = Tensor::empty({N, E}, DType::f32);
    moe_route_bwd(Tensor::from_vector<float>({N, k}, dw), r, router, dlogits, logits);
    const std::vector<float> du32 = v4_dlogits<float>(u, idx, dw, E, k, scale), gd = dlogits.to_vector<float>();
    for (size_t i = 0; i < gd.size(); ++i)
      EXPECT_NEAR(gd[i], du64[i], 2 * std::abs(double(du32[i]) - du64[i]) + 8 * std::ldexp(std::abs(du64[i]), -23)) << i;
    if (!cuda_backend() || cuda_device_count() == 0) continue;
    // The CUDA router (V4's routing in the device step): the CPU's choice exactly; the weights and
    // the logits' gradient exactly under the emulator (the same libm), else within 4 ulps (the
    // device's expf, log1pf and sqrtf are within 2 ulps each, then a division and a product; the
    // gradient within 8: ds/du adds a sigmoid and a division).
    const Device dev = Device::cuda;
    const MoeRouting rd{Tensor::empty({N, k}, DType::i32, dev), Tensor::empty({N, k}, DType::f32, dev),
                        Tensor::empty({N, k}, DType::f32, dev)};
    const Tensor ld = logits.to(dev);
    moe_route_fwd(ld, hash ? Tensor() : Tensor::from_vector<float>({E}, bias).to(dev), router, rd,
                  hash ? Tensor::from_vector<int32_t>({N, k}, fixed).to(dev) : Tensor());
    EXPECT_EQ(rd.idx.to(Device::cpu).to_vector<int32_t>(), idx) << (hash ? "hash" : "learned") << " on the device";
    Tensor dld = Tensor::empty({N, E}, DType::f32, dev);
    moe_route_bwd(Tensor::from_vector<float>({N, k}, dw).to(dev), rd, router, dld, ld);
    const std::vector<float> wd = rd.weight.to(Device::cpu).to_vector<float>(), gdd = dld.to(Device::cpu).to_vector<float>();
#ifdef HMLA_CUDA_EMULATE
    EXPECT_EQ(wd, got);
    EXPECT_EQ(gdd, gd);
#else
    for (size_t i = 0; i < wd.size(); ++i) EXPECT_NEAR(wd[i], got[i], 8 * std::ldexp(std::abs(got[i]), -24)) << i;
    for (size_t i = 0; i < gdd.size(); ++i) EXPECT_NEAR(gdd[i], gd[i], 16 * std::ldexp(std::abs(gd[i]), -24)) << i;
#endif
  }
}

TEST(MoeOps, TheDispatchGroupsSlotsByExpertInTokenOrder) {
  // 3 tokens, k = 2: slots 0..5 choose experts 2 0 | 0 1 | 2 1.
  const MoeDispatch d = moe_dispatch(Tensor::from_vector<int32_t>({3, 2}, {2, 0, 0, 1, 2, 1}), 3);
  EXPECT_EQ(d.order.to_vector<int32_t>(), std::vector<int32_t>({1, 2, 3, 5, 0, 4}));
  EXPECT_EQ(d.offsets.to_vector<int32_t>(), std::vector<int32_t>({0, 2, 4, 6}));
  EXPECT_EQ(d.pos.to_vector<int32_t>(), std::vector<int32_t>({4, 0, 1, 2, 5, 3}));
  EXPECT_THROW(moe_dispatch(Tensor::from_vector<int32_t>({1, 2}, {1, 1}), 3), ShapeError);  // an expert twice
  EXPECT_THROW(moe_dispatch(Tensor::from_vector<int32_t>({1, 2}, {0, 3}), 3), ShapeError);  // out of range
}

// ---- the case table -------------------------------------------------------------------------------

// N tokens over E experts in n_group groups (topk_group kept), k per token; D the rows' width
// (hidden), I the experts' width. `levels` > 0 draws the logits and the bias from that many
// values (exact ties planted); 0 draws them spread.
using op_cases::MoeCase;
using op_cases::moe_cases;

// A reproducible stream of values in [-1, 1) (a fixed LCG: the same on every platform), or, with
// levels > 0, of multiples of 1 / 4 from `levels` values.
std::vector<float> values(int64_t n, uint64_t seed, int levels = 0) {
  std::vector<float> v(static_cast<size_t>(n));
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (float& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const uint32_t r = uint32_t(s >> 40);  // 24 bits
    x = levels > 0 ? float(int(r % uint32_t(levels))) / 4.f : float(r) / float(1u << 23) - 1.f;
  }
  return v;
}

std::vector<float> host(const Tensor& t) { return t.to(Device::cpu).to_vector<float>(); }
std::vector<int32_t> host_i(const Tensor& t) { return t.to(Device::cpu).to_vector<int32_t>(); }
float bf16_round(float x) { return bf16_to_f32(f32_to_bf16(x)); }
constexpr double kU = 1.0 / (1 << 24);  // f32's unit roundoff

// f32 values as a tensor of `dt` on `dev` (bf16: rounded once).
Tensor make(const Shape& sh, const std::vector<float>& v, Device dev, DType dt = DType::f32) {
  const Tensor f = Tensor::from_vector<float>(sh, v).to(dev);
  if (dt == DType::f32) return f;
  const Tensor b = Tensor::empty(sh, dt, dev);
  convert(f, b);
  return b;
}
std::vector<float> rounded(std::vector<float> v) {
  for (float& x : v) x = bf16_round(x);
  return v;
}

// |got - ref| <= bound per value, with the first failure named.
void expect_within(const std::vector<float>& got, const std::vector<double>& ref, const std::vector<double>& bound,
                   const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(double(got[i]) - ref[i]) <= bound[i])) {
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", float64 " << ref[i] << ", bound " << bound[i];
      return;
    }
}

// One case's routed inputs on a device: the routing and the dispatch.
struct Routing {
  Tensor logits, bias;
  MoeRouting r;
  MoeDispatch d;
};
Routing route_on(const MoeCase& c, Device dev) {
  Routing o;
  o.logits = make({c.N, c.E}, values(c.N * c.E, 1, c.levels), dev);
  std::vector<float> b = values(c.E, 2, c.levels);
  for (float& x : b) x *= 0.25f;
  o.bias = make({c.E}, b, dev);
  o.r = {Tensor::empty({c.N, c.k}, DType::i32, dev), Tensor::empty({c.N, c.k}, DType::f32, dev),
         Tensor::empty({c.N, c.k}, DType::f32, dev)};
  moe_route_fwd(o.logits, o.bias, {c.G, c.TG, c.norm, c.rsf}, o.r);
  o.d = moe_dispatch(o.r.idx, c.E);
  return o;
}

// A row of the MoE case table on a device: the CPU runs every row against the float64 oracles, a
// CUDA device (the emulated one in test_cuda_emu) the same and against the CPU where exact.
struct MoeRow {
  MoeCase c;
  Device dev;
};
void PrintTo(const MoeRow& r, std::ostream* os) { *os << r.c.name << " on " << device_name(r.dev); }

class MoeTable : public ::testing::TestWithParam<MoeRow> {
 protected:
  void SetUp() override {
    if (GetParam().dev == Device::cuda && (!cuda_backend() || cuda_device_count() == 0)) GTEST_SKIP() << "no CUDA device";
  }
};
// The activations' dtypes a device's MoE ops read: bf16 ones are CUDA's.
std::vector<DType> act_dtypes(Device dev) {
  return dev == Device::cuda ? std::vector<DType>{DType::f32, DType::bf16} : std::vector<DType>{DType::f32};
}

// The router in float64 (DESIGN.md section 9): scores sigmoid(u); the choice on scores + bias,
// group-limited (a group scored by its top two choice scores, the best topk_group groups), then
// the k best experts of the kept groups in descending choice; exact ties to the smaller index;
// weights the chosen scores (normalised over the chosen when norm) times routed_scaling_factor.
struct RefRouting {
  std::vector<int32_t> idx;
  std::vector<double> weight;
};
RefRouting ref_route(const MoeCase& c, const std::vector<float>& u, const std::vector<float>& bias) {
  RefRouting r;
  const int64_t per = c.E / c.G;
  for (int64_t t = 0; t < c.N; ++t) {
    std::vector<double> sc(size_t(c.E)), ch(size_t(c.E));
    for (int64_t e = 0; e < c.E; ++e) {
      sc[size_t(e)] = 1.0 / (1.0 + std::exp(-double(u[size_t(t * c.E + e)])));
      ch[size_t(e)] = sc[size_t(e)] + bias[size_t(e)];
    }
    auto better = [&](const std::vector<double>& v, int64_t a, int64_t b) { return v[size_t(a)] > v[size_t(b)] || (v[size_t(a)] == v[size_t(b)] && a < b); };
    std::vector<double> gs(size_t(c.G));
    for (int64_t g = 0; g < c.G; ++g) {
      std::vector<double> m(ch.begin() + g * per, ch.begin() + (g + 1) * per);
      std::sort(m.rbegin(), m.rend());
      gs[size_t(g)] = m[0] + (per > 1 ? m[1] : 0.0);
    }
    std::vector<int64_t> groups(size_t(c.G));
    std::iota(groups.begin(), groups.end(), 0);
    std::stable_sort(groups.begin(), groups.end(), [&](int64_t a, int64_t b) { return better(gs, a, b); });
    std::vector<int64_t> cand;
    for (int64_t g = 0; g < c.TG; ++g)
      for (int64_t e = groups[size_t(g)] * per; e < (groups[size_t(g)] + 1) * per; ++e) cand.push_back(e);
    std::sort(cand.begin(), cand.end(), [&](int64_t a, int64_t b) { return better(ch, a, b); });
    double den = 0;
    for (int64_t j = 0; j < c.k; ++j) den += sc[size_t(cand[size_t(j)])];
    for (int64_t j = 0; j < c.k; ++j) {
      r.idx.push_back(int32_t(cand[size_t(j)]));
      r.weight.push_back(sc[size_t(cand[size_t(j)])] / (c.norm ? den : 1.0) * c.rsf);
    }
  }
  return r;
}

// The router and the dispatch: the chosen experts exactly and the weights within 8 ulps (expf's
// last bit, the sum of k scores, one division, one product) of the float64 router; on a CUDA
// device the order, positions and bounds exactly the CPU's, the scores and weights exactly under
// the emulator (the same expf), within 4 ulps on a device (CUDA's expf is within 2 ulps, then one
// division and one product).
TEST_P(MoeTable, RoutingAndDispatchEqualTheCpus) {
  const MoeCase& c = GetParam().c;
  const Device dev = GetParam().dev;
  const Routing cpu = route_on(c, Device::cpu), gpu = route_on(c, dev);
  std::vector<float> b = values(c.E, 2, c.levels);
  for (float& x : b) x *= 0.25f;
  const RefRouting ref = ref_route(c, values(c.N * c.E, 1, c.levels), b);
  EXPECT_EQ(host_i(cpu.r.idx), ref.idx) << "the float64 router's choice";
  std::vector<double> rb(ref.weight.size());
  for (size_t i = 0; i < rb.size(); ++i) rb[i] = 8 * kU * std::abs(ref.weight[i]);
  expect_within(host(cpu.r.weight), ref.weight, rb, "weight (float64 router)");
  EXPECT_EQ(host_i(gpu.r.idx), host_i(cpu.r.idx));
  EXPECT_EQ(host_i(gpu.d.order), host_i(cpu.d.order));
  EXPECT_EQ(host_i(gpu.d.pos), host_i(cpu.d.pos));
  EXPECT_EQ(host_i(gpu.d.offsets), host_i(cpu.d.offsets));
  const std::vector<float> ws = host(cpu.r.weight), ss = host(cpu.r.score);
#ifdef HMLA_CUDA_EMULATE
  EXPECT_EQ(host(gpu.r.weight), ws);
  EXPECT_EQ(host(gpu.r.score), ss);
#else
  std::vector<double> w64(ws.begin(), ws.end()), s64(ss.begin(), ss.end()), wb(ws.size()), sb(ss.size());
  for (size_t i = 0; i < ws.size(); ++i) wb[i] = 4 * 2 * kU * std::abs(ws[i]), sb[i] = 4 * 2 * kU * std::abs(ss[i]);
  expect_within(host(gpu.r.weight), w64, wb, "weight");
  expect_within(host(gpu.r.score), s64, sb, "score");
#endif
  // The case meant to leave experts without rows does.
  if (c.name == "empty_experts") {
    const std::vector<int32_t> off = host_i(cpu.d.offsets);
    int empty = 0;
    for (int64_t e = 0; e < c.E; ++e) empty += off[size_t(e)] == off[size_t(e + 1)];
    EXPECT_GE(empty, 8) << "the case must leave experts without rows";
  }
}

// The router's backward against float64 from the same inputs (score, idx, dweight): its f32
// arithmetic is a sum of k products for q and a few roundings per value, bounded by
// (2k + 8) u times the magnitudes that enter.
TEST_P(MoeTable, TheRoutersBackwardIsWithinItsRounding) {
  const MoeCase& c = GetParam().c;
  const Device dev = GetParam().dev;
  const Routing gpu = route_on(c, dev);
  const std::vector<float> s = host(gpu.r.score), dw = values(c.N * c.k, 3);
  const std::vector<int32_t> idx = host_i(gpu.r.idx);
  const Tensor dlogits = Tensor::empty({c.N, c.E}, DType::f32, dev);
  moe_route_bwd(make({c.N, c.k}, dw, dev), gpu.r, {1, 1, c.norm, c.rsf}, dlogits);
  std::vector<double> ref(size_t(c.N * c.E), 0.0), bound(ref.size(), 0.0);
  for (int64_t t = 0; t < c.N; ++t) {
    double den = 1.0, q = 0.0, qmag = 0.0;
    if (c.norm) {
      den = 1e-20;
      for (int64_t j = 0; j < c.k; ++j) den += s[size_t(t * c.k + j)];
      for (int64_t j = 0; j < c.k; ++j) {
        const double wj = s[size_t(t * c.k + j)] / den * c.rsf, dwj = dw[size_t(t * c.k + j)];
        q += dwj * wj, qmag += std::abs(dwj * wj);
      }
    }
    for (int64_t j = 0; j < c.k; ++j) {
      const size_t sl = size_t(t * c.k + j), at = size_t(t * c.E + idx[sl]);
      const double sj = s[sl], g = sj * (1 - sj);
      ref[at] = (c.rsf * dw[sl] - q) / den * g;
      bound[at] = double(2 * c.k + 8) * kU * (c.rsf * std::abs(dw[sl]) + qmag) / den * g;
    }
  }
  expect_within(host(dlogits), ref, bound, "dlogits");
}

// Gathers move values (and scale by one product): exact against the CPU, from f32 and from bf16
// rows. The combine and the row dot sum k (D) products in order: (k + 1) u (D u) times the sum of
// their magnitudes, plus the final add's rounding.
TEST_P(MoeTable, TheRowOpsMoveExactlyAndSumWithinTheirRounding) {
  const MoeCase& c = GetParam().c;
  const Device dev = GetParam().dev;
  const Routing cpu = route_on(c, Device::cpu), gpu = route_on(c, dev);
  const int64_t S = c.N * c.k;
  const std::vector<float> x = values(c.N * c.D, 4), rows = values(S * c.D, 5), w = values(S, 6), y0 = values(c.N * c.D, 7);
  for (DType dt : act_dtypes(dev)) {
    const std::vector<float> xv = dt == DType::bf16 ? rounded(x) : x, rv = dt == DType::bf16 ? rounded(rows) : rows;
    for (bool tokens : {true, false}) {
      const Tensor out_c = Tensor::empty({S, c.D}, DType::f32), out_g = Tensor::empty({S, c.D}, DType::f32, dev);
      const std::vector<float>& src = tokens ? xv : rv;
      const Shape sh = tokens ? Shape{c.N, c.D} : Shape{S, c.D};
      moe_gather(make(sh, src, Device::cpu), cpu.d, c.k, make({S}, w, Device::cpu), tokens, out_c);
      moe_gather(make(sh, src, dev, dt), gpu.d, c.k, make({S}, w, dev), tokens, out_g);
      EXPECT_EQ(host(out_g), host(out_c)) << "gather, from_tokens " << tokens << ", " << dtype_name(dt);
    }
  }
  // combine(rows, w) + y0 and rowdot(rows, x rows) against float64, by the dispatch's own positions.
  const std::vector<int32_t> pos = host_i(cpu.d.pos), order = host_i(cpu.d.order);
  const Tensor out = make({c.N, c.D}, y0, dev);
  moe_combine(make({S, c.D}, rows, dev), gpu.d, c.k, make({S}, w, dev), true, out);
  std::vector<double> ref(size_t(c.N * c.D)), bound(ref.size());
  for (int64_t t = 0; t < c.N; ++t)
    for (int64_t d = 0; d < c.D; ++d) {
      double sum = 0, mag = 0;
      for (int64_t j = 0; j < c.k; ++j) {
        const double v = double(w[size_t(t * c.k + j)]) * rows[size_t(pos[size_t(t * c.k + j)] * c.D + d)];
        sum += v, mag += std::abs(v);
      }
      const size_t i = size_t(t * c.D + d);
      ref[i] = sum + y0[i];
      bound[i] = double(c.k + 1) * kU * mag + kU * (std::abs(ref[i]) + mag);
    }
  expect_within(host(out), ref, bound, "combine");
  const Tensor dots = Tensor::empty({S}, DType::f32, dev);
  const std::vector<float> a = values(S * c.D, 8);
  const DType rows_dt = act_dtypes(dev).back();  // bf16 rows where the device reads them
  moe_rowdot(make({S, c.D}, a, dev), make({S, c.D}, rows, dev, rows_dt), gpu.d, c.k, dots);
  const std::vector<float> rb = rows_dt == DType::bf16 ? rounded(rows) : rows;
  std::vector<double> dref(static_cast<size_t>(S)), dbound(static_cast<size_t>(S));
  for (int64_t i = 0; i < S; ++i) {
    double sum = 0, mag = 0;
    for (int64_t d = 0; d < c.D; ++d) {
      const double v = double(a[size_t(i * c.D + d)]) * rb[size_t(i * c.D + d)];
      sum += v, mag += std::abs(v);
    }
    dref[size_t(order[size_t(i)])] = sum, dbound[size_t(order[size_t(i)])] = double(c.D) * kU * mag;
  }
  expect_within(host(dots), dref, dbound, "rowdot");
}

// E expert matrices [out, in] as slices of one arena (the parameter table's layout), f32.
std::vector<Tensor> experts_of(const Tensor& arena, int64_t E, int64_t out, int64_t in) {
  std::vector<Tensor> w;
  for (int64_t e = 0; e < E; ++e) w.push_back(arena.slice(0, e * out * in, (e + 1) * out * in).view({out, in}));
  return w;
}

// The grouped products: y = x W_e^T, dx = dy W_e (+ dx), dW_e += dy_e^T x_e. On a CUDA device from
// f32 and from bf16 operands (the MoE MLP's mixes), against float64 on the bf16-rounded operands
// (the products' contract): a product of two bf16 values is exact in f32, so the only error is the
// sum's: at most (K - 1) u times the sum of the terms' magnitudes for K terms, plus the one
// rounding of the added value and of a bf16 output (2^-8). On the CPU from f32 operands: K u over
// K rounded products and their sum, and an added gradient as added_bound says.
TEST_P(MoeTable, TheGroupedProductsAreWithinTheirSumsRounding) {
  const MoeCase& c = GetParam().c;
  const Device dev = GetParam().dev;
  const Routing gpu = route_on(c, dev);
  const int64_t S = c.N * c.k, in = c.D, out = c.I, E = c.E;
  const std::vector<int32_t> off = host_i(gpu.d.offsets);
  const std::vector<float> x = values(S * in, 9), Wv = values(E * out * in, 10), dy = values(S * out, 11),
                           dx0 = values(S * in, 12), dW0 = values(E * out * in, 13);
  // CUDA's products round their operands to bf16 (the products' contract: nn.h); the CPU's are f32.
  const bool rounds = dev == Device::cuda;
  // An added gradient C = C0 + sum of K products: CUDA's kernel sums the K products, then adds C0
  // once (K u on the products, one rounding of the add); the CPU's GEMM adds into C over its K
  // panels (docs/ops.md), so C0 is one more summand of a sum of K + 1 values in some order, each
  // through at most K + 1 roundings: (K + 1) u times all their magnitudes.
  auto added_bound = [&](int64_t K, double mag, double sum, double c0) {
    return rounds ? double(K) * kU * mag + kU * (std::abs(sum) + std::abs(c0)) : double(K + 1) * kU * (mag + std::abs(c0));
  };
  const std::vector<float> xr = rounds ? rounded(x) : x, Wr = rounds ? rounded(Wv) : Wv, dyr = rounds ? rounded(dy) : dy;
  auto expert_of = [&](int64_t r) {
    int64_t e = 0;
    while (off[size_t(e + 1)] <= r) ++e;
    return e;
  };
  for (DType dt : act_dtypes(dev)) {
    const double out_round = dt == DType::bf16 ? 1.0 / 256 : 0.0;
    const Tensor W = make({E * out * in}, Wv, dev, dt);
    const std::vector<Tensor> Ws = experts_of(W, E, out, in);
    // y = x W_e^T, y in dt.
    const Tensor y = Tensor::empty({S, out}, dt, dev);
    moe_grouped_fwd(make({S, in}, x, dev, dt), Ws, gpu.d, y);
    std::vector<double> ref(size_t(S * out)), bound(ref.size());
    for (int64_t r = 0; r < S; ++r)
      for (int64_t o = 0; o < out; ++o) {
        const int64_t e = expert_of(r);
        double sum = 0, mag = 0;
        for (int64_t i = 0; i < in; ++i) {
          const double v = double(xr[size_t(r * in + i)]) * Wr[size_t((e * out + o) * in + i)];
          sum += v, mag += std::abs(v);
        }
        ref[size_t(r * out + o)] = sum;
        bound[size_t(r * out + o)] = double(in) * kU * mag + out_round * std::abs(sum);
      }
    Tensor yf = Tensor::empty({S, out}, DType::f32, dev);
    convert(y, yf);
    expect_within(host(yf), ref, bound, std::string("y, ") + dtype_name(dt));
    // dW += dy^T x (f32) and dx = dy W_e + dx0 (dx f32; dy f32, x and W in dt).
    const Tensor dWa = make({E * out * in}, dW0, dev), dx = make({S, in}, dx0, dev);
    moe_grouped_bwd(make({S, out}, dy, dev), make({S, in}, x, dev, dt), Ws,
                    experts_of(dWa, E, out, in), gpu.d, dx, 1.f);
    std::vector<double> dxr(size_t(S * in)), dxb(dxr.size()), dWr(size_t(E * out * in)), dWb(dWr.size());
    for (int64_t r = 0; r < S; ++r)
      for (int64_t i = 0; i < in; ++i) {
        const int64_t e = expert_of(r);
        double sum = 0, mag = 0;
        for (int64_t o = 0; o < out; ++o) {
          const double v = double(dyr[size_t(r * out + o)]) * Wr[size_t((e * out + o) * in + i)];
          sum += v, mag += std::abs(v);
        }
        const size_t at = size_t(r * in + i);
        dxr[at] = sum + dx0[at];
        dxb[at] = added_bound(out, mag, sum, dx0[at]);
      }
    for (int64_t e = 0; e < E; ++e)
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) {
          double sum = 0, mag = 0;
          for (int64_t r = off[size_t(e)]; r < off[size_t(e + 1)]; ++r) {
            const double v = double(dyr[size_t(r * out + o)]) * xr[size_t(r * in + i)];
            sum += v, mag += std::abs(v);
          }
          const size_t at = size_t((e * out + o) * in + i);
          dWr[at] = sum + dW0[at];
          dWb[at] = added_bound(off[size_t(e + 1)] - off[size_t(e)], mag, sum, dW0[at]);
        }
    expect_within(host(dx), dxr, dxb, std::string("dx, ") + dtype_name(dt));
    expect_within(host(dWa), dWr, dWb, std::string("dW, ") + dtype_name(dt));
  }
}

// The table on each device: the CPU's rows (test_ops) and CUDA's (test_cuda_emu, a device).
std::vector<MoeRow> rows_on(Device dev) {
  std::vector<MoeRow> rows;
  for (const MoeCase& c : moe_cases()) rows.push_back({c, dev});
  return rows;
}
std::string row_name(const ::testing::TestParamInfo<MoeRow>& i) { return i.param.c.name; }
INSTANTIATE_TEST_SUITE_P(Cpu, MoeTable, ::testing::ValuesIn(rows_on(Device::cpu)), row_name);
INSTANTIATE_TEST_SUITE_P(Table, MoeTable, ::testing::ValuesIn(rows_on(Device::cuda)), row_name);

// On the CPU the grouped products are linear_fwd / linear_bwd expert after expert: the same bits
// as that loop (empty experts included), so MoeMlp's CPU results did not change with them.
TEST(MoeOps, TheCpuGroupedProductsAreThePerExpertLoopBitForBit) {
  const MoeCase c = moe_cases()[3];  // empty experts
  for (const MoeCase& cs : {c, moe_cases()[4]}) {
    const Routing cpu = route_on(cs, Device::cpu);
    const int64_t S = cs.N * cs.k, in = cs.D, out = cs.I, E = cs.E;
    const std::vector<int32_t> off = cpu.d.offsets.to_vector<int32_t>();
    const Tensor x = make({S, in}, values(S * in, 9), Device::cpu), dy = make({S, out}, values(S * out, 11), Device::cpu);
    const Tensor W = make({E * out * in}, values(E * out * in, 10), Device::cpu);
    const std::vector<Tensor> Ws = experts_of(W, E, out, in);
    const Tensor y = Tensor::zeros({S, out}, DType::f32), y_loop = Tensor::zeros({S, out}, DType::f32);
    const Tensor dW = Tensor::from_vector<float>({E * out * in}, values(E * out * in, 13));
    const Tensor dW_loop = dW.clone();
    const Tensor dx = Tensor::from_vector<float>({S, in}, values(S * in, 12)), dx_loop = dx.clone();
    moe_grouped_fwd(x, Ws, cpu.d, y);
    moe_grouped_bwd(dy, x, Ws, experts_of(dW, E, out, in), cpu.d, dx, 1.f);
    const std::vector<Tensor> dWs = experts_of(dW_loop, E, out, in);
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = off[size_t(e)], r1 = off[size_t(e + 1)];
      if (r0 == r1) continue;
      linear_fwd(x.slice(0, r0, r1), Ws[size_t(e)], y_loop.slice(0, r0, r1));
      linear_bwd(dy.slice(0, r0, r1), x.slice(0, r0, r1), Ws[size_t(e)], dWs[size_t(e)], dx_loop.slice(0, r0, r1), 1.f);
    }
    EXPECT_EQ(y.to_vector<float>(), y_loop.to_vector<float>()) << cs.name;
    EXPECT_EQ(dW.to_vector<float>(), dW_loop.to_vector<float>()) << cs.name;
    EXPECT_EQ(dx.to_vector<float>(), dx_loop.to_vector<float>()) << cs.name;
  }
  // Bad input: a weight of another shape, a gradient table of another length.
  const Routing cpu = route_on(c, Device::cpu);
  std::vector<Tensor> Ws(size_t(c.E), Tensor::zeros({4, c.D}, DType::f32));
  Ws[1] = Tensor::zeros({5, c.D}, DType::f32);
  EXPECT_THROW(moe_grouped_fwd(Tensor::zeros({c.N * c.k, c.D}, DType::f32), Ws, cpu.d,
                               Tensor::zeros({c.N * c.k, 4}, DType::f32)),
               ShapeError);
}

// A bf16 activation on the CPU is refused with the dispatch's one-line error (bf16 is CUDA's).
TEST(MoeOps, TheCpuRefusesBf16Rows) {
  const MoeDispatch d = moe_dispatch(Tensor::from_vector<int32_t>({1, 2}, {0, 1}), 2);
  try {
    moe_gather(Tensor::zeros({1, 4}, DType::bf16), d, 2, Tensor(), true, Tensor::zeros({2, 4}, DType::f32));
    ADD_FAILURE() << "accepted";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("moe_gather: the cpu backend does not run"), std::string::npos) << e.what();
  }
}

// The load-balancing ops on a CUDA device (moe_balance.cu; the emulated one in test_cuda_emu)
// against the CPU kernels on one case table: the load (integer counts) and the bias update exactly;
// the balance loss and its gradient within 8 f32 ulps of the magnitudes that enter per term (the
// two differ only in expf's last bits and the compiler's contraction).
TEST(MoeOps, TheBalancingOpsOnCudaEqualTheCpus) {
  if (!cuda_backend() || cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const int64_t rows = 3, N = rows * 5, E = 8, k = 2;
  std::vector<int32_t> idx;
  std::vector<float> mask(size_t(N), 1.f), u(size_t(N * E));
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < k; ++j) idx.push_back(int32_t((t * 3 + j * 5) % E));
  mask[4] = mask[9] = 0.f;
  for (size_t i = 0; i < u.size(); ++i) u[i] = float(std::sin(double(i) * 1.7)) * 2.f;
  auto on = [](const Tensor& t, Device d) { return d == Device::cpu ? t.clone() : t.to(d); };
  std::vector<double> loads[2];
  std::vector<float> biases[2], dls[2];
  double losses[2];
  for (int di = 0; di < 2; ++di) {
    const Device d = di ? Device::cuda : Device::cpu;
    const Tensor id = on(Tensor::from_vector<int32_t>({N, k}, idx), d);
    const Tensor m = on(Tensor::from_vector<float>({N}, mask), d);
    const Tensor load = on(Tensor::from_vector<double>({rows, E}, std::vector<double>(size_t(rows * E), 1.0)), d);
    moe_expert_load(id, m, rows, true, load);
    loads[di] = load.to(Device::cpu).to_vector<double>();
    const Tensor bias = on(Tensor::from_vector<float>({E}, {0.5f, -0.25f, 0.f, 0.125f, 1.f, 0.f, -1.f, 0.25f}), d);
    const Tensor total = Tensor::zeros({1, E}, DType::f64, d);
    moe_expert_load(id, m, 1, false, total);
    moe_bias_update(bias, total.view({E}), 0.01f);
    biases[di] = bias.to(Device::cpu).to_vector<float>();
    const Tensor counts = Tensor::zeros({rows, E}, DType::f64, d), dl = Tensor::zeros({N, E}, DType::f32, d);
    const Tensor loss = Tensor::zeros({1}, DType::f64, d);
    moe_expert_load(id, m, rows, false, counts);
    moe_aux_loss(on(Tensor::from_vector<float>({N, E}, u), d), counts, m, k, 0.3, dl, loss);
    dls[di] = dl.to(Device::cpu).to_vector<float>();
    losses[di] = loss.to(Device::cpu).to_vector<double>()[0];
  }
  EXPECT_EQ(loads[1], loads[0]);
  EXPECT_EQ(biases[1], biases[0]);
  EXPECT_NEAR(losses[1], losses[0], 8 * FLT_EPSILON * std::abs(losses[0]));
  float gmax = 0;
  for (float g : dls[0]) gmax = std::max(gmax, std::abs(g));
  ASSERT_GT(gmax, 0.f);
  for (size_t i = 0; i < dls[0].size(); ++i) EXPECT_NEAR(dls[1][i], dls[0][i], 8 * FLT_EPSILON * gmax) << i;
}

}  // namespace
}  // namespace hmla
