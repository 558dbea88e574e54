// DeepSeek-V4's attention core (hmla/ops/compressed_attention.h) in the registry: rows of packed
// documents (one shorter than the window, one shorter than the rate, tail padding), W = 1 and
// W > s, H = 1, 4 and 72, dense and selected modes (-1 pads, invisible picks, repeated picks), with and
// without entries and sink, rows of more than 128 keys and heads of more than 128 channels. Each row carries its check (run by tests/ops/test_case_rows.cpp on the
// CPU and the emulated CUDA device): forward and every gradient against attn_compressed_ref, the
// float64 definition with the full masked score matrix (fine in an oracle), by STYLE.md's rule.
// The oracle's own gradients are checked by central differences in tests/ops/test_attn_compressed.cpp.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "case_support.h"
#include "hmla/ops/compressed_attention.h"

namespace hmla::op_cases {

struct AttnCompressedCase {
  std::string name;
  Oracle oracle;
  int64_t b, s, H, d, W, m;           // m: the compressor's rate (entries per m rows of a document)
  std::vector<std::vector<int64_t>> cu;  // per batch row: cu_seqlens (rows after the last: padding)
  int64_t k = 0;                      // 0: dense mode; else selected slots per query
  bool sink = true;
  bool entries = true;                // false: n_e = 0 (a sliding layer)
  double scale_of() const { return double(float(1.0 / std::sqrt(double(d)))); }  // the f32 scale the op gets
};
inline void PrintTo(const AttnCompressedCase& c, std::ostream* os) { print_row(c, os); }

inline std::vector<AttnCompressedCase> attn_compressed_cases() {
  const Oracle o = Oracle::attn_compressed_ref;
  // Documents 0: [0,3) shorter than the rate 4, [3,9) shorter than W = 8, [9,33) long, padding 33..36.
  const std::vector<int64_t> packed{0, 3, 9, 33};
  return {
      {"dense_packed_h4", o, 1, 36, 4, 16, 8, 4, {packed}},
      {"dense_w1", o, 1, 30, 2, 8, 1, 3, {{0, 2, 17, 30}}},
      {"dense_w_over_s_h1", o, 1, 24, 1, 12, 40, 5, {{0, 24}}},
      {"dense_two_rows", o, 2, 28, 2, 8, 6, 4, {{0, 13, 28}, {0, 1, 4, 26}}},
      {"window_only", o, 1, 30, 4, 8, 8, 4, {{0, 3, 9, 30}}, 0, true, false},
      {"dense_no_sink", o, 1, 20, 2, 8, 4, 2, {{0, 9, 20}}, 0, false},
      {"selected_pads_dups", o, 1, 36, 4, 16, 8, 4, {packed}, 5},
      {"selected_h1_two_rows", o, 2, 26, 1, 8, 3, 2, {{0, 11, 26}, {0, 26}}, 3},
      {"selected_w_over_s", o, 1, 20, 2, 8, 64, 3, {{0, 7, 20}}, 8},
      // Over 128 keys per row (the CPU's blocks, CUDA's chunks: the online softmax's rescaling) and
      // over 128 channels (CUDA's channel loop).
      {"dense_many_keys", o, 1, 300, 2, 8, 200, 2, {{0, 290}}},
      {"selected_many_keys", o, 1, 260, 1, 8, 150, 2, {{0, 10, 260}}, 140},
      {"wide_head", o, 1, 20, 2, 160, 6, 4, {{0, 20}}, 3},
      // More than 64 heads: the tensor-core forward's two head groups (64 + 8) and its backward's
      // three (32 + 32 + 8, the last tile masked), whose key gradients sum over the groups.
      {"heads_72_selected", o, 1, 24, 72, 16, 6, 4, {{0, 9, 24}}, 4},
  };
}

// A row's inputs, f64 (the values every backend sees, rounded to its dtype first by the check).
struct AttnCompressedData {
  int64_t n_e = 0;
  std::vector<double> q, kv, ent, sink, dout;
  std::vector<int32_t> ent_last, ent_doc, idx;
  DocLayout layout;
};

inline AttnCompressedData attn_compressed_data(const AttnCompressedCase& c) {
  AttnCompressedData x;
  x.layout = layout_from_cu_seqlens(c.s, c.cu);
  std::vector<std::vector<std::pair<int32_t, int32_t>>> ents(size_t(c.b));  // (doc, last) per row
  for (int64_t bb = 0; bb < c.b && c.entries; ++bb)
    for (size_t i = 0; i + 1 < c.cu[size_t(bb)].size(); ++i) {
      const int64_t st = c.cu[size_t(bb)][i], en = c.cu[size_t(bb)][i + 1];
      for (int64_t w = 0; (w + 1) * c.m <= en - st; ++w) ents[size_t(bb)].push_back({int32_t(st), int32_t(st + (w + 1) * c.m - 1)});
    }
  for (const auto& r : ents) x.n_e = std::max<int64_t>(x.n_e, int64_t(r.size()));
  x.ent_last.assign(size_t(c.b * x.n_e), -1), x.ent_doc.assign(size_t(c.b * x.n_e), -1);  // a shorter row's tail: -1
  for (int64_t bb = 0; bb < c.b; ++bb)
    for (size_t e = 0; e < ents[size_t(bb)].size(); ++e) {
      const auto [dc, la] = ents[size_t(bb)][e];
      x.ent_doc[size_t(bb * x.n_e) + e] = dc, x.ent_last[size_t(bb * x.n_e) + e] = la;
    }
  std::mt19937 g(uint32_t(c.s * 131 + c.H * 7 + c.d + c.k));
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  auto fill = [&](std::vector<double>& v, size_t n, double a) {
    v.resize(n);
    for (double& e : v) e = a * u(g);
  };
  fill(x.q, size_t(c.b * c.s * c.H * c.d), 2.0);  // logits of a few units: a peaked softmax
  fill(x.kv, size_t(c.b * c.s * c.d), 1.5);
  fill(x.ent, size_t(c.b * x.n_e * c.d), 1.5);
  fill(x.dout, size_t(c.b * c.s * c.H * c.d), 1.0);
  x.sink.resize(size_t(c.H));
  for (int64_t h = 0; h < c.H; ++h) x.sink[size_t(h)] = 0.5 * double(h) - 0.3;
  if (c.k > 0) {  // visible picks, -1 pads, invisible picks (later windows, other documents) and repeats
    std::uniform_int_distribution<int> pick(-1, int(std::max<int64_t>(x.n_e, 1)) - 1);
    x.idx.resize(size_t(c.b * c.s * c.k));
    for (size_t i = 0; i < x.idx.size(); ++i) x.idx[i] = pick(g);
    for (size_t r = 0; r < x.idx.size() / size_t(c.k); ++r)
      if (c.k > 2 && r % 3 == 0) x.idx[r * size_t(c.k) + 1] = x.idx[r * size_t(c.k)];  // a repeat
  }
  return x;
}

// The float64 definition (T = double; T = float is the naive instance of the tolerance rule): per
// (b, h) the full [s, s + n_e] masked logit matrix, softmax with the sink column, out, lse and the
// gradients by the chain rule. mag_*: the largest sum of |terms| entering an element of each
// output (STYLE.md: the rounding term scales with what enters, not with the result).
template <class T>
struct AttnCompressedRef {
  std::vector<T> out, lse, dq, dkv, dent, dsink;
  double mag_out = 0, mag_dq = 0, mag_dkv = 0, mag_dent = 0, mag_dsink = 0, zmax = 0;
  int64_t nmax = 0;  // the most keys of a row
};

template <class T>
AttnCompressedRef<T> attn_compressed_ref(const AttnCompressedCase& c, const AttnCompressedData& x) {
  const int64_t b = c.b, s = c.s, H = c.H, d = c.d, n_e = x.n_e, nk = s + n_e;
  const int32_t* ds = x.layout.doc_start.data<int32_t>();
  AttnCompressedRef<T> r;
  r.out.assign(size_t(b * s * H * d), T(0)), r.lse.assign(size_t(b * H * s), T(INFINITY));
  r.dq.assign(r.out.size(), T(0)), r.dkv.assign(size_t(b * s * d), T(0)), r.dent.assign(size_t(b * n_e * d), T(0));
  r.dsink.assign(size_t(H), T(0));
  std::vector<double> mdsink(size_t(H), 0), mdq(r.dq.size(), 0), mdkv(r.dkv.size(), 0), mdent(r.dent.size(), 0);
  auto key = [&](int64_t bb, int64_t j, int64_t ch) {
    return T(j < s ? x.kv[size_t((bb * s + j) * d + ch)] : x.ent[size_t((bb * n_e + j - s) * d + ch)]);
  };
  for (int64_t bb = 0; bb < b; ++bb)
    for (int64_t t = 0; t < s; ++t) {
      const int64_t st = ds[bb * s + t];
      if (st > t) continue;  // padding
      std::vector<char> allowed(size_t(nk), 0);
      for (int64_t u = std::max(st, t - c.W + 1); u <= t; ++u) allowed[size_t(u)] = 1;
      auto vis = [&](int64_t e) {
        return e >= 0 && e < n_e && x.ent_doc[size_t(bb * n_e + e)] == st && x.ent_last[size_t(bb * n_e + e)] <= t;
      };
      if (c.k == 0)
        for (int64_t e = 0; e < n_e; ++e) allowed[size_t(s + e)] = vis(e);
      else
        for (int64_t i = 0; i < c.k; ++i) {  // a mask: a repeated pick is set twice, counts once
          const int64_t e = x.idx[size_t((bb * s + t) * c.k + i)];
          if (vis(e)) allowed[size_t(s + e)] = 1;
        }
      int64_t n = 0;
      for (char a : allowed) n += a;
      r.nmax = std::max(r.nmax, n);
      for (int64_t h = 0; h < H; ++h) {
        const size_t qo = size_t(((bb * s + t) * H + h) * d);
        std::vector<T> z(size_t(nk), T(-INFINITY)), P(size_t(nk), T(0)), dP(size_t(nk), T(0));
        T mx = T(x.sink.empty() || !c.sink ? -INFINITY : x.sink[size_t(h)]);
        for (int64_t j = 0; j < nk; ++j) {
          if (!allowed[size_t(j)]) continue;
          T acc = 0;
          double am = 0;
          for (int64_t ch = 0; ch < d; ++ch) acc += T(x.q[qo + size_t(ch)]) * key(bb, j, ch), am += std::abs(x.q[qo + size_t(ch)] * double(key(bb, j, ch)));
          z[size_t(j)] = T(c.scale_of()) * acc;
          r.zmax = std::max(r.zmax, am * c.scale_of());
          mx = std::max(mx, z[size_t(j)]);
        }
        T den = c.sink ? std::exp(T(x.sink[size_t(h)]) - mx) : T(0);
        for (int64_t j = 0; j < nk; ++j)
          if (allowed[size_t(j)]) den += P[size_t(j)] = std::exp(z[size_t(j)] - mx);
        const T lse = mx + std::log(den);
        r.lse[size_t((bb * H + h) * s + t)] = lse;
        for (int64_t j = 0; j < nk; ++j) P[size_t(j)] /= den;
        T D = 0;
        double mD = 0;
        for (int64_t ch = 0; ch < d; ++ch) {
          T o = 0;
          for (int64_t j = 0; j < nk; ++j)
            if (allowed[size_t(j)]) o += P[size_t(j)] * key(bb, j, ch), r.mag_out = std::max(r.mag_out, std::abs(double(key(bb, j, ch))));
          r.out[qo + size_t(ch)] = o;
          D += T(x.dout[qo + size_t(ch)]) * o;
          mD += std::abs(x.dout[qo + size_t(ch)] * double(o));
        }
        if (c.sink) {
          const T ps = std::exp(T(x.sink[size_t(h)]) - lse);
          r.dsink[size_t(h)] -= ps * D;
          mdsink[size_t(h)] += double(ps) * mD;
        }
        for (int64_t j = 0; j < nk; ++j) {
          if (!allowed[size_t(j)]) continue;
          T a = 0;
          for (int64_t ch = 0; ch < d; ++ch) a += T(x.dout[qo + size_t(ch)]) * key(bb, j, ch);
          dP[size_t(j)] = a;
        }
        for (int64_t j = 0; j < nk; ++j) {
          if (!allowed[size_t(j)]) continue;
          const T dz = P[size_t(j)] * (dP[size_t(j)] - D) * T(c.scale_of());
          const double mdz = double(P[size_t(j)]) * (std::abs(double(dP[size_t(j)])) + mD) * c.scale_of();
          for (int64_t ch = 0; ch < d; ++ch) {
            r.dq[qo + size_t(ch)] += dz * key(bb, j, ch);
            mdq[qo + size_t(ch)] += mdz * std::abs(double(key(bb, j, ch)));
            // K = V: the key role (dz q) and the value role (P dout) into one gradient.
            const T g = dz * T(x.q[qo + size_t(ch)]) + P[size_t(j)] * T(x.dout[qo + size_t(ch)]);
            const double mg = mdz * std::abs(x.q[qo + size_t(ch)]) + double(P[size_t(j)]) * std::abs(x.dout[qo + size_t(ch)]);
            if (j < s) r.dkv[size_t((bb * s + j) * d + ch)] += g, mdkv[size_t((bb * s + j) * d + ch)] += mg;
            else r.dent[size_t((bb * n_e + j - s) * d + ch)] += g, mdent[size_t((bb * n_e + j - s) * d + ch)] += mg;
          }
        }
      }
    }
  for (double v : mdsink) r.mag_dsink = std::max(r.mag_dsink, v);
  for (double v : mdq) r.mag_dq = std::max(r.mag_dq, v);
  for (double v : mdkv) r.mag_dkv = std::max(r.mag_dkv, v);
  for (double v : mdent) r.mag_dent = std::max(r.mag_dent, v);
  return r;
}

}  // namespace hmla::op_cases

namespace hmla::op_cases {

inline AttnCompressedParams params(const AttnCompressedCase& c, DType dt, bool backward) {
  AttnCompressedParams p;
  p.dtype = dt;
  p.b = c.b, p.s = p.sq = c.s, p.H = c.H, p.d = c.d, p.window = c.W, p.k = c.k, p.scale = float(c.scale_of());
  p.n_e = c.entries ? 1 : 0;  // the plans read no counts beyond "some"
  if (c.sink) p.sink = reinterpret_cast<const float*>(&detail::marker);
  if (backward) p.dq = &detail::marker;
  return p;
}
inline void uses(Uses& u, const AttnCompressedCase& c, DType dt) {
  u(Op::attn_compressed_fwd, params(c, dt, false))(Op::attn_compressed_bwd, params(c, dt, true));
  u(Op::attn_compressed_mass, AttnMassParams{});
}

// attn_compressed_mass on the forward's lse and that of the same core without entries, against the
// float64 sums of the formula on the same (read-back) values, over the rows whose weight is 1 (every
// third row and the padding rows weigh 0). Each of the n <= b s H terms is an exp of an f64
// difference (within an ulp of the true value on either backend) and a sum of n terms of size <= 1
// rounds by at most n^2 2^-53 in any order, so the bound is (n + n^2) 2^-52.
inline std::string check_mass(const AttnCompressedInputs& in, const AttnCompressedCase& c, Device dev) {
  auto host = [](const Tensor& t) { return t.to(Device::cpu).to_vector<float>(); };
  const Tensor lse = attn_compressed_fwd(in).lse;
  AttnCompressedInputs ws_in = in;
  ws_in.ent = ws_in.ent_last = ws_in.ent_doc = ws_in.idx = Tensor();
  const Tensor lse_ws = in.ent.defined() ? attn_compressed_fwd(ws_in).lse : lse;
  std::vector<float> rw(size_t(c.b * c.s));
  for (int64_t r = 0; r < c.b; ++r)
    for (int64_t t = 0; t < c.s; ++t) rw[size_t(r * c.s + t)] = in.layout->is_padding(r, t) || t % 3 == 0 ? 0.f : 1.f;
  const Tensor acc = Tensor::zeros({4}, DType::f64, dev);
  attn_compressed_mass(lse, lse_ws, in.sink, Tensor::from_vector<float>({c.b, c.s}, rw).to(dev), acc);
  const std::vector<float> l = host(lse), w = host(lse_ws);
  const std::vector<float> sink = in.sink.defined() ? host(in.sink) : std::vector<float>(size_t(c.H), -INFINITY);
  double want[4] = {0, 0, 0, 0};
  for (int64_t r = 0; r < c.b; ++r)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t t = 0; t < c.s; ++t) {
        if (rw[size_t(r * c.s + t)] == 0.f) continue;
        const size_t i = size_t((r * c.H + h) * c.s + t);
        const double ps = std::exp(double(sink[size_t(h)]) - double(l[i])), pw = std::exp(double(w[i]) - double(l[i]));
        want[0] += pw - ps, want[1] += 1 - pw, want[2] += ps, want[3] += 1;
      }
  const std::vector<double> got = acc.to(Device::cpu).to_vector<double>();
  const double n = want[3], bound = (n + n * n) * 0x1p-52;
  std::string err;
  for (int k = 0; k < 4; ++k)
    if (!(std::abs(got[size_t(k)] - want[k]) <= bound))
      err += "mass[" + std::to_string(k) + "] = " + std::to_string(got[size_t(k)]) + ", float64 " + std::to_string(want[k]) + "; ";
  return err;
}

// The row on a device against attn_compressed_ref: the inputs rounded to the backend's compute
// dtype first (the oracle sees the op's values), the forward and backward run twice (the bits must
// repeat: no atomics anywhere), dsink given as 0.25 (it is added into). Per tensor, STYLE.md's rule:
// max error <= 2 x the naive f32 instance's + a rounding term on the magnitude that enters it: f32
// outputs 8 u (1 + zmax) mag (a logit's rounding, up to u zmax, moves every probability
// relatively); bf16 outputs (CUDA) also one bf16 rounding and the backward's D read from the
// stored bf16 out (each <= 2^-9 mag). shards > 1 (context parallelism's row shards): the query rows
// in `shards` calls at q_row0 = k s / shards, their rows put together and their key gradients summed
// in shard order in f32, which adds (shards - 1) u mag to those gradients' rounding term.
// f32: the inputs in f32 whatever the backend's compute dtype (CUDA: the SIMT kernels, which f32 takes).
inline std::string check(const AttnCompressedCase& c, Device dev, int64_t shards = 1, bool f32 = false) {
  const DType dt = f32 ? DType::f32 : backend(dev).compute_dtype();
  AttnCompressedData x = attn_compressed_data(c);
  auto rnd = [dt](std::vector<double>& v) {
    for (double& e : v) e = dt == DType::bf16 ? double(bf16_to_f32(f32_to_bf16(float(e)))) : double(float(e));
  };
  rnd(x.q), rnd(x.kv), rnd(x.ent), rnd(x.dout);
  for (double& e : x.sink) e = double(float(e));
  auto put = [&](const Shape& sh, const std::vector<double>& v) {
    const Tensor f = Tensor::from_vector<float>(sh, std::vector<float>(v.begin(), v.end()));
    if (dt == DType::f32) return f.to(dev);
    Tensor h = Tensor::empty(sh, DType::bf16);
    for (size_t i = 0; i < v.size(); ++i) h.data<bf16>()[i] = f32_to_bf16(float(v[i]));
    return h.to(dev);
  };
  auto host = [](const Tensor& t) {
    const Tensor h = t.to(Device::cpu);
    std::vector<double> v(size_t(h.numel()));
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = h.dtype() == DType::bf16 ? double(bf16_to_f32(h.data<bf16>()[i])) : double(h.data<float>()[i]);
    return v;
  };
  AttnCompressedInputs in;
  in.q = put({c.b, c.s, c.H, c.d}, x.q);
  in.kv = put({c.b, c.s, c.d}, x.kv);
  if (x.n_e > 0) {
    in.ent = put({c.b, x.n_e, c.d}, x.ent);
    in.ent_last = Tensor::from_vector<int32_t>({c.b, x.n_e}, x.ent_last).to(dev);
    in.ent_doc = Tensor::from_vector<int32_t>({c.b, x.n_e}, x.ent_doc).to(dev);
  }
  if (c.k > 0) in.idx = Tensor::from_vector<int32_t>({c.b, c.s, c.k}, x.idx).to(dev);
  if (c.sink) in.sink = Tensor::from_vector<float>({c.H}, std::vector<float>(x.sink.begin(), x.sink.end())).to(dev);
  in.layout = &x.layout;
  in.scale = float(c.scale_of());
  in.window = c.W;
  const Tensor dout = put({c.b, c.s, c.H, c.d}, x.dout);
  std::vector<std::vector<double>> run[2];
  for (auto& got : run) {
    got.assign(6, {});
    got[0].assign(size_t(c.b * c.s * c.H * c.d), 0), got[1].assign(size_t(c.b * c.H * c.s), 0);
    got[2].assign(got[0].size(), 0), got[3].assign(size_t(c.b * c.s * c.d), 0);
    got[4].assign(size_t(c.b * x.n_e * c.d), 0);
    const Tensor ds0 = Tensor::from_vector<float>({c.H}, std::vector<float>(size_t(c.H), 0.25f)).to(dev);
    for (int64_t k = 0; k < shards; ++k) {  // rows [r0, r1): a view of q, copies of idx and dout
      const int64_t r0 = k * c.s / shards, r1 = (k + 1) * c.s / shards, sq = r1 - r0;
      AttnCompressedInputs ik = in;
      ik.q = in.q.slice(1, r0, r1);
      if (c.k > 0) ik.idx = in.idx.slice(1, r0, r1).clone();
      ik.q_row0 = r0;
      const AttnCompressedSaved sv = attn_compressed_fwd(ik);
      const AttnCompressedGrads g = attn_compressed_bwd(ik, sv, dout.slice(1, r0, r1).clone(), c.sink ? ds0 : Tensor());
      const std::vector<double> out = host(sv.out), lse = host(sv.lse), dq = host(g.dq), dkv = host(g.dkv);
      const std::vector<double> dent = x.n_e > 0 ? host(g.dent) : std::vector<double>{};
      const int64_t row = sq * c.H * c.d;
      for (int64_t bb = 0; bb < c.b; ++bb) {
        std::copy_n(out.begin() + bb * row, row, got[0].begin() + (bb * c.s + r0) * c.H * c.d);
        std::copy_n(dq.begin() + bb * row, row, got[2].begin() + (bb * c.s + r0) * c.H * c.d);
        for (int64_t h = 0; h < c.H; ++h)
          std::copy_n(lse.begin() + (bb * c.H + h) * sq, sq, got[1].begin() + (bb * c.H + h) * c.s + r0);
      }
      for (size_t i = 0; i < dkv.size(); ++i) got[3][i] = double(float(got[3][i]) + float(dkv[i]));  // f32 sums
      for (size_t i = 0; i < dent.size(); ++i) got[4][i] = double(float(got[4][i]) + float(dent[i]));
    }
    std::vector<double> dsink = c.sink ? host(ds0) : std::vector<double>{};  // every shard added into it
    for (double& v : dsink) v -= 0.25;
    got[5] = dsink;
  }
  std::string err;
  if (run[0] != run[1]) err += "two runs differ; ";
  if (shards == 1) err += check_mass(in, c, dev);
  const auto r64 = attn_compressed_ref<double>(c, x);
  const auto r32 = attn_compressed_ref<float>(c, x);
  double lmag = 0;
  for (double v : r64.lse) lmag = std::max(lmag, std::isfinite(v) ? std::abs(v) : 0.0);
  const bool bf = dt == DType::bf16;
  const double u = 0x1p-23, f = 8 * u * (1 + r64.zmax), fs = f + double(shards - 1) * u;
  struct Item {
    const char* name;
    const std::vector<double>& got;
    std::vector<double> ref, naive;
    double rounding;
  };
  auto d64 = [](const auto& v) { return std::vector<double>(v.begin(), v.end()); };
  const Item items[] = {
      {"out", run[0][0], r64.out, d64(r32.out), (f + (bf ? 0x1p-8 : 0)) * r64.mag_out},
      {"lse", run[0][1], r64.lse, d64(r32.lse), f * (lmag + r64.zmax + 1)},
      {"dq", run[0][2], r64.dq, d64(r32.dq), (f + (bf ? 0x1p-8 : 0)) * r64.mag_dq},
      {"dkv", run[0][3], r64.dkv, d64(r32.dkv), (fs + (bf ? 0x1p-8 : 0)) * r64.mag_dkv},
      {"dent", run[0][4], r64.dent, d64(r32.dent), (fs + (bf ? 0x1p-8 : 0)) * r64.mag_dent},
      {"dsink", run[0][5], c.sink ? r64.dsink : std::vector<double>{}, c.sink ? d64(r32.dsink) : std::vector<double>{},
       (fs + (bf ? 0x1p-9 : 0)) * r64.mag_dsink},
  };
  for (const Item& it : items) {
    if (it.got.size() != it.ref.size()) {
      err += std::string(it.name) + ": " + std::to_string(it.got.size()) + " values, expected " + std::to_string(it.ref.size()) + "; ";
      continue;
    }
    double e = 0, n = 0;
    for (size_t i = 0; i < it.ref.size(); ++i) {
      const bool inf = std::isinf(it.ref[i]);  // padding rows' lse: +inf exactly
      if (inf && it.got[i] != it.ref[i]) e = INFINITY;
      if (inf) continue;
      e = std::max(e, std::abs(it.got[i] - it.ref[i]));
      n = std::max(n, std::abs(it.naive[i] - it.ref[i]));
    }
    const double bound = 2 * n + it.rounding;
    if (!(e <= bound)) err += std::string(it.name) + ": max error " + std::to_string(e) + " > bound " + std::to_string(bound) + "; ";
    if (const char* v = std::getenv("HMLA_REPORT_ERRORS"); v && *v)
      std::printf("attn_compressed %s %s %s: err %.3g naive %.3g bound %.3g\n", c.name.c_str(), device_name(dev), it.name, e, n, bound);
  }
  return err;
}

inline void case_rows_attn_compressed(const Backend& be, std::vector<RowUse>& out) {
  add_checked_rows(out, "attn_compressed", be, be.compute_dtype(), attn_compressed_cases());
}

}  // namespace hmla::op_cases
