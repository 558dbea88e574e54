// Dense attention on the CPU against the float64 oracle (tolerance rule of STYLE.md), central
// finite differences of the oracle itself, empty rows, determinism, memory and bad input.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>

#include "attn_dense_ref.h"
#include "case_support.h"
#include "hmla/ops/attention.h"
#include "testing.h"

namespace hmla {
namespace {

using testing::randn;
using testing::rows_of;
using testing::to_f64;

using Case = op_cases::AttnDenseCase;

DocLayout make_layout(const Case& c) {
  if (!c.end_rows.empty()) return layout_from_end_rows(c.b, c.s, c.end_rows);
  return c.cu.empty() ? layout_causal(c.b, c.s) : layout_from_cu_seqlens(c.s, c.cu);
}

int64_t row0(const Case& c) { return std::max<int64_t>(c.q_row0, 0); }

struct Inputs {
  std::vector<float> q, k, v, sink, dout;
};

Inputs make_inputs(const Case& c, uint64_t seed) {
  Inputs x;
  x.q = randn(c.b * c.s * c.H * c.Dqk, seed);
  x.k = randn(c.b * c.s * c.Hkv * c.Dqk, seed + 1);
  if (c.v_from_k) {
    for (int64_t r = 0; r < c.b * c.s * c.Hkv; ++r)
      x.v.insert(x.v.end(), x.k.begin() + r * c.Dqk, x.k.begin() + r * c.Dqk + c.Dv);
  } else {
    x.v = randn(c.b * c.s * c.Hkv * c.Dv, seed + 2);
  }
  if (c.sink) x.sink = randn(c.H, seed + 3);
  x.dout = randn(c.b * c.s * c.H * c.Dv, seed + 4);
  for (int64_t bb = 0; bb < c.b; ++bb)  // a row slice: the rows before it take no gradient
    std::fill(x.dout.begin() + bb * c.s * c.H * c.Dv, x.dout.begin() + (bb * c.s + row0(c)) * c.H * c.Dv, 0.f);
  return x;
}

struct KernelResult {
  std::vector<float> out, lse, dq, dk, dv, dsink;
};

// The kernel on the case's query rows [row0, s).
KernelResult run_kernel(const Case& c, const Inputs& x, const DocLayout& layout, float scale) {
  const int64_t r0 = row0(c), sq = c.s - r0;
  AttnDenseInputs in;
  in.q = Tensor::from_vector<float>({c.b, sq, c.H, c.Dqk}, rows_of(x.q, c.b, c.s, c.H * c.Dqk, r0, sq));
  in.q_row0 = r0;
  in.k = Tensor::from_vector<float>({c.b, c.s, c.Hkv, c.Dqk}, x.k);
  in.v = c.v_from_k ? in.k.slice(3, 0, c.Dv) : Tensor::from_vector<float>({c.b, c.s, c.Hkv, c.Dv}, x.v);
  if (c.sink) in.sink = Tensor::from_vector<float>({c.H}, x.sink);
  in.layout = &layout;
  in.scale = scale;
  AttnDenseSaved sv = attn_dense_fwd(in);
  AttnDenseGrads g =
      attn_dense_bwd(in, sv, Tensor::from_vector<float>({c.b, sq, c.H, c.Dv}, rows_of(x.dout, c.b, c.s, c.H * c.Dv, r0, sq)));
  KernelResult r{sv.out.to_vector<float>(), sv.lse.to_vector<float>(), g.dq.to_vector<float>(),
                 g.dk.to_vector<float>(), g.dv.to_vector<float>(), {}};
  if (c.sink) r.dsink = g.dsink.to_vector<float>();
  return r;
}

double max_abs(const std::vector<float>& x) {
  double m = 0;
  for (float v : x) m = std::max(m, double(std::abs(v)));
  return m;
}

// The terms that cancel in dS = P (dP - D): dP(t,j) = dO(t) . v(j) and D(t) = dO(t) . o(t), each
// a sum at most max over j in A(t) of sum_c |dO(t,c) v(j,c)| (o is a convex mix of the v(j)). In
// a one-token document dP = D and dq, dk are exactly 0, yet a kernel that sums either dot
// product in another order keeps their rounding; dq and dk carry it times scale * max|k| (|q|).
double dscore_terms(const Case& c, const Inputs& x, const std::vector<int32_t>& doc_start) {
  double m = 0;
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t t = 0; t < c.s; ++t)
      for (int64_t h = 0; h < c.H; ++h) {
        const float* dO = &x.dout[((b * c.s + t) * c.H + h) * c.Dv];
        for (int64_t j = doc_start[b * c.s + t]; j <= t; ++j) {
          const float* v = &x.v[((b * c.s + j) * c.Hkv + h / (c.H / c.Hkv)) * c.Dv];
          double sum = 0;
          for (int64_t e = 0; e < c.Dv; ++e) sum += std::abs(double(dO[e]) * v[e]);
          m = std::max(m, sum);
        }
      }
  return m;
}

class AttnDenseCases : public ::testing::TestWithParam<Case> {};

TEST_P(AttnDenseCases, MatchesFloat64OracleByTheRule) {
  const Case& c = GetParam();
  Inputs x = make_inputs(c, 42);
  DocLayout layout = make_layout(c);
  const float scale = 1.f / std::sqrt(float(c.Dqk));
  KernelResult k = run_kernel(c, x, layout, scale);
  ref::AttnDims d{c.b, c.s, c.H, c.Hkv, c.Dqk, c.Dv};
  std::vector<int32_t> ds = layout.doc_start.to_vector<int32_t>();
  auto o64 = ref::attn_dense_ref<double>(d, to_f64(x.q), to_f64(x.k), to_f64(x.v), ds,
                                         to_f64(x.sink), double(scale), to_f64(x.dout));
  auto o32 = ref::attn_dense_ref<float>(d, x.q, x.k, x.v, ds, x.sink, scale, x.dout);
  // Query-row outputs on the case's rows [r0, s); dk, dv, dsink whole (dout is 0 before r0).
  const int64_t r0 = row0(c), sq = c.s - r0;
  auto rows = [&](const auto& v, int64_t outer, int64_t width) { return rows_of(v, outer, c.s, width, r0, sq); };
  testing::expect_within_rule("out", k.out, rows(o32.out, c.b, c.H * c.Dv), rows(o64.out, c.b, c.H * c.Dv));
  testing::expect_within_rule("lse", k.lse, rows(o32.lse, c.b * c.H, 1), rows(o64.lse, c.b * c.H, 1));
  const double dS = scale * dscore_terms(c, x, ds);
  testing::expect_within_rule("dq", k.dq, rows(o32.dq, c.b, c.H * c.Dqk), rows(o64.dq, c.b, c.H * c.Dqk),
                              dS * max_abs(x.k));
  testing::expect_within_rule("dk", k.dk, o32.dk, o64.dk, dS * max_abs(x.q) * (c.H / c.Hkv));
  testing::expect_within_rule("dv", k.dv, o32.dv, o64.dv);
  if (c.sink) testing::expect_within_rule("dsink", k.dsink, o32.dsink, o64.dsink);
}

INSTANTIATE_TEST_SUITE_P(Table, AttnDenseCases,
                         ::testing::ValuesIn(op_cases::run_by(&cpu_backend(), DType::f32, op_cases::attn_dense())),
                         op_cases::RowName());

// The CPU runs every row of the table: its supports() drops none of them from the suite above.
TEST(AttnDenseCases, TheCpuRunsEveryRow) {
  EXPECT_EQ(op_cases::rows_not_run(cpu_backend(), DType::f32, op_cases::attn_dense()), "");
}

// The oracle's own gradients against central finite differences of L = sum(out * dout).
TEST(AttnDenseOracle, GradientsMatchFiniteDifferences) {
  ref::AttnDims d{1, 7, 2, 1, 4, 3};
  const std::vector<int32_t> ds{0, 0, 0, 3, 3, 5, 7};  // docs [0,3), [3,5), [5,6), row 6 padding
  auto q = to_f64(randn(7 * 2 * 4, 1)), k = to_f64(randn(7 * 4, 2)), v = to_f64(randn(7 * 3, 3));
  auto sink = to_f64(randn(2, 4)), dout = to_f64(randn(7 * 2 * 3, 5));
  const double scale = 0.7;
  auto base = ref::attn_dense_ref<double>(d, q, k, v, ds, sink, scale, dout);
  auto loss = [&] {
    auto r = ref::attn_dense_ref<double>(d, q, k, v, ds, sink, scale, {});
    double L = 0;
    for (size_t i = 0; i < r.out.size(); ++i) L += r.out[i] * dout[i];
    return L;
  };
  testing::expect_fd_gradient(q, base.dq, loss, "dq");
  testing::expect_fd_gradient(k, base.dk, loss, "dk");
  testing::expect_fd_gradient(v, base.dv, loss, "dv");
  testing::expect_fd_gradient(sink, base.dsink, loss, "dsink");
}

TEST(AttnDense, EmptyRowsAreZeroWithInfiniteLse) {
  Case c{"all_padding", op_cases::Oracle::attn_dense_ref, 1, 9, 2, 1, 8, 8, {}, std::vector<int64_t>(9, 0), true};
  Inputs x = make_inputs(c, 7);
  DocLayout layout = make_layout(c);
  KernelResult k = run_kernel(c, x, layout, 0.3f);
  for (float v : k.out) EXPECT_EQ(v, 0.f);
  for (float v : k.lse) EXPECT_EQ(v, INFINITY);
  for (const auto* g : {&k.dq, &k.dk, &k.dv, &k.dsink})
    for (float v : *g) EXPECT_EQ(v, 0.f);
}

std::vector<uint32_t> bits(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * 4);
  return b;
}

TEST(AttnDense, DeterministicAcrossRunsAndThreadCounts) {
  Case c{"det", op_cases::Oracle::attn_dense_ref, 2, 200, 4, 4, 32, 16, {{0, 70, 200}, {0, 130, 190}}, {}, true};
  Inputs x = make_inputs(c, 11);
  DocLayout layout = make_layout(c);
  KernelResult a = run_kernel(c, x, layout, 0.2f), b = run_kernel(c, x, layout, 0.2f);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  KernelResult one = run_kernel(c, x, layout, 0.2f);
  omp_set_num_threads(threads);
  for (const auto& r : {b, one}) {  // MHA: no slicing, so even the thread count cannot matter
    EXPECT_EQ(bits(a.out), bits(r.out));
    EXPECT_EQ(bits(a.lse), bits(r.lse));
    EXPECT_EQ(bits(a.dq), bits(r.dq));
    EXPECT_EQ(bits(a.dk), bits(r.dk));
    EXPECT_EQ(bits(a.dv), bits(r.dv));
    EXPECT_EQ(bits(a.dsink), bits(r.dsink));
  }
  Case m = c;  // MQA: bit-identical run to run at a fixed thread count
  m.Hkv = 1;
  Inputs y = make_inputs(m, 12);
  KernelResult p = run_kernel(m, y, layout, 0.2f), q = run_kernel(m, y, layout, 0.2f);
  EXPECT_EQ(bits(p.dk), bits(q.dk));
  EXPECT_EQ(bits(p.dv), bits(q.dv));
  EXPECT_EQ(bits(p.dq), bits(q.dq));
}

// Peak bytes of one forward + backward above the inputs: outputs plus O(threads) tiles, linear
// in s. An [s, s] f32 matrix would be 16 MiB at s = 2048.
size_t peak_above_inputs(int64_t s) {
  Case c{"mem", op_cases::Oracle::attn_dense_ref, 1, s, 1, 1, 16, 16};
  Inputs x = make_inputs(c, 3);
  DocLayout layout = make_layout(c);
  AttnDenseInputs in;
  in.q = Tensor::from_vector<float>({1, s, 1, 16}, x.q);
  in.k = Tensor::from_vector<float>({1, s, 1, 16}, x.k);
  in.v = Tensor::from_vector<float>({1, s, 1, 16}, x.v);
  in.layout = &layout;
  in.scale = 0.25f;
  Tensor dout = Tensor::from_vector<float>({1, s, 1, 16}, x.dout);
  Allocator& a = allocator(Device::cpu);
  const size_t live = a.live_bytes();
  a.reset_peak();
  {
    AttnDenseSaved sv = attn_dense_fwd(in);
    AttnDenseGrads g = attn_dense_bwd(in, sv, dout);
  }
  return a.peak_bytes() - live;
}

TEST(AttnDense, PeakMemoryIsLinearInS) {
  const size_t p1 = peak_above_inputs(2048), p2 = peak_above_inputs(4096);
  EXPECT_LT(p1, size_t(2048) * 2048 * 4 / 8);
  EXPECT_LE(double(p2), 2.1 * double(p1)) << p1 << " -> " << p2;
}

TEST(AttnDense, BadInputIsAClearError) {
  DocLayout l = layout_causal(1, 8);
  auto mk = [](Shape s) { return Tensor::zeros(s, DType::f32); };
  AttnDenseInputs in{mk({1, 8, 4, 16}), mk({1, 8, 3, 16}), mk({1, 8, 3, 8}), &l, {}, 0.25f};
  EXPECT_THROW(attn_dense_fwd(in), ShapeError);  // Hkv = 3 does not divide H = 4
  in.k = mk({1, 8, 2, 16});
  EXPECT_THROW(attn_dense_fwd(in), ShapeError);  // v has 3 heads, k 2
  in.v = mk({1, 8, 2, 8});
  in.k = mk({1, 8, 2, 12});
  EXPECT_THROW(attn_dense_fwd(in), ShapeError);  // q and k widths differ
  in.k = mk({1, 8, 2, 16});
  EXPECT_NO_THROW(attn_dense_fwd(in));
  DocLayout l2 = layout_causal(1, 9);
  in.layout = &l2;
  EXPECT_THROW(attn_dense_fwd(in), LayoutError);  // layout does not cover s
  in.layout = nullptr;
  EXPECT_THROW(attn_dense_fwd(in), LayoutError);
  in.layout = &l;
  in.scale = 0.f;
  EXPECT_THROW(attn_dense_fwd(in), ShapeError);
  in.scale = 0.25f;
  in.sink = mk({3});
  EXPECT_THROW(attn_dense_fwd(in), ShapeError);  // sink must be [H]
  in.sink = Tensor();
  AttnDenseSaved bad{mk({1, 8, 4, 8}), mk({1, 8, 4})};  // lse must be [b, H, s]
  EXPECT_THROW(attn_dense_fwd(in, bad), ShapeError);
  AttnDenseInputs bf = in;
  bf.q = Tensor::zeros({1, 8, 4, 16}, DType::bf16);
  EXPECT_THROW(attn_dense_fwd(bf), ShapeError);  // q, k, v dtypes differ
  try {
    in.k = mk({1, 8, 3, 16});
    attn_dense_fwd(in);
    ADD_FAILURE() << "Hkv = 3 with H = 4 was accepted";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("must divide"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hmla
