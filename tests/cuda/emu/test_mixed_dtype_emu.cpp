// The CUDA backend's mixed-precision entries on the emulator (label emu): products whose a, b, c
// are each f32 or bf16, linear_bwd on bf16 activations and weights with f32 gradients, and the
// indexer KLs reading bf16 q, k, qI, kI. The property (DESIGN.md section 4's numerics contract): a
// bf16 input is read exactly, so every mix gives the bits the all-f32 path gives on f32 tensors
// holding the same values, with c rounded once (RNE) when it is bf16. The products are also held
// to an f64 oracle by a bound from K and the bf16 roundings; the CPU refuses bf16 by supports().
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "hmla/core/cuda.h"
#include "hmla/core/error.h"
#include "hmla/core/layout.h"
#include "hmla/ops/attention.h"
#include "hmla/ops/indexer.h"
#include "hmla/ops/nn.h"
#include "cuda_kernels.h"
#include "indexer_ref.h"
#include "cases_indexer.h"
#include "op_cases.h"
#include "testing.h"

namespace hmla {
namespace {

using testing::randn;
using testing::to_f64;

constexpr double kU32 = 0x1p-24;  // f32 unit roundoff (RNE)
constexpr double kUb = 0x1p-8;    // bf16's: 8 significant bits, |fl(x) - x| <= 2^-8 |x|
constexpr DType kTypes[] = {DType::f32, DType::bf16};

float rb(float x) { return bf16_to_f32(f32_to_bf16(x)); }
std::vector<float> rounded(std::vector<float> v) {
  for (float& x : v) x = rb(x);
  return v;
}

// v as a contiguous CPU tensor of dt (bf16: rounded to nearest even).
Tensor host(const std::vector<float>& v, const Shape& shape, DType dt) {
  const Tensor t = Tensor::from_vector<float>(shape, v);
  return dt == DType::f32 ? t : converted(t, dt);
}

// t's values in f32 (bf16 widened, exactly), row-major over its shape.
std::vector<float> values(const Tensor& t) { return converted(t.to(Device::cpu), DType::f32).to_vector<float>(); }

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " values differ, the first at " << first
                     << ": " << (bad ? got[first] : 0.f) << " vs " << (bad ? want[first] : 0.f);
}

template <class F>
void expect_shape_error(F f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

std::string name(DType a, DType b, DType c) {
  return std::string(dtype_name(a)) + " x " + dtype_name(b) + " -> " + dtype_name(c);
}

// ---- products ----------------------------------------------------------------------------------

struct ProductCase {
  const char* name;
  bool ta, tb;
  int64_t batch, M, N, K;  // batch 0: 2-D operands
  float alpha, beta;
};

constexpr ProductCase kProducts[] = {
    {"plain", false, false, 0, 5, 7, 37, 1.f, 0.f},
    {"ta", true, false, 0, 6, 5, 33, 1.f, 0.f},
    {"tb_alpha", false, true, 0, 4, 9, 40, 0.5f, 0.f},
    {"ta_tb_accumulate", true, true, 0, 5, 6, 31, 1.f, 1.f},
    {"batched_strided_accumulate", false, true, 3, 4, 5, 29, 1.f, 1.f},
    {"batched_ta_strided", true, false, 3, 5, 4, 17, -1.5f, 0.f},
};

constexpr int64_t kPad = 3;  // extra columns per stored row: ld = cols + kPad

// One stored operand: [rows, cols + kPad] (2-D) or [rows, batch, cols + kPad] (batched) values in
// a storage tensor of `dt` on CUDA, and the view the product reads: [rows, cols] at ld, or
// [batch, rows, cols] with batch stride cols + kPad and row stride batch (cols + kPad), a
// head-sliced view.
struct Operand {
  Tensor storage, view;
};

Operand operand(const std::vector<float>& v, int64_t batch, int64_t rows, int64_t cols, DType dt) {
  const int64_t pitch = cols + kPad;
  Operand o;
  if (batch == 0) {
    o.storage = host(v, {rows, pitch}, dt).to(Device::cuda);
    o.view = o.storage.slice(1, 0, cols);
  } else {
    o.storage = host(v, {rows, batch, pitch}, dt).to(Device::cuda);
    o.view = o.storage.transpose(0, 1).slice(2, 0, cols);
  }
  return o;
}

struct Raw {  // a product's raw f32 values (not bf16-representable), storage shaped
  std::vector<float> a, b, c;
};

Raw raw_values(const ProductCase& pc, uint64_t seed) {
  const int64_t nb = pc.batch == 0 ? 1 : pc.batch;
  const int64_t a_rows = pc.ta ? pc.K : pc.M, a_cols = pc.ta ? pc.M : pc.K;
  const int64_t b_rows = pc.tb ? pc.N : pc.K, b_cols = pc.tb ? pc.K : pc.N;
  return {randn(size_t(a_rows * nb * (a_cols + kPad)), seed), randn(size_t(b_rows * nb * (b_cols + kPad)), seed + 1),
          randn(size_t(pc.M * nb * (pc.N + kPad)), seed + 2)};
}

// matmul on the case's operands: a, b, c of the given dtypes holding v's values (rounded to bf16
// where bf16). Returns c's storage after the product, in f32.
struct ProductRun {
  std::vector<float> a, b, c0;  // the views' values before the product (as held)
  std::vector<float> c_storage;
};

ProductRun run_product(const ProductCase& pc, const Raw& v, DType at, DType bt, DType ct) {
  const int64_t a_rows = pc.ta ? pc.K : pc.M, a_cols = pc.ta ? pc.M : pc.K;
  const int64_t b_rows = pc.tb ? pc.N : pc.K, b_cols = pc.tb ? pc.K : pc.N;
  const Operand A = operand(v.a, pc.batch, a_rows, a_cols, at), B = operand(v.b, pc.batch, b_rows, b_cols, bt);
  const Operand C = operand(v.c, pc.batch, pc.M, pc.N, ct);
  ProductRun r{values(A.view), values(B.view), values(C.view), {}};
  matmul(A.view, pc.ta ? Trans::yes : Trans::no, B.view, pc.tb ? Trans::yes : Trans::no, C.view, pc.alpha, pc.beta);
  r.c_storage = values(C.storage);
  return r;
}

// Every mix gives the bits of the all-f32 product on the values the mix's tensors hold, f32
// inputs rounded to bf16 first (the contract rounds them; this also checks that it does), c's
// storage rounded once to bf16 when c is bf16 (its padding, never written, unchanged either way).
TEST(MixedProducts, EveryMixIsTheF32ProductOfTheSameValuesRoundedOnce) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  for (const ProductCase& pc : kProducts) {
    const Raw v = raw_values(pc, 17);
    for (DType at : kTypes)
      for (DType bt : kTypes)
        for (DType ct : kTypes) {
          const ProductRun got = run_product(pc, v, at, bt, ct);
          const Raw held{rounded(v.a), rounded(v.b), ct == DType::bf16 ? rounded(v.c) : v.c};
          std::vector<float> want = run_product(pc, held, DType::f32, DType::f32, DType::f32).c_storage;
          if (ct == DType::bf16) want = rounded(want);
          expect_same_bits(got.c_storage, want, std::string(pc.name) + ", " + name(at, bt, ct));
        }
  }
}

// The f64 product of the values held against each mix: the error is at most
// |alpha| S ((1 + u_b)^2 (1 + gamma_K) - 1)  (each input rounded to bf16, relative u_b; the
//                                            products exact in f32; K - 1 f32 additions)
// + 2 u (|alpha acc| + |beta c|) (1 + u)    (alpha acc, beta c and their sum rounded in f32)
// and, when c is bf16, u_b (|exact| + that) for its one rounding; S = sum_k |a_ik b_kj|, u = 2^-24.
TEST(MixedProducts, EveryMixIsWithinTheF64OracleBound) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  for (const ProductCase& pc : kProducts) {
    const Raw v = raw_values(pc, 29);
    const int64_t nb = pc.batch == 0 ? 1 : pc.batch, pitch = pc.N + kPad;
    const double gamma = double(pc.K) * kU32 / (1 - double(pc.K) * kU32);
    for (DType at : kTypes)
      for (DType bt : kTypes)
        for (DType ct : kTypes) {
          const ProductRun r = run_product(pc, v, at, bt, ct);
          for (int64_t z = 0; z < nb; ++z)
            for (int64_t i = 0; i < pc.M; ++i)
              for (int64_t j = 0; j < pc.N; ++j) {
                double exact = 0, S = 0;
                for (int64_t k = 0; k < pc.K; ++k) {
                  const int64_t ai = pc.ta ? (z * pc.K + k) * pc.M + i : (z * pc.M + i) * pc.K + k;
                  const int64_t bi = pc.tb ? (z * pc.N + j) * pc.K + k : (z * pc.K + k) * pc.N + j;
                  exact += double(r.a[ai]) * double(r.b[bi]);
                  S += std::abs(double(r.a[ai]) * double(r.b[bi]));
                }
                const double c0 = r.c0[(z * pc.M + i) * pc.N + j], alpha = std::abs(double(pc.alpha));
                const double want = double(pc.alpha) * exact + double(pc.beta) * c0;
                const double acc_bound = alpha * S * (1 + kUb) * (1 + kUb) * (1 + gamma);
                double bound = alpha * S * ((1 + kUb) * (1 + kUb) * (1 + gamma) - 1) +
                               2 * kU32 * (acc_bound + std::abs(double(pc.beta) * c0)) * (1 + kU32);
                if (ct == DType::bf16) bound += kUb * (std::abs(want) + bound);
                // c's storage is [M, pitch] (2-D) or [M, batch, pitch]: element (z, i, j) of the view.
                const double got = r.c_storage[(i * nb + z) * pitch + j];
                const double err = std::abs(got - want);
                EXPECT_LE(err, bound) << pc.name << ", " << name(at, bt, ct) << " at (" << z << ", " << i << ", "
                                      << j << "): " << got << " vs f64 " << want;
              }
        }
  }
}

// The model's forward y = x W^T on bf16 activations and a bf16 weight copy, y bf16 or f32: the
// bits of the f32 forward on the same values, y rounded once when bf16.
TEST(MixedProducts, LinearForwardOnBf16ActivationsAndWeights) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const int64_t N = 9, in = 24, out = 7;
  const std::vector<float> x = rounded(randn(N * in, 3)), W = rounded(randn(out * in, 4));
  auto run = [&](DType dt, DType yt) {
    const Tensor y = Tensor::zeros({N, out}, yt, Device::cuda);
    linear_fwd(host(x, {N, in}, dt).to(Device::cuda), host(W, {out, in}, dt).to(Device::cuda), y);
    return values(y);
  };
  const std::vector<float> f32 = run(DType::f32, DType::f32);
  expect_same_bits(run(DType::bf16, DType::f32), f32, "linear, bf16 x and W, f32 y");
  expect_same_bits(run(DType::bf16, DType::bf16), rounded(f32), "linear, bf16 x, W and y");
}

// The model's backward: dy f32 (a gradient) while x and W are bf16, dW f32 added into, dx f32 (or
// bf16) written or added into: the bits of the all-f32 backward on the same values.
TEST(MixedProducts, LinearBackwardWithF32GradientsAndBf16Operands) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const int64_t N = 11, in = 20, out = 6;
  const std::vector<float> dy = randn(N * out, 5), x = rounded(randn(N * in, 6)), W = rounded(randn(out * in, 7));
  const std::vector<float> dW0 = randn(out * in, 8), dx0 = rounded(randn(N * in, 9));
  auto dev = [](const std::vector<float>& v, const Shape& s, DType dt) { return host(v, s, dt).to(Device::cuda); };
  for (DType dyt : kTypes)
    for (DType dxt : kTypes)
      for (float dx_beta : {0.f, 1.f}) {
        const std::string what = std::string("dy ") + dtype_name(dyt) + ", dx " + dtype_name(dxt) +
                                 ", dx_beta " + std::to_string(int(dx_beta));
        const Tensor dW = dev(dW0, {out, in}, DType::f32), dx = dev(dx0, {N, in}, dxt);
        linear_bwd(dev(dy, {N, out}, dyt), dev(x, {N, in}, DType::bf16), dev(W, {out, in}, DType::bf16), dW, dx,
                   dx_beta);
        const Tensor dW_ref = dev(dW0, {out, in}, DType::f32), dx_ref = dev(dx0, {N, in}, DType::f32);
        linear_bwd(dev(dyt == DType::bf16 ? rounded(dy) : dy, {N, out}, DType::f32), dev(x, {N, in}, DType::f32),
                   dev(W, {out, in}, DType::f32), dW_ref, dx_ref, dx_beta);
        expect_same_bits(values(dW), values(dW_ref), what + ": dW");
        const std::vector<float> want = values(dx_ref);
        expect_same_bits(values(dx), dxt == DType::bf16 ? rounded(want) : want, what + ": dx");
      }
}

// What the entries and backends refuse: a bf16 weight gradient (added into every step), dtypes
// other than f32 and bf16, and bf16 anywhere on the CPU (its supports(), its clear error).
TEST(MixedProducts, RefusalsAreClearErrors) {
  const Tensor x = Tensor::zeros({4, 6}, DType::bf16), W = Tensor::zeros({3, 6}, DType::bf16);
  const Tensor dy = Tensor::zeros({4, 3}, DType::f32);
  expect_shape_error([&] { linear_fwd(x, W, Tensor::empty({4, 3}, DType::f32)); }, "the cpu backend does not run");
  expect_shape_error([&] { matmul(x, Trans::no, W, Trans::yes, Tensor::empty({4, 3}, DType::bf16)); },
                     "the cpu backend does not run");
  expect_shape_error([&] { linear_bwd(dy, x, W, Tensor::zeros({3, 6}, DType::bf16), Tensor()); },
                     "dW must be f32");
  expect_shape_error([&] { matmul(Tensor::zeros({4, 6}, DType::f64), Trans::no, W, Trans::yes, dy); },
                     "a must be f32 or bf16");
  if (cuda_device_count() == 0) return;
  const Tensor xc = x.to(Device::cuda), Wc = W.to(Device::cuda);
  expect_shape_error([&] { linear_bwd(dy.to(Device::cuda), xc, Wc, Tensor::zeros({3, 6}, DType::bf16, Device::cuda),
                                      Tensor()); },
                     "dW must be f32");
  expect_shape_error([&] { linear_fwd(xc, Wc, Tensor::empty({4, 3}, DType::i32, Device::cuda)); },
                     "y must be f32 or bf16");
}

// ---- indexer KLs --------------------------------------------------------------------------------

DocLayout docs_layout() { return layout_from_cu_seqlens(150, {{0, 40, 41, 42, 130}, {0, 150}}); }

// A KL problem whose qI, kI, q, k are bf16-representable (so a bf16 copy holds them exactly).
struct KlProblem {
  op_cases::IndexerKlCase c;
  DocLayout layout = docs_layout();
  std::vector<float> qI, kI, w, q, k, rw;
  Tensor lse_c, topk;  // on the CPU, from the f32 tensors (common to every run)
};

KlProblem kl_problem(const op_cases::IndexerKlCase& c, const DocLayout& layout = docs_layout()) {
  KlProblem p;
  p.c = c;
  p.layout = layout;
  const int64_t b = c.b, s = c.s;
  p.qI = rounded(randn(b * s * c.HI * c.DI, 21, 0.5f));
  p.kI = rounded(randn(b * s * c.DI, 22, 0.5f));
  p.w = randn(b * s * c.HI, 23);
  p.q = rounded(randn(b * s * c.H * c.Dqk, 24));
  p.k = rounded(randn(b * s * c.Hkv * c.Dqk, 25));
  p.rw.assign(b * s, 0.f);
  const float valid = float(std::max<int64_t>(p.layout.valid_rows(), 1));
  for (int64_t r = 0; r < b; ++r)
    for (int64_t t = 0; t < s; ++t) p.rw[r * s + t] = p.layout.is_padding(r, t) || t == 7 ? 0.f : 1.f / valid;
  const Tensor q = Tensor::from_vector<float>({b, s, c.H, c.Dqk}, p.q);
  const Tensor k = Tensor::from_vector<float>({b, s, c.Hkv, c.Dqk}, p.k);
  if (c.give_lse) p.lse_c = attn_dense_fwd(AttnDenseInputs{q, k, k, &p.layout, {}, 0.3f}).lse;
  if (c.sparse)
    p.topk = indexer_topk({Tensor::from_vector<float>({b, s, c.HI, c.DI}, p.qI),
                           Tensor::from_vector<float>({b, s, c.DI}, p.kI), Tensor::from_vector<float>({b, s, c.HI}, p.w),
                           &p.layout},
                          c.K, c.W);
  return p;
}

// The KL on `dev` with qI, kI in `it` and q, k in `at`.
IndexerKlResult run_kl(const KlProblem& p, DType it, DType at, Device dev) {
  const op_cases::IndexerKlCase& c = p.c;
  IndexerKlInputs in;
  in.sc = {host(p.qI, {c.b, c.s, c.HI, c.DI}, it).to(dev), host(p.kI, {c.b, c.s, c.DI}, it).to(dev),
           host(p.w, {c.b, c.s, c.HI}, DType::f32).to(dev), &p.layout};
  in.q = host(p.q, {c.b, c.s, c.H, c.Dqk}, at).to(dev);
  in.k = host(p.k, {c.b, c.s, c.Hkv, c.Dqk}, at).to(dev);
  in.scale = 0.3f;
  in.coeff = 0.5f;
  in.row_weight = host(p.rw, {c.b, c.s}, DType::f32).to(dev);
  if (p.lse_c.defined()) in.lse_c = p.lse_c.to(dev);
  if (c.sparse) in.topk = p.topk.to(dev), in.K = c.K;
  return c.sparse ? indexer_kl_sparse(in) : indexer_kl_dense(in);
}

class MixedKl : public ::testing::TestWithParam<op_cases::IndexerKlCase> {};

// One bf16 input pair (qI/kI or q/k) with the other f32: the SIMT kernels in f32, so the bits of
// the f32 KL on the same values (gradients, kl_sum, loss), and that f32 KL within the STYLE.md
// rule of the f64 oracle on those values. Both pairs bf16 (what the training step passes): the
// dense and the sparse KL run on the tensor cores (indexer_kl_mma.cu, indexer_kl_sparse.cu) and are
// held to the rule below instead.
TEST_P(MixedKl, Bf16InputsGiveTheBitsOfF32TensorsOfTheSameValues) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const KlProblem p = kl_problem(GetParam());
  const IndexerKlResult f32 = run_kl(p, DType::f32, DType::f32, Device::cuda);
  for (auto [it, at] : {std::pair{DType::bf16, DType::f32}, std::pair{DType::f32, DType::bf16}}) {
    const std::string what = std::string("qI, kI ") + dtype_name(it) + ", q, k " + dtype_name(at);
    const IndexerKlResult r = run_kl(p, it, at, Device::cuda);
    expect_same_bits(values(r.dqI), values(f32.dqI), what + ": dqI");
    expect_same_bits(values(r.dkI), values(f32.dkI), what + ": dkI");
    expect_same_bits(values(r.dw), values(f32.dw), what + ": dw");
    EXPECT_EQ(r.kl_sum, f32.kl_sum) << what;
    EXPECT_EQ(r.loss, f32.loss) << what;
    EXPECT_EQ(r.dqI.dtype(), DType::f32) << what;
  }
  const op_cases::IndexerKlCase& c = p.c;
  const std::vector<int32_t> topk = c.sparse ? p.topk.to_vector<int32_t>() : std::vector<int32_t>{};
  const std::vector<int32_t> ds = p.layout.doc_start.to_vector<int32_t>();
  const ref::IndexerDims dims{c.b, c.s, c.HI, c.DI};
  const ref::KlAttn att{c.H, c.Hkv, c.Dqk, 0.3};
  auto o64 = ref::indexer_kl_ref<double>(dims, att, to_f64(p.q), to_f64(p.k), to_f64(p.qI), to_f64(p.kI), to_f64(p.w),
                                         ds, to_f64(p.rw), 0.5, topk, c.K);
  auto o32 = ref::indexer_kl_ref<float>(dims, att, p.q, p.k, p.qI, p.kI, p.w, ds, p.rw, 0.5f, topk, c.K);
  testing::expect_within_rule("dqI", values(f32.dqI), o32.dqI, o64.dqI);
  testing::expect_within_rule("dkI", values(f32.dkI), o32.dkI, o64.dkI);
  testing::expect_within_rule("dw", values(f32.dw), o32.dw, o64.dw);
  EXPECT_GT(o64.kl_sum, 0.0);
}

// The KLs on bf16 qI, kI, q, k run on the tensor cores: the scores qI . kI and q . k are f32 sums
// of exact bf16 products (as the SIMT kernels', in another order), so lseI, lseC, P, Q, dI and kl
// carry f32 rounding only; the one bf16 rounding is the products' A operand: dI before
// dqI = w_h sum_j dI [s > 0] kI and dw = qI . (that sum), dS = bf16(bf16(dI) w_h) before dkI. The
// naive implementation in that precision is the oracle with exactly those roundings
// (ref::indexer_kl_ref's `stored`), sums in f32; the rule: twice its error against the f64 oracle
// plus the f32 rounding term of outputs that stay f32 (expect_within_rule). kl_sum has no bf16
// rounding: the f32 rule against the f32 oracle.
void expect_tensor_core_kl_within_rule(const KlProblem& p) {
  const op_cases::IndexerKlCase& c = p.c;
  const IndexerKlResult r = run_kl(p, DType::bf16, DType::bf16, Device::cuda);
  const std::vector<int32_t> ds = p.layout.doc_start.to_vector<int32_t>();
  const std::vector<int32_t> topk = c.sparse ? p.topk.to_vector<int32_t>() : std::vector<int32_t>{};
  const ref::IndexerDims dims{c.b, c.s, c.HI, c.DI};
  const ref::KlAttn att{c.H, c.Hkv, c.Dqk, 0.3};
  auto o64 = ref::indexer_kl_ref<double>(dims, att, to_f64(p.q), to_f64(p.k), to_f64(p.qI), to_f64(p.kI), to_f64(p.w),
                                         ds, to_f64(p.rw), 0.5, topk, c.K);
  auto o32 = ref::indexer_kl_ref<float>(dims, att, p.q, p.k, p.qI, p.kI, p.w, ds, p.rw, 0.5f, topk, c.K);
  auto nb = ref::indexer_kl_ref<float>(dims, att, p.q, p.k, p.qI, p.kI, p.w, ds, p.rw, 0.5f, topk, c.K, rb);
  testing::expect_within_rule("dqI", values(r.dqI), nb.dqI, o64.dqI);
  testing::expect_within_rule("dkI", values(r.dkI), nb.dkI, o64.dkI);
  testing::expect_within_rule("dw", values(r.dw), nb.dw, o64.dw);
  testing::expect_within_rule("kl_sum", {float(r.kl_sum)}, {float(o32.kl_sum)}, {o64.kl_sum});
  EXPECT_NEAR(r.loss, 0.5 * r.kl_sum, 1e-12);
  // The rule is not vacuous here: the bf16 rounding moved the naive gradients off the f32 ones.
  EXPECT_GT(testing::max_abs_err(nb.dkI, o64.dkI).max_err, 4 * testing::max_abs_err(o32.dkI, o64.dkI).max_err);
  // Deterministic: a second run gives the same bits.
  const IndexerKlResult again = run_kl(p, DType::bf16, DType::bf16, Device::cuda);
  expect_same_bits(values(again.dqI), values(r.dqI), "dqI");
  expect_same_bits(values(again.dkI), values(r.dkI), "dkI");
  expect_same_bits(values(again.dw), values(r.dw), "dw");
  EXPECT_EQ(again.kl_sum, r.kl_sum);
}
class MixedKlTensorCores : public ::testing::TestWithParam<op_cases::IndexerKlCase> {};
TEST_P(MixedKlTensorCores, OnBf16InputsKeepTheRule) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  expect_tensor_core_kl_within_rule(kl_problem(GetParam()));
}
// The registry's indexer_kl_bf16 table (tests/common/cases_indexer.h).
INSTANTIATE_TEST_SUITE_P(Cases, MixedKlTensorCores, ::testing::ValuesIn(op_cases::indexer_kl_bf16()), op_cases::RowName());

// lseC_h per head over each row's candidates, from the f32 values in f64, rounded to f32 [b, H, s]:
// what the sparse attention's forward saves as lse_c (DESIGN.md section 6), for a given-lse run.
Tensor candidate_lse(const KlProblem& p) {
  const op_cases::IndexerKlCase& c = p.c;
  const std::vector<int32_t> topk = p.topk.to_vector<int32_t>();
  const int64_t KW = c.K + c.W, group = c.H / c.Hkv;
  std::vector<float> out(c.b * c.H * c.s, INFINITY);
  for (int64_t r = 0; r < c.b * c.s; ++r)
    for (int64_t h = 0; h < c.H; ++h) {
      std::vector<double> l;
      for (int64_t i = 0; i < c.K; ++i) {
        const int32_t j = topk[r * KW + i];
        if (j < 0) continue;
        double acc = 0;
        for (int64_t x = 0; x < c.Dqk; ++x)
          acc += double(p.q[(r * c.H + h) * c.Dqk + x]) * p.k[(((r / c.s) * c.s + j) * c.Hkv + h / group) * c.Dqk + x];
        l.push_back(0.3 * acc);
      }
      if (l.empty()) continue;
      const double mx = *std::max_element(l.begin(), l.end());
      double z = 0;
      for (double v : l) z += std::exp(v - mx);
      out[((r / c.s) * c.H + h) * c.s + r % c.s] = float(mx + std::log(z));
    }
  return Tensor::from_vector<float>({c.b, c.H, c.s}, out);
}

// The sparse KL as dsa_sparse runs it: lseC given (the sparse forward's lse_c), so no score pass
// is spent on it; the rule as above.
TEST(MixedKlSparse, AGivenCandidateLseKeepsTheRule) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  for (const op_cases::IndexerKlCase& c : op_cases::indexer_kl()) {
    if (!c.sparse) continue;
    SCOPED_TRACE(c.name);
    KlProblem p = kl_problem(c);
    p.lse_c = candidate_lse(p);
    expect_tensor_core_kl_within_rule(p);
  }
}

// The dkI contributions go through a workspace of a chunk of rows; the per-key sums run in row
// order across chunks, so a workspace of one row at a time gives the same bits as one chunk.
TEST(MixedKlSparse, ChunksOfTheWorkspaceKeepTheBits) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const op_cases::IndexerKlCase c = op_cases::indexer_kl()[2];  // sparse, MQA
  const KlProblem p = kl_problem(c);
  const IndexerKlResult one = run_kl(p, DType::bf16, DType::bf16, Device::cuda);
  const int64_t before = cuda::set_indexer_kl_workspace_bytes(1);  // one row a chunk
  const IndexerKlResult many = run_kl(p, DType::bf16, DType::bf16, Device::cuda);
  cuda::set_indexer_kl_workspace_bytes(before);
  expect_same_bits(values(many.dkI), values(one.dkI), "dkI");
  expect_same_bits(values(many.dqI), values(one.dqI), "dqI");
  expect_same_bits(values(many.dw), values(one.dw), "dw");
  EXPECT_EQ(many.kl_sum, one.kl_sum);
}

// Padding rows between documents (a layout from end rows): the keys kernel walks a 64-key block's
// rows in tiles of 16, and a tile of padding rows at the block's start (rows [0, 36) of row 0,
// [64, 84) of row 1) is not the end of the rows that see its keys: the documents after it do.
TEST(MixedKlDenseLayout, PaddingRowsBeforeADocumentKeepTheRule) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const op_cases::IndexerKlCase c = op_cases::indexer_kl()[1];  // dense, lse computed, GQA
  std::vector<int64_t> end_rows(c.b * c.s, 0);  // 0: padding
  auto doc = [&](int64_t r, int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) end_rows[r * c.s + t] = t1;
  };
  doc(0, 36, 120);
  doc(1, 0, 64), doc(1, 84, 150);
  expect_tensor_core_kl_within_rule(kl_problem(c, layout_from_end_rows(c.b, c.s, end_rows)));
}

INSTANTIATE_TEST_SUITE_P(Cases, MixedKl, ::testing::ValuesIn(op_cases::indexer_kl()), op_cases::RowName());
// A context-parallel query slice (rows [37, 137) of 150: across documents and into row 0's tail
// padding) on the tensor cores: the oracle over every row with the rows outside the slice
// weighted 0 gives the slice's dqI and dw rows and its share of dkI and kl_sum. The dense KL with
// the attention's lse given; the sparse one over the slice's rows of the table (global positions).
void expect_slice_within_rule(const op_cases::IndexerKlCase& c) {
  const KlProblem p = kl_problem(c);
  const int64_t r0 = 37, n = 100, b = c.b, s = c.s;
  using testing::rows_of;
  IndexerKlInputs in;
  in.sc = {host(rows_of(p.qI, b, s, c.HI * c.DI, r0, n), {b, n, c.HI, c.DI}, DType::bf16).to(Device::cuda),
           host(p.kI, {b, s, c.DI}, DType::bf16).to(Device::cuda),
           host(rows_of(p.w, b, s, c.HI, r0, n), {b, n, c.HI}, DType::f32).to(Device::cuda), &p.layout, r0};
  in.q = host(rows_of(p.q, b, s, c.H * c.Dqk, r0, n), {b, n, c.H, c.Dqk}, DType::bf16).to(Device::cuda);
  in.k = host(p.k, {b, s, c.Hkv, c.Dqk}, DType::bf16).to(Device::cuda);
  in.scale = 0.3f;
  in.coeff = 0.5f;
  in.row_weight = host(rows_of(p.rw, b, s, 1, r0, n), {b, n}, DType::f32).to(Device::cuda);
  std::vector<int32_t> topk;
  if (c.sparse) {
    topk = p.topk.to_vector<int32_t>();
    const std::vector<int32_t> rows = rows_of(topk, b, s, c.K + c.W, r0, n);
    in.topk = Tensor::from_vector<int32_t>({b, n, c.K + c.W}, rows).to(Device::cuda);
    in.K = c.K;
  } else {
    in.lse_c = host(rows_of(p.lse_c.to_vector<float>(), b * c.H, s, 1, r0, n), {b, c.H, n}, DType::f32).to(Device::cuda);
  }
  const IndexerKlResult r = c.sparse ? indexer_kl_sparse(in) : indexer_kl_dense(in);
  std::vector<float> rw = p.rw;
  for (int64_t bb = 0; bb < b; ++bb)
    for (int64_t t = 0; t < s; ++t)
      if (t < r0 || t >= r0 + n) rw[bb * s + t] = 0.f;
  const std::vector<int32_t> ds = p.layout.doc_start.to_vector<int32_t>();
  const ref::IndexerDims dims{b, s, c.HI, c.DI};
  const ref::KlAttn att{c.H, c.Hkv, c.Dqk, 0.3};
  auto o64 = ref::indexer_kl_ref<double>(dims, att, to_f64(p.q), to_f64(p.k), to_f64(p.qI), to_f64(p.kI), to_f64(p.w),
                                         ds, to_f64(rw), 0.5, topk, c.K);
  auto o32 = ref::indexer_kl_ref<float>(dims, att, p.q, p.k, p.qI, p.kI, p.w, ds, rw, 0.5f, topk, c.K);
  auto nb = ref::indexer_kl_ref<float>(dims, att, p.q, p.k, p.qI, p.kI, p.w, ds, rw, 0.5f, topk, c.K, rb);
  testing::expect_within_rule("dqI", values(r.dqI), rows_of(nb.dqI, b, s, c.HI * c.DI, r0, n),
                              rows_of(o64.dqI, b, s, c.HI * c.DI, r0, n));
  testing::expect_within_rule("dw", values(r.dw), rows_of(nb.dw, b, s, c.HI, r0, n), rows_of(o64.dw, b, s, c.HI, r0, n));
  testing::expect_within_rule("dkI", values(r.dkI), nb.dkI, o64.dkI);
  testing::expect_within_rule("kl_sum", {float(r.kl_sum)}, {float(o32.kl_sum)}, {o64.kl_sum});
  EXPECT_GT(o64.kl_sum, 0.0);
}
TEST(MixedKlDenseSlice, AQuerySliceKeepsTheRule) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  expect_slice_within_rule(op_cases::indexer_kl()[0]);  // dense, lse given
}
TEST(MixedKlSparse, AQuerySliceKeepsTheRule) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  expect_slice_within_rule(op_cases::indexer_kl()[2]);  // sparse, MQA
}

// The CPU's KL reads f32 only: bf16 q, k (or qI, kI) is its supports() refusal, a clear error.
TEST(MixedKlOnCpu, Bf16InputsAreRefused) {
  const KlProblem p = kl_problem(op_cases::indexer_kl()[1]);
  expect_shape_error([&] { run_kl(p, DType::f32, DType::bf16, Device::cpu); }, "the cpu backend does not run");
  expect_shape_error([&] { run_kl(p, DType::bf16, DType::f32, Device::cpu); }, "the cpu backend does not run");
}

}  // namespace
}  // namespace hmla
