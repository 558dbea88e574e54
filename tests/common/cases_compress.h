// The compressor pooling's case table (hmla/ops/compress.h): packed documents (one shorter than a
// window, one with a trailing partial window, tail padding), HCA and CSA (overlap), m = 1 and
// more. Each row's check runs the op's forward and backward on a device against a float64 oracle
// of the definition (its own gradients checked by central differences), by the STYLE.md rule:
// twice the naive float instance's error plus 8 ulps of the magnitudes that enter. Header-only,
// no test framework (`hmla ops`).
#pragma once
#include <cmath>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "hmla/core/layout.h"
#include "hmla/ops/compress.h"
#include "case_support.h"

namespace hmla::op_cases {

struct CompressCase {
  std::string name;
  Oracle oracle;
  int64_t s, W, m;
  bool overlap;
  std::vector<std::vector<int64_t>> cu_seqlens;  // per batch row
};
inline void PrintTo(const CompressCase& c, std::ostream* os) { *os << c.name; }

inline std::vector<CompressCase> compress_cases() {
  const Oracle o = Oracle::compress_ref;
  return {
      {"hca_packed", o, 23, 5, 4, false, {{0, 9, 11, 20}, {0, 23}}},
      {"csa_packed", o, 23, 5, 4, true, {{0, 9, 11, 20}, {0, 23}}},
      {"csa_m1", o, 9, 3, 1, true, {{0, 4, 9}}},
      {"hca_no_full_window", o, 6, 2, 8, false, {{0, 3, 6}}},
      {"csa_one_window_docs", o, 16, 4, 3, true, {{0, 3, 6, 10, 16}}},
  };
}

inline void uses(Uses& u, const CompressCase& c, DType) {
  CompressParams p;
  p.b = int64_t(c.cu_seqlens.size()), p.s = c.s, p.W = c.W, p.m = c.m, p.overlap = c.overlap;
  u(Op::compress_fwd, p)(Op::compress_bwd, p);
}

// The definition in T over the entries `first` [b, n]: out [b, n, W]; with dout, the gradients
// (dkv, dgate [b, s, C], dape [m, C]) by the chain rule.
template <class T>
struct CompressOracle {
  std::vector<T> out, dkv, dgate, dape;
};
template <class T>
CompressOracle<T> compress_oracle(const CompressCase& c, const std::vector<int32_t>& first, int64_t n,
                                  const std::vector<int32_t>& doc_start, const std::vector<double>& kv,
                                  const std::vector<double>& gate, const std::vector<double>& ape,
                                  const std::vector<double>* dout) {
  const int64_t b = int64_t(c.cu_seqlens.size()), s = c.s, W = c.W, m = c.m, C = c.overlap ? 2 * W : W;
  CompressOracle<T> r;
  r.out.assign(size_t(b * n * W), T(0));
  r.dkv.assign(size_t(b * s * C), T(0)), r.dgate.assign(size_t(b * s * C), T(0)), r.dape.assign(size_t(m * C), T(0));
  for (int64_t re = 0; re < b * n; ++re) {
    const int64_t row = re / n, f = first[size_t(re)];
    if (f < 0) continue;
    for (int64_t ch = 0; ch < W; ++ch) {
      std::vector<int64_t> off, aoff;  // the slots
      if (!c.overlap) {
        for (int64_t j = 0; j < m; ++j) off.push_back((row * s + f + j) * C + ch), aoff.push_back(j * C + ch);
      } else {
        if (f - m >= doc_start[size_t(row * s + f)])
          for (int64_t j = 0; j < m; ++j) off.push_back((row * s + f - m + j) * C + ch), aoff.push_back(j * C + ch);
        for (int64_t j = 0; j < m; ++j) off.push_back((row * s + f + j) * C + W + ch), aoff.push_back(j * C + W + ch);
      }
      T mx = -std::numeric_limits<T>::infinity(), sum = 0, o = 0;
      std::vector<T> a(off.size());
      for (size_t i = 0; i < off.size(); ++i) mx = std::max(mx, T(gate[size_t(off[i])]) + T(ape[size_t(aoff[i])]));
      for (size_t i = 0; i < off.size(); ++i) sum += a[i] = std::exp(T(gate[size_t(off[i])]) + T(ape[size_t(aoff[i])]) - mx);
      for (size_t i = 0; i < off.size(); ++i) o += (a[i] /= sum) * T(kv[size_t(off[i])]);
      r.out[size_t(re * W + ch)] = o;
      if (!dout) continue;
      const T d = T((*dout)[size_t(re * W + ch)]);
      for (size_t i = 0; i < off.size(); ++i) {
        const T dz = a[i] * (T(kv[size_t(off[i])]) - o) * d;
        r.dkv[size_t(off[i])] = a[i] * d;
        r.dgate[size_t(off[i])] = dz;
        r.dape[size_t(aoff[i])] += dz;
      }
    }
  }
  return r;
}

// A device's result against the oracle by the rule; "" when every element is within.
inline std::string compress_within(const char* what, const std::vector<float>& got, const std::vector<double>& ref,
                                   const std::vector<float>& naive) {
  double mag = 0;
  for (double v : ref) mag = std::max(mag, std::abs(v));
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(double(got[i]) - ref[i]) <= 2 * std::abs(double(naive[i]) - ref[i]) + 8 * 0x1p-23 * mag))
      return std::string(what) + "[" + std::to_string(i) + "] = " + std::to_string(got[i]) + " against float64 " +
             std::to_string(ref[i]) + "; ";
  return "";
}

inline std::string check(const CompressCase& c, Device dev) {
  const DocLayout layout = layout_from_cu_seqlens(c.s, c.cu_seqlens);
  const int64_t b = layout.b, s = c.s, W = c.W, m = c.m, C = c.overlap ? 2 * W : W;
  const CompressedEntries e = compressed_entries(layout, m);
  const int64_t n = e.n;
  const std::vector<int32_t> first = e.first.to_vector<int32_t>(), starts = layout.doc_start.to_vector<int32_t>();
  auto values = [](int64_t count, double seed, double spread) {
    std::vector<double> v(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) v[size_t(i)] = std::sin(double(i) * seed + 0.3) * spread;
    return v;
  };
  const std::vector<double> kv = values(b * s * C, 1.37, 1.0), gate = values(b * s * C, 0.71, 2.0),
                            ape = values(m * C, 2.3, 0.5), dout = values(b * n * W, 0.53, 1.0);
  auto on = [dev](const Shape& shape, const std::vector<double>& v) {
    return Tensor::from_vector<float>(shape, std::vector<float>(v.begin(), v.end())).to(dev);
  };
  // The float64 oracle's gradients against central differences of its forward (L = dout . out).
  std::string err;
  const CompressOracle<double> ref = compress_oracle<double>(c, first, n, starts, kv, gate, ape, &dout);
  auto loss = [&](const std::vector<double>& k, const std::vector<double>& g, const std::vector<double>& a) {
    const CompressOracle<double> o = compress_oracle<double>(c, first, n, starts, k, g, a, nullptr);
    double l = 0;
    for (size_t i = 0; i < o.out.size(); ++i) l += dout[i] * o.out[i];
    return l;
  };
  const double h = 1e-6;  // truncation h^2 |L'''| and rounding 1e-16 |L| / h: both far below 1e-6
  for (int which = 0; which < 3; ++which) {
    const std::vector<double>& x = which == 0 ? kv : which == 1 ? gate : ape;
    const std::vector<double>& g = which == 0 ? ref.dkv : which == 1 ? ref.dgate : ref.dape;
    for (size_t i = 0; i < x.size(); i += 3) {
      std::vector<double> xp = x, xm = x;
      xp[i] += h, xm[i] -= h;
      const double fd = which == 0   ? (loss(xp, gate, ape) - loss(xm, gate, ape)) / (2 * h)
                        : which == 1 ? (loss(kv, xp, ape) - loss(kv, xm, ape)) / (2 * h)
                                     : (loss(kv, gate, xp) - loss(kv, gate, xm)) / (2 * h);
      if (!(std::abs(fd - g[i]) <= 1e-6)) {
        err += "the float64 oracle's gradient " + std::to_string(which) + "[" + std::to_string(i) + "] against finite differences; ";
        break;
      }
    }
  }
  // The op on the device against the oracle (the naive instance: the same definition in float on
  // the float inputs).
  std::vector<double> kv32(kv.size()), gate32(gate.size()), ape32(ape.size()), dout32(dout.size());
  for (size_t i = 0; i < kv.size(); ++i) kv32[i] = double(float(kv[i])), gate32[i] = double(float(gate[i]));
  for (size_t i = 0; i < ape.size(); ++i) ape32[i] = double(float(ape[i]));
  for (size_t i = 0; i < dout.size(); ++i) dout32[i] = double(float(dout[i]));
  const CompressOracle<double> ref32 = compress_oracle<double>(c, first, n, starts, kv32, gate32, ape32, &dout32);
  const CompressOracle<float> naive = compress_oracle<float>(c, first, n, starts, kv32, gate32, ape32, &dout32);
  const Tensor tkv = on({b, s, C}, kv), tg = on({b, s, C}, gate), ta = on({m, C}, ape);
  const Tensor out = Tensor::empty({b, n, W}, DType::f32, dev);
  compress_fwd(tkv, tg, ta, e, layout, c.overlap, out);
  const Tensor dkv = Tensor::empty({b, s, C}, DType::f32, dev), dgate = Tensor::empty({b, s, C}, DType::f32, dev);
  const Tensor dape = on({m, C}, std::vector<double>(size_t(m * C), 0.25));  // added into
  compress_bwd(on({b, n, W}, dout), tkv, tg, ta, e, layout, c.overlap, dkv, dgate, dape);
  std::vector<double> dape_ref = ref32.dape;
  std::vector<float> dape_naive = naive.dape;
  for (double& v : dape_ref) v += 0.25;
  for (float& v : dape_naive) v += 0.25f;
  err += compress_within("out", out.to(Device::cpu).to_vector<float>(), ref32.out, naive.out);
  err += compress_within("dkv", dkv.to(Device::cpu).to_vector<float>(), ref32.dkv, naive.dkv);
  err += compress_within("dgate", dgate.to(Device::cpu).to_vector<float>(), ref32.dgate, naive.dgate);
  err += compress_within("dape", dape.to(Device::cpu).to_vector<float>(), dape_ref, dape_naive);
  // The entry list from the layout, by hand: documents [0, 9), [9, 11), [11, 20) and [0, 23) in
  // windows of 4 from each start, trailing partial windows dropped.
  if (c.name == "hca_packed" && first != std::vector<int32_t>({0, 4, 11, 15, -1, 0, 4, 8, 12, 16}))
    err += "the entries of hca_packed are not {0, 4, 11, 15 | 0, 4, 8, 12, 16}; ";
  if (c.name == "hca_no_full_window" && n != 0) err += "a layout without a full window has entries; ";
  return err;
}

inline void case_rows_compress(const Backend& be, std::vector<RowUse>& out) {
  add_checked_rows(out, "compress", be, be.compute_dtype(), compress_cases());
}

}  // namespace hmla::op_cases
