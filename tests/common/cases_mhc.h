// The mHC ops' case table (hmla/ops/mhc.h): rows of (N, n, D, iters, rms_norm_eps, hc_eps), each
// running the entry (pre), the exit (post) and hc_head, forward and backward, on a device against
// the float64 oracle of mhc_oracle.h by the STYLE.md rule: |got - f64| <= 2 |f32 naive - f64| + 8
// ulps of the magnitude that enters (a tensor's largest |f64| value; for the weight gradients the
// largest sum of |terms|), plus one ulp of the result where a gradient is added into a nonzero
// buffer. The registry's driver (tests/ops/test_case_rows.cpp) runs every row on every backend;
// tests/ops/test_mhc.cpp checks the oracle's gradients by finite differences and prints the errors.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "hmla/ops/mhc.h"
#include "case_support.h"
#include "mhc_oracle.h"

namespace hmla::op_cases {

struct MhcCase {
  std::string name;
  Oracle oracle;
  int64_t N, n, D, iters;
  double norm_eps, hc_eps;
};
inline void PrintTo(const MhcCase& c, std::ostream* os) { *os << c.name; }

// n = 4 and 20 iterations (V4's), a single iteration, n = 1 (comb is [[1 / (1 + eps)]] scaled),
// n = 8 (the bound), D wider than a CUDA block, eps large enough to move every output.
inline std::vector<MhcCase> mhc_cases() {
  return {
      {"n4_iters20", Oracle::mhc_ref, 9, 4, 16, 20, 1e-6, 1e-6},
      {"n4_iters1_big_eps", Oracle::mhc_ref, 7, 4, 12, 1, 0.5, 0.05},
      {"n1", Oracle::mhc_ref, 5, 1, 24, 20, 1e-6, 1e-6},
      {"n2_iters3", Oracle::mhc_ref, 11, 2, 32, 3, 1e-5, 0.02},
      {"n8_iters7", Oracle::mhc_ref, 4, 8, 5, 7, 1e-5, 1e-3},
      {"n3_wide_rows", Oracle::mhc_ref, 3, 3, 300, 20, 1e-6, 1e-6},
  };
}

inline void uses(Uses& u, const MhcCase& c, DType) {
  MhcParams p;
  p.N = c.N, p.n = c.n, p.D = c.D, p.iters = c.iters;
  u(Op::mhc_pre_fwd, p)(Op::mhc_pre_bwd, p)(Op::mhc_post_fwd, p)(Op::mhc_post_bwd, p);
  u(Op::mhc_head_fwd, p)(Op::mhc_head_bwd, p);
}

// One compared tensor: its largest error and the bound at that element (the worst err / bound).
struct MhcErr {
  std::string name;
  double err = 0, bound = 0;
};

// got against init + ref (ref the float64 value, naive its f32 instance); mags: the sizes of the
// terms that enter (sums of |terms|), whose largest sets the rounding term with the largest |ref|.
inline void mhc_compare(const std::string& name, const std::vector<float>& got, const std::vector<double>& ref,
                        const std::vector<float>& naive, const std::vector<double>& mags, double init, std::string& err,
                        std::vector<MhcErr>* report) {
  const double u = 0x1p-24;
  double tensor_mag = 0;
  for (double v : ref) tensor_mag = std::max(tensor_mag, std::abs(v));
  for (double v : mags) tensor_mag = std::max(tensor_mag, v);
  MhcErr worst{name};
  bool bad = got.size() != ref.size();
  for (size_t i = 0; i < got.size() && !bad; ++i) {
    const double want = init + ref[i];
    const double e = std::abs(double(got[i]) - want);
    const double b = 2 * std::abs(double(naive[i]) - ref[i]) + 16 * u * tensor_mag + (init != 0 ? 2 * u * std::abs(want) : 0);
    if (!(e <= b)) bad = true;
    if (!(e <= b) || e / b > worst.err / std::max(worst.bound, 1e-300)) worst.err = e, worst.bound = b;
  }
  if (bad) err += name + ": error " + std::to_string(worst.err) + " over the bound " + std::to_string(worst.bound) + "; ";
  if (report) report->push_back(worst);
}

// A deterministic value in [-1, 1): splitmix64 of (seed, i), integer arithmetic only (the same on
// every platform; uncorrelated across tensors, so sums of products do not cancel by construction).
inline float mhc_value(int64_t i, double seed) {
  uint64_t h = uint64_t(i) + uint64_t(seed * 1000.0) * 0x9E3779B97F4A7C15ull;
  h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
  h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
  h ^= h >> 31;
  return float(double(h >> 40) * 0x1p-23 - 1.0);
}
inline std::vector<float> mhc_values(int64_t count, double seed, float scale, float shift = 0.f) {
  std::vector<float> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) v[size_t(i)] = shift + scale * mhc_value(i, seed);
  return v;
}

// The row on a device: pre, post and head forward and backward against the float64 oracle.
inline std::string mhc_check(const MhcCase& c, Device dev, std::vector<MhcErr>* report) {
  const int64_t N = c.N, n = c.n, D = c.D, K = n * D, m = (2 + n) * n;
  const MhcDims dims{N, n, D, c.iters, c.norm_eps, c.hc_eps};
  std::vector<float> x = mhc_values(N * K, 0.3, 1.f);
  for (int64_t i = 0; i < N * K; ++i) x[size_t(i)] *= float(0.5 + double(i / K % 3));  // rows of different rms
  const float fs = 1.5f / float(std::sqrt(double(K)));
  const std::vector<float> fn = mhc_values(m * K, 1.1, fs), base = mhc_values(m, 2.3, 0.4f);
  const std::vector<float> scale = {0.9f, 1.1f, 1.7f}, hfn = mhc_values(n * K, 3.7, fs), hbase = mhc_values(n, 4.1, 0.4f);
  const std::vector<float> hscale = {1.3f}, dy = mhc_values(N * D, 5.3, 1.f), dpost = mhc_values(N * n, 6.1, 1.f);
  const std::vector<float> dcomb = mhc_values(N * n * n, 7.9, 1.f), yb = mhc_values(N * D, 8.3, 1.f);
  const std::vector<float> post = mhc_values(N * n, 9.7, 0.9f, 1.f), comb = mhc_values(N * n * n, 10.1, 0.5f, 0.5f);
  const std::vector<float> dout = mhc_values(N * K, 11.3, 1.f);
  auto on = [dev](const std::vector<float>& v, const Shape& s) { return Tensor::from_vector<float>(s, v).to(dev); };
  auto host = [](const Tensor& t) { return t.to(Device::cpu).to_vector<float>(); };
  auto filled = [&](const Shape& s, float v) { return on(std::vector<float>(size_t(shape_numel(s)), v), s); };
  std::string err;
  const double g0 = 0.25;  // the weight gradients' buffers start here: they are added into
  const std::vector<double> none;
  for (bool head : {false, true}) {
    const int64_t mm = head ? n : m;
    const std::string tag = head ? "head " : "pre ";
    const MhcWeights w = head ? MhcWeights{on(hfn, {n, K}), on(hbase, {n}), on(hscale, {1})}
                              : MhcWeights{on(fn, {m, K}), on(base, {m}), on(scale, {3})};
    const MhcWeights dw{filled({mm, K}, float(g0)), filled({mm}, float(g0)), filled({head ? 1 : 3}, float(g0))};
    const Tensor X = on(x, {N, n, D}), y = filled({N, D}, 0.f), po = filled({N, n}, 0.f), co = filled({N, n, n}, 0.f);
    const MhcSaved s{filled({N}, 0.f), filled({N, mm}, 0.f)};
    const Tensor dx = filled({N, n, D}, 3.f);  // written, not added into
    if (head) {
      mhc_head_fwd(X, w, float(c.norm_eps), float(c.hc_eps), y, s);
      mhc_head_bwd(on(dy, {N, D}), X, w, s, float(c.hc_eps), dx, dw);
    } else {
      mhc_pre_fwd(X, w, c.iters, float(c.norm_eps), float(c.hc_eps), y, po, co, s);
      mhc_pre_bwd(on(dy, {N, D}), on(dpost, {N, n}), on(dcomb, {N, n, n}), X, w, s, c.iters, float(c.hc_eps), dx, dw);
    }
    const auto& wf = head ? hfn : fn;
    const auto& wb = head ? hbase : base;
    const auto& ws = head ? hscale : scale;
    const MhcMixRef<double> r = mhc_mix_ref<double>(dims, head, x, wf, wb, ws, &dy, &dpost, &dcomb);
    const MhcMixRef<float> q = mhc_mix_ref<float>(dims, head, x, wf, wb, ws, &dy, &dpost, &dcomb);
    mhc_compare(tag + "y", host(y), r.y, q.y, none, 0, err, report);
    if (!head) {
      mhc_compare(tag + "post", host(po), r.post, q.post, none, 0, err, report);
      mhc_compare(tag + "comb", host(co), r.comb, q.comb, none, 0, err, report);
    }
    mhc_compare(tag + "dx", host(dx), r.dx, q.dx, none, 0, err, report);
    mhc_compare(tag + "dfn", host(dw.fn), r.dfn, q.dfn, r.abs_dfn, g0, err, report);
    mhc_compare(tag + "dbase", host(dw.base), r.dbase, q.dbase, r.abs_dbase, g0, err, report);
    mhc_compare(tag + "dscale", host(dw.scale), r.dscale, q.dscale, r.abs_dscale, g0, err, report);
  }
  const Tensor X = on(x, {N, n, D}), out = filled({N, n, D}, 0.f), dx = filled({N, n, D}, 3.f);
  const Tensor dyb = filled({N, D}, 3.f), dpo = filled({N, n}, 3.f), dco = filled({N, n, n}, 3.f);
  const Tensor Y = on(yb, {N, D}), P = on(post, {N, n}), C = on(comb, {N, n, n});
  mhc_post_fwd(X, Y, P, C, out);
  mhc_post_bwd(on(dout, {N, n, D}), X, Y, P, C, dx, dyb, dpo, dco);
  const MhcPostRef<double> r = mhc_post_ref<double>(dims, x, yb, post, comb, &dout);
  const MhcPostRef<float> q = mhc_post_ref<float>(dims, x, yb, post, comb, &dout);
  auto abs_of = [](std::vector<float> v) {
    for (float& e : v) e = std::abs(e);
    return v;
  };
  const std::vector<float> adout = abs_of(dout);  // every output is a sum of products: its terms' sizes
  const MhcPostRef<double> a = mhc_post_ref<double>(dims, abs_of(x), abs_of(yb), abs_of(post), abs_of(comb), &adout);
  mhc_compare("post out", host(out), r.out, q.out, a.out, 0, err, report);
  mhc_compare("post dx", host(dx), r.dx, q.dx, a.dx, 0, err, report);
  mhc_compare("post dy", host(dyb), r.dy, q.dy, a.dy, 0, err, report);
  mhc_compare("post dpost", host(dpo), r.dpost, q.dpost, a.dpost, 0, err, report);
  mhc_compare("post dcomb", host(dco), r.dcomb, q.dcomb, a.dcomb, 0, err, report);
  return err;
}
inline std::string check(const MhcCase& c, Device dev) { return mhc_check(c, dev, nullptr); }

inline void case_rows_mhc(const Backend& be, std::vector<RowUse>& out) {
  add_checked_rows(out, "mhc", be, be.compute_dtype(), mhc_cases());
}

}  // namespace hmla::op_cases
