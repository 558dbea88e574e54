// The CSA indexer's KL (compressed_index_kl_dense / _sparse, hmla/ops/compressed_index.h;
// docs/csa_indexer_kl.md) in the registry: rows of packed documents (one shorter than the rate, so
// rows without candidates, tail padding, b = 2 with different layouts and unused entry slots), H = 1,
// W = 1 and W past every document, the sink absent, large (80), +inf on one head and on all, relu
// edges (kI = 0 entries, identical kI pairs, qI = 0 rows, w of both signs), a real row of weight 0, a
// strided q, no entries at all, more rows and entries than one CPU tile, and sparse tables with K
// below, at and above a row's visible count (-1 pads) and K past every row's (the dense KL). Each
// row's check (tests/ops/test_case_rows.cpp: the CPU in test_ops, the emulated CUDA device in
// test_cuda_emu) runs the op on the device with the lse of attn_compressed_fwd on the same device
// and compares kl_sum, dqI, dkI and dw with csa_kl_ref (csa_kl_oracle.h, float64) by STYLE.md's rule.
//
// The rule: max error <= 2 x the max error of the naive f32 implementation + a rounding term. The
// naive f32 implementation is Megatron-LM's, materialised (csa_kl_megatron_f32: [H, s, n_e] logits,
// p = exp(z - lse) with the attention's f32 lse, head sum, one L1 normalisation, Q a masked softmax,
// dI = coeff rw (Q - P), the chain by dense loops). The rounding term is 8 u (1 + zmax) mag: every
// exponent argument (z - lse - log Z, I - lseI) rounds by up to u zmax, which moves P and Q and so dI
// relatively; mag is the magnitude that enters each output before the (Q - P) cancellation:
// coeff rw (P + Q) |w| |kI| summed over the candidates for dqI, likewise with |qI| over the rows for
// dkI, with |s| for dw, and sum rw P (|log P| + |log Q| + 1) for kl_sum.
//
// The bf16 rows (csa_kl_bf16: qI, kI, q and ent in bf16; CUDA only, the CPU's plans take f32): the
// inputs are rounded to bf16 values first, so the oracle and the rule see the op's values; the op
// widens them exactly and runs the f32 arithmetic, so its outputs must also equal, bit for bit, the
// same device's on f32 tensors holding those values (a kernel that read a bf16 tensor as f32, or
// rounded anything it should not, fails that).
#pragma once
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "case_support.h"
#include "csa_kl_oracle.h"
#include "hmla/ops/compressed_attention.h"
#include "hmla/ops/compressed_index.h"

namespace hmla::op_cases {

enum class CsaSink { given, none, large, inf_one, inf_all };

struct CsaKlRow {
  std::string name;
  Oracle oracle;
  CsaKlCase c;  // K = 0: the dense KL
  CsaSink sink = CsaSink::given;
  bool relu_edges = false;   // kI = 0 entries (s = 0 exactly), identical kI pairs (ties), qI = 0 rows
  bool zero_weight = false;  // a real row with candidates gets row weight 0
  bool strided_q = false;    // q a column slice of a wider tensor (rows and heads at non-contiguous strides)
  bool bf16 = false;         // qI, kI, q and ent bf16 (their values rounded to bf16 first)
};
inline void PrintTo(const CsaKlRow& c, std::ostream* os) { print_row(c, os); }

inline std::vector<CsaKlRow> csa_kl_rows() {
  const Oracle o = Oracle::csa_kl_ref;
  // Row 0: documents [0,3) (shorter than the rate 2 ... of m = 4 below), [3,11), [11,24), padding
  // 24..27; row 1: [0,25), padding. b = 2, s = 28, H = 3, d = 4, nI = 2, dI = 3.
  const std::vector<std::vector<int64_t>> packed{{0, 3, 11, 24}, {0, 25}};
  auto small = [&](int64_t H, int64_t W, int64_t m, int64_t K, uint32_t seed) {
    return CsaKlCase{2, 28, H, 4, 2, 3, W, m, K, packed, true, seed};
  };
  // One document of 280 rows, rate 2: 140 entries (two entry tiles of 128 on the CPU), 300 rows.
  const CsaKlCase tiles{1, 300, 2, 8, 2, 8, 16, 2, 0, {{0, 280}}, true, 6};
  CsaKlCase tiles_sparse = tiles;
  tiles_sparse.K = 40;
  return {
      {"dense_packed", o, small(3, 3, 2, 0, 1)},
      {"dense_h1_w1", o, small(1, 1, 2, 0, 2)},
      {"dense_window_past_doc_no_sink", o, small(3, 40, 2, 0, 3), CsaSink::none},
      {"dense_sink_large", o, small(3, 3, 3, 0, 4), CsaSink::large},
      {"dense_sink_inf_one_head", o, small(3, 3, 2, 0, 5), CsaSink::inf_one},
      {"dense_sink_inf_all", o, small(3, 3, 2, 0, 6), CsaSink::inf_all},
      {"dense_relu_edges_zero_weight", o, small(3, 3, 2, 0, 7), CsaSink::given, true, true},
      {"dense_m4_strided_q", o, {1, 40, 2, 8, 3, 5, 4, 4, 0, {{0, 40}}, true, 8}, CsaSink::given, false, false, true},
      {"dense_no_entries", o, {1, 12, 2, 4, 2, 3, 2, 16, 0, {{0, 5, 12}}, true, 9}},
      {"dense_tiles", o, tiles},
      {"sparse_k3", o, small(3, 3, 2, 3, 11)},  // K below, at and above rows' visible counts
      {"sparse_k_past_visible", o, small(3, 3, 2, 16, 12)},
      {"sparse_relu_edges_no_sink", o, small(3, 3, 2, 4, 13), CsaSink::none, true, true},
      {"sparse_sink_inf_one_strided_q", o, small(3, 2, 2, 3, 14), CsaSink::inf_one, false, false, true},
      {"sparse_tiles", o, tiles_sparse},
  };
}

// The bf16 rows: some of the rows above with bf16 qI, kI, q and ent (the tiles: past one tile of
// rows and entries; relu edges: ties and zeros; a strided q).
inline std::vector<CsaKlRow> csa_kl_bf16_rows() {
  std::vector<CsaKlRow> out;
  for (const CsaKlRow& r : csa_kl_rows())
    for (const char* name : {"dense_packed", "dense_relu_edges_zero_weight", "dense_m4_strided_q", "dense_tiles",
                             "sparse_k3", "sparse_sink_inf_one_strided_q", "sparse_tiles"})
      if (r.name == name) {
        CsaKlRow b = r;
        b.bf16 = true;
        out.push_back(b);
      }
  return out;
}

// The sparse table of x as compressed_index_topk builds it from the true scores (csa_kl_data's rule).
inline void csa_kl_retable(CsaKlInputs& x, const DocLayout& layout) {
  if (x.dm.K == 0) return;
  CsaKlInputs dense = x;
  dense.dm.K = 0;
  const CsaKlRef rd = csa_kl_ref(dense, layout);
  const int64_t n_e = x.dm.n_e;
  x.topk.assign(size_t(x.dm.b * x.dm.s * x.dm.K), -1);
  for (int64_t row = 0; row < x.dm.b * x.dm.s; ++row) {
    std::vector<int32_t> vis;
    for (int64_t e = 0; e < n_e; ++e)
      if (rd.cand[size_t(row * n_e + e)]) vis.push_back(int32_t(e));
    std::stable_sort(vis.begin(), vis.end(), [&](int32_t a, int32_t b2) {
      return rd.I[size_t(row * n_e + a)] > rd.I[size_t(row * n_e + b2)];
    });
    for (size_t i = 0; i < vis.size() && int64_t(i) < x.dm.K; ++i) x.topk[size_t(row * x.dm.K) + i] = vis[i];
  }
}

// A row's float64 inputs (f32-representable) and the heads whose lse is +inf (an infinite sink).
struct CsaKlRowData {
  CsaKlData d;
  std::vector<char> inf_head;  // [H]
};

inline CsaKlRowData csa_kl_row_data(const CsaKlRow& r) {
  CsaKlCase c = r.c;
  c.sink = r.sink != CsaSink::none;
  CsaKlRowData out{csa_kl_data(c), std::vector<char>(size_t(c.H), 0)};
  CsaKlInputs& x = out.d.x;
  if (r.sink == CsaSink::large) std::fill(x.sink.begin(), x.sink.end(), 80.0);
  if (r.sink == CsaSink::inf_one) x.sink[size_t(std::min<int64_t>(1, c.H - 1))] = INFINITY;
  if (r.sink == CsaSink::inf_all) std::fill(x.sink.begin(), x.sink.end(), INFINITY);
  for (size_t h = 0; h < x.sink.size(); ++h) out.inf_head[h] = std::isinf(x.sink[h]) && x.sink[h] > 0;
  if (r.relu_edges) {
    const size_t dI = size_t(c.dI);
    for (int64_t i = 0; i < c.b * x.dm.n_e; ++i) {
      double* k = x.kI.data() + size_t(i) * dI;
      if (i % 4 == 1) std::copy(k - dI, k, k);     // ties entry i - 1 exactly
      if (i % 4 == 3) std::fill(k, k + dI, 0.0);   // every s = 0: relu' = 0, I = 0
    }
    for (int64_t row = 0; row < c.b * c.s; ++row)
      if (row % 5 == 1) std::fill(x.qI.begin() + row * c.nI * c.dI, x.qI.begin() + (row + 1) * c.nI * c.dI, 0.0);
  }
  if (r.zero_weight) {  // the last real row with two candidates or more
    for (int64_t row = c.b * c.s - 1; row >= 0; --row) {
      const std::vector<char> C = csa_kl_candidates(x, out.d.layout, row / c.s, row % c.s);
      if (std::count(C.begin(), C.end(), 1) >= 2) {
        x.row_weight[size_t(row)] = 0.0;
        break;
      }
    }
  }
  if (r.bf16)
    for (std::vector<double>* v : {&x.qI, &x.kI, &x.q, &x.ent})
      for (double& e : *v) e = double(bf16_to_f32(f32_to_bf16(float(e))));
  csa_kl_retable(x, out.d.layout);
  return out;
}

// The attention's [b, H, s] lse on `dev` (attn_compressed_fwd, dense, or selected on the table), an
// infinite sink's head +inf (the attention's denominator then is; the attention itself gets a finite
// sink), read back.
inline std::vector<float> csa_kl_lse(const CsaKlRowData& rd, Device dev) {
  const CsaKlInputs& x = rd.d.x;
  const CsaKlDims& m = x.dm;
  auto f32 = [dev](const Shape& sh, const std::vector<double>& v) {
    return Tensor::from_vector<float>(sh, std::vector<float>(v.begin(), v.end())).to(dev);
  };
  AttnCompressedInputs a;
  a.q = f32({m.b, m.s, m.H, m.d}, x.q);
  a.kv = f32({m.b, m.s, m.d}, x.kv);
  if (m.n_e > 0) {
    a.ent = f32({m.b, m.n_e, m.d}, x.ent);
    a.ent_last = Tensor::from_vector<int32_t>({m.b, m.n_e}, x.ent_last).to(dev);
    a.ent_doc = Tensor::from_vector<int32_t>({m.b, m.n_e}, x.ent_doc).to(dev);
  }
  if (m.K > 0) a.idx = Tensor::from_vector<int32_t>({m.b, m.s, m.K}, x.topk).to(dev);
  if (!x.sink.empty()) {
    std::vector<double> s = x.sink;
    for (double& v : s) v = std::isinf(v) ? 0.0 : v;
    a.sink = f32({m.H}, s);
  }
  a.layout = &rd.d.layout;
  a.scale = float(x.scale);
  a.window = m.window;
  std::vector<float> lse = attn_compressed_fwd(a).lse.to_vector<float>();
  for (int64_t bb = 0; bb < m.b; ++bb)
    for (int64_t h = 0; h < m.H; ++h)
      if (rd.inf_head[size_t(h)]) std::fill_n(lse.begin() + (bb * m.H + h) * m.s, m.s, INFINITY);
  return lse;
}

// The KL's inputs on `dev` from the row's data and a given lse (q strided: the same values as
// columns [0, d) of a [b, s, H, d + 3] tensor; bf16: qI, kI, q and ent as bf16 tensors). The result
// holds the tensors; rd must outlive it.
inline CompressedIndexKlInputs csa_kl_inputs(const CsaKlRowData& rd, Device dev, bool strided_q, const std::vector<float>& lse,
                                             bool in_bf16 = false) {
  const CsaKlInputs& x = rd.d.x;
  const CsaKlDims& m = x.dm;
  auto f32 = [dev](const Shape& sh, const std::vector<double>& v) {
    return Tensor::from_vector<float>(sh, std::vector<float>(v.begin(), v.end())).to(dev);
  };
  auto qk = [&](const Shape& sh, const std::vector<double>& v) {  // the bf16 rows' dtype for qI, kI, q, ent
    if (!in_bf16) return f32(sh, v);
    Tensor h = Tensor::empty(sh, DType::bf16);
    for (size_t i = 0; i < v.size(); ++i) h.data<bf16>()[i] = f32_to_bf16(float(v[i]));
    return h.to(dev);
  };
  CompressedIndexKlInputs in;
  in.sc.qI = qk({m.b, m.s, m.nI, m.dI}, x.qI);
  in.sc.kI = qk({m.b, m.n_e, m.dI}, x.kI);
  in.sc.w = f32({m.b, m.s, m.nI}, x.w);
  in.sc.ent_last = Tensor::from_vector<int32_t>({m.b, m.n_e}, x.ent_last).to(dev);
  in.sc.ent_doc = Tensor::from_vector<int32_t>({m.b, m.n_e}, x.ent_doc).to(dev);
  in.sc.layout = &rd.d.layout;
  if (strided_q) {
    std::vector<double> wide(size_t(m.b * m.s * m.H * (m.d + 3)), 7.0);
    for (int64_t i = 0; i < m.b * m.s * m.H; ++i) std::copy_n(x.q.begin() + i * m.d, m.d, wide.begin() + i * (m.d + 3));
    in.q = qk({m.b, m.s, m.H, m.d + 3}, wide).slice(3, 0, m.d);
  } else {
    in.q = qk({m.b, m.s, m.H, m.d}, x.q);
  }
  in.ent = qk({m.b, m.n_e, m.d}, x.ent);
  in.lse = Tensor::from_vector<float>({m.b, m.H, m.s}, lse).to(dev);
  in.scale = float(x.scale);
  in.row_weight = f32({m.b, m.s}, x.row_weight);
  in.coeff = float(x.coeff);
  if (m.K > 0) in.topk = Tensor::from_vector<int32_t>({m.b, m.s, m.K}, x.topk).to(dev);
  return in;
}

// What one run of the op gives, on the host.
struct CsaKlGot {
  double kl_sum = 0, loss = 0;
  std::vector<float> dqI, dkI, dw;
};

// shards > 1 (context parallelism's row shards): the query rows in `shards` calls at q_row0 = k s /
// shards, their rows put together, their dkI summed in shard order in f32 and their sums added.
inline CsaKlGot csa_kl_run(const CsaKlRowData& rd, Device dev, bool strided_q, const std::vector<float>& lse,
                           int64_t shards = 1, bool in_bf16 = false) {
  const CompressedIndexKlInputs in = csa_kl_inputs(rd, dev, strided_q, lse, in_bf16);
  const CsaKlDims& m = rd.d.x.dm;
  CsaKlGot g;
  g.dqI.assign(size_t(m.b * m.s * m.nI * m.dI), 0.f), g.dkI.assign(size_t(m.b * m.n_e * m.dI), 0.f);
  g.dw.assign(size_t(m.b * m.s * m.nI), 0.f);
  for (int64_t k = 0; k < shards; ++k) {
    const int64_t r0 = k * m.s / shards, r1 = (k + 1) * m.s / shards, sq = r1 - r0;
    CompressedIndexKlInputs ik = in;
    ik.sc.qI = in.sc.qI.slice(1, r0, r1).clone(), ik.sc.w = in.sc.w.slice(1, r0, r1).clone(), ik.sc.q_row0 = r0;
    ik.q = in.q.slice(1, r0, r1), ik.lse = in.lse.slice(2, r0, r1).clone();
    ik.row_weight = in.row_weight.slice(1, r0, r1).clone();
    if (m.K > 0) ik.topk = in.topk.slice(1, r0, r1).clone();
    const CompressedIndexKlResult r = m.K > 0 ? compressed_index_kl_sparse(ik) : compressed_index_kl_dense(ik);
    g.kl_sum += r.kl_sum, g.loss += r.loss;
    const std::vector<float> dqI = r.dqI.to_vector<float>(), dkI = r.dkI.to_vector<float>(), dw = r.dw.to_vector<float>();
    for (int64_t bb = 0; bb < m.b; ++bb) {
      std::copy_n(dqI.begin() + bb * sq * m.nI * m.dI, sq * m.nI * m.dI, g.dqI.begin() + (bb * m.s + r0) * m.nI * m.dI);
      std::copy_n(dw.begin() + bb * sq * m.nI, sq * m.nI, g.dw.begin() + (bb * m.s + r0) * m.nI);
    }
    for (size_t i = 0; i < dkI.size(); ++i) g.dkI[i] += dkI[i];
  }
  return g;
}

// Megatron-LM's computation in f32, the naive way (compute_dsa_indexer_loss, bwd_fused_indexer_loss_naive;
// docs/csa_indexer_kl.md section 1), materialised per batch row: the [H, s, n_e] logits of the entries
// masked to the candidates (cand: [b, s, n_e]), p = exp(z - lse) with the attention's f32 lse, the sum
// over heads, one L1 normalisation; the [s, nI, n_e] index dots, I = sum_g w relu(.), Q the masked
// softmax; kl per row; dI = coeff rw (Q - P); the chain through I by plain loops. A row whose target
// sums to 0 gets no kl and no gradient (hmla's choice, docs/csa_indexer_kl.md section 3).
struct CsaKlNaive {
  double kl_sum = 0;
  std::vector<float> dqI, dkI, dw;
};

inline CsaKlNaive csa_kl_megatron_f32(const CsaKlInputs& x, const std::vector<float>& lse, const std::vector<char>& cand) {
  const CsaKlDims& m = x.dm;
  const int64_t s = m.s, n_e = m.n_e, H = m.H, d = m.d, nI = m.nI, dI = m.dI;
  auto v32 = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
  const std::vector<float> q = v32(x.q), ent = v32(x.ent), qI = v32(x.qI), kI = v32(x.kI), w = v32(x.w), rw = v32(x.row_weight);
  const float scale = float(x.scale), coeff = float(x.coeff);
  CsaKlNaive out;
  out.dqI.assign(qI.size(), 0.f), out.dkI.assign(kI.size(), 0.f), out.dw.assign(w.size(), 0.f);
  for (int64_t bb = 0; bb < m.b; ++bb) {
    std::vector<float> Z(size_t(H * s * n_e), -INFINITY), target(size_t(s * n_e), 0.f);
    std::vector<float> S(size_t(s * nI * n_e), 0.f), I(size_t(s * n_e), -INFINITY);
    const char* c = cand.data() + bb * s * n_e;
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < s; ++t)
        for (int64_t e = 0; e < n_e; ++e) {
          if (!c[t * n_e + e]) continue;
          float acc = 0.f;
          for (int64_t k = 0; k < d; ++k) acc += q[size_t(((bb * s + t) * H + h) * d + k)] * ent[size_t((bb * n_e + e) * d + k)];
          Z[size_t((h * s + t) * n_e + e)] = scale * acc;
        }
    for (int64_t h = 0; h < H; ++h)  // p = exp(z - lse), summed over heads
      for (int64_t t = 0; t < s; ++t)
        for (int64_t e = 0; e < n_e; ++e)
          target[size_t(t * n_e + e)] += std::exp(Z[size_t((h * s + t) * n_e + e)] - lse[size_t((bb * H + h) * s + t)]);
    for (int64_t t = 0; t < s; ++t)
      for (int64_t e = 0; e < n_e; ++e) {
        if (!c[t * n_e + e]) continue;
        float Ie = 0.f;
        for (int64_t g = 0; g < nI; ++g) {
          float acc = 0.f;
          for (int64_t k = 0; k < dI; ++k) acc += qI[size_t(((bb * s + t) * nI + g) * dI + k)] * kI[size_t((bb * n_e + e) * dI + k)];
          S[size_t((t * nI + g) * n_e + e)] = acc;
          Ie += w[size_t((bb * s + t) * nI + g)] * std::max(acc, 0.f);
        }
        I[size_t(t * n_e + e)] = Ie;
      }
    for (int64_t t = 0; t < s; ++t) {
      const int64_t row = bb * s + t;
      float sum = 0.f, mx = -INFINITY;
      for (int64_t e = 0; e < n_e; ++e) sum += target[size_t(t * n_e + e)], mx = std::max(mx, I[size_t(t * n_e + e)]);
      if (!(sum > 0.f)) continue;
      float qs = 0.f;
      for (int64_t e = 0; e < n_e; ++e) qs += std::exp(I[size_t(t * n_e + e)] - mx);
      const float lseI = mx + std::log(qs), g = coeff * rw[size_t(row)];
      float kl = 0.f;
      for (int64_t e = 0; e < n_e; ++e) {
        if (!c[t * n_e + e]) continue;
        const float P = target[size_t(t * n_e + e)] / sum, logQ = I[size_t(t * n_e + e)] - lseI, Q = std::exp(logQ);
        if (P > 0.f) kl += P * (std::log(P) - logQ);
        const float dIe = g * (Q - P);
        for (int64_t gh = 0; gh < nI; ++gh) {
          const float sg = S[size_t((t * nI + gh) * n_e + e)];
          if (!(sg > 0.f)) continue;
          out.dw[size_t(row * nI + gh)] += dIe * sg;
          const float ds = dIe * w[size_t(row * nI + gh)];
          for (int64_t k = 0; k < dI; ++k) {
            out.dqI[size_t((row * nI + gh) * dI + k)] += ds * kI[size_t((bb * n_e + e) * dI + k)];
            out.dkI[size_t((bb * n_e + e) * dI + k)] += ds * qI[size_t((row * nI + gh) * dI + k)];
          }
        }
      }
      out.kl_sum += double(rw[size_t(row)]) * double(kl);
    }
  }
  return out;
}

// The rounding term's inputs from the oracle: zmax (the largest exponent argument's magnitude that
// enters a P or Q) and, per output, the magnitude mag of the header's argument.
struct CsaKlMags {
  double zmax = 0, dqI = 0, dkI = 0, dw = 0, kl = 0;
};

inline CsaKlMags csa_kl_mags(const CsaKlInputs& x, const CsaKlRef& r) {
  const CsaKlDims& m = x.dm;
  const int64_t s = m.s, n_e = m.n_e, H = m.H, nI = m.nI, dI = m.dI;
  auto dot = [](const double* a, const double* c, int64_t n) {
    double acc = 0;
    for (int64_t k = 0; k < n; ++k) acc += a[k] * c[k];
    return acc;
  };
  CsaKlMags g;
  std::vector<double> mk(x.kI.size(), 0.0);
  for (int64_t row = 0; row < m.b * s; ++row) {
    if (!r.has_target[size_t(row)]) continue;
    const int64_t bb = row / s, t = row % s;
    const double gr = x.coeff * x.row_weight[size_t(row)];
    std::vector<double> z(size_t(H * n_e), 0.0), dq(size_t(nI * dI), 0.0), dwm(size_t(nI), 0.0);
    double Z = 0;  // sum_h sum_C exp(z - lse): log Z enters every P's exponent
    for (int64_t e = 0; e < n_e; ++e)
      for (int64_t h = 0; h < H; ++h) {
        const double lse = r.lse[size_t((bb * H + h) * s + t)];
        if (!r.cand[size_t(row * n_e + e)] || std::isinf(lse)) continue;
        z[size_t(h * n_e + e)] = x.scale * dot(&x.q[size_t((row * H + h) * m.d)], &x.ent[size_t((bb * n_e + e) * m.d)], m.d);
        Z += std::exp(z[size_t(h * n_e + e)] - lse);
      }
    for (int64_t e = 0; e < n_e; ++e) {
      if (!r.cand[size_t(row * n_e + e)]) continue;
      const double P = r.P[size_t(row * n_e + e)], Q = r.Q[size_t(row * n_e + e)], I = r.I[size_t(row * n_e + e)];
      g.zmax = std::max(g.zmax, std::abs(I) + std::abs(I - std::log(Q)));  // I - lseI
      for (int64_t h = 0; h < H; ++h) {
        const double lse = r.lse[size_t((bb * H + h) * s + t)];
        if (!std::isinf(lse)) g.zmax = std::max(g.zmax, std::abs(z[size_t(h * n_e + e)]) + std::abs(lse) + std::abs(std::log(Z)));
      }
      if (P > 0) g.kl += x.row_weight[size_t(row)] * P * (std::abs(std::log(P)) + std::abs(std::log(Q)) + 1);
      const double a = gr * (P + Q);
      const double* ke = &x.kI[size_t((bb * n_e + e) * dI)];
      for (int64_t gh = 0; gh < nI; ++gh) {
        const double* qg = &x.qI[size_t((row * nI + gh) * dI)];
        const double wg = std::abs(x.w[size_t(row * nI + gh)]);
        dwm[size_t(gh)] += a * std::abs(dot(qg, ke, dI));
        for (int64_t k = 0; k < dI; ++k) {
          dq[size_t(gh * dI + k)] += a * wg * std::abs(ke[k]);
          mk[size_t((bb * n_e + e) * dI + k)] += a * wg * std::abs(qg[k]);
        }
      }
    }
    for (double v : dq) g.dqI = std::max(g.dqI, v);
    for (double v : dwm) g.dw = std::max(g.dw, v);
  }
  for (double v : mk) g.dkI = std::max(g.dkI, v);
  return g;
}

// One output against the oracle by the rule: "" or what is wrong; worst = error / bound.
template <class A>
std::string csa_kl_within(const char* what, const std::vector<A>& got, const std::vector<float>& naive,
                          const std::vector<double>& ref, double rounding, double& worst) {
  if (got.size() != ref.size() || naive.size() != ref.size())
    return std::string(what) + ": " + std::to_string(got.size()) + " values, expected " + std::to_string(ref.size()) + "; ";
  double e = 0, n = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double gi = double(got[i]);
    e = std::isnan(gi) ? INFINITY : std::max(e, std::abs(gi - ref[i]));
    n = std::max(n, std::abs(double(naive[i]) - ref[i]));
    if (std::isinf(e)) break;
  }
  const double bound = 2 * n + rounding;
  worst = bound > 0 ? e / bound : (e > 0 ? INFINITY : 0);
  if (const char* v = std::getenv("HMLA_REPORT_ERRORS"); v && *v)
    std::printf("  %s: err %.3g naive %.3g bound %.3g (err/bound %.3g)\n", what, e, n, bound, worst);
  if (!(e <= bound)) return std::string(what) + ": max error " + std::to_string(e) + " > bound " + std::to_string(bound) + "; ";
  return "";
}

// Guards the data against scores at the relu kink: a nonzero s_g within f32's rounding of 0 would
// give the op and the oracle different relu' (the relu-edge rows set exact zeros on purpose).
inline std::string csa_kl_kink_free(const CsaKlInputs& x, const CsaKlRef& r) {
  const CsaKlDims& m = x.dm;
  for (int64_t row = 0; row < m.b * m.s; ++row)
    for (int64_t e = 0; e < m.n_e; ++e) {
      if (!r.cand[size_t(row * m.n_e + e)]) continue;
      for (int64_t g = 0; g < m.nI; ++g) {
        double sg = 0, a = 0;
        for (int64_t k = 0; k < m.dI; ++k) {
          const double p = x.qI[size_t((row * m.nI + g) * m.dI + k)] * x.kI[size_t(((row / m.s) * m.n_e + e) * m.dI + k)];
          sg += p, a += std::abs(p);
        }
        if (sg != 0 && std::abs(sg) <= 4 * double(m.dI) * 0x1p-24 * a) return "a score at the relu kink: pick another seed; ";
      }
    }
  return "";
}

// The attention's f32 lse against the oracle's denominator (window, attended entries, sink): +inf
// exactly where the oracle's is; else within (d + 4) roundings of the largest magnitude that enters
// it: a logit's dot product (d steps of sum |q k|) and the exp, sum and log (8 u a margin).
inline std::string csa_kl_check_lse(const CsaKlInputs& x, const DocLayout& layout, const CsaKlRef& r, const std::vector<float>& lse) {
  const CsaKlDims& m = x.dm;
  const int32_t* ds = layout.doc_start.data<int32_t>();
  for (int64_t bb = 0; bb < m.b; ++bb)
    for (int64_t h = 0; h < m.H; ++h)
      for (int64_t t = 0; t < m.s; ++t) {
        const size_t i = size_t((bb * m.H + h) * m.s + t);
        const int64_t row = bb * m.s + t, st = ds[row];
        if (std::isinf(r.lse[i]) || std::isinf(lse[i])) {
          if (double(lse[i]) != r.lse[i]) return "lse[" + std::to_string(i) + "] " + std::to_string(lse[i]) + ", the oracle's " + std::to_string(r.lse[i]) + "; ";
          continue;
        }
        double A = x.sink.empty() ? 0.0 : std::abs(x.sink[size_t(h)]);  // sum |q k| scale over the row's keys
        auto mag = [&](const double* k) {
          double a = 0;
          for (int64_t c = 0; c < m.d; ++c) a += std::abs(x.q[size_t((row * m.H + h) * m.d + c)] * k[c]);
          return a * x.scale;
        };
        for (int64_t u = std::max(st, t - m.window + 1); u <= t; ++u) A = std::max(A, mag(&x.kv[size_t((bb * m.s + u) * m.d)]));
        for (int64_t e = 0; e < m.n_e; ++e)
          if (r.cand[size_t(row * m.n_e + e)]) A = std::max(A, mag(&x.ent[size_t((bb * m.n_e + e) * m.d)]));
        const double bound = 8 * 0x1p-24 * double(m.d + 4) * (1 + A + std::abs(r.lse[i]));
        if (!(std::abs(double(lse[i]) - r.lse[i]) <= bound))
          return "lse[" + std::to_string(i) + "]: error " + std::to_string(std::abs(double(lse[i]) - r.lse[i])) + " > " + std::to_string(bound) + "; ";
      }
  return "";
}

// The row on a device: the op twice (the bits must repeat), each output against the oracle by the rule
// (shards: csa_kl_run's; the shard sum adds (shards - 1) u mag to dkI's rounding term).
inline std::string check(const CsaKlRow& row, Device dev, int64_t shards = 1) {
  const CsaKlRowData rd = csa_kl_row_data(row);
  const CsaKlInputs& x = rd.d.x;
  const CsaKlRef r = csa_kl_ref(x, rd.d.layout);
  std::string err = csa_kl_kink_free(x, r);
  const std::vector<float> lse = csa_kl_lse(rd, dev);
  err += csa_kl_check_lse(x, rd.d.layout, r, lse);
  const CsaKlGot g = csa_kl_run(rd, dev, row.strided_q, lse, shards, row.bf16),
                 g2 = csa_kl_run(rd, dev, row.strided_q, lse, shards, row.bf16);
  auto same = [](const CsaKlGot& a, const CsaKlGot& b) {
    return std::memcmp(&a.kl_sum, &b.kl_sum, sizeof(double)) == 0 && a.dqI == b.dqI && a.dkI == b.dkI && a.dw == b.dw;
  };
  if (!same(g, g2)) err += "two runs differ; ";
  if (row.bf16 && !same(g, csa_kl_run(rd, dev, row.strided_q, lse, shards, false)))
    err += "bf16 inputs differ from f32 tensors holding their values; ";
  if (!(std::abs(g.loss - x.coeff * g.kl_sum) <= 1e-12 * std::abs(g.loss))) err += "loss != coeff kl_sum; ";
  const CsaKlNaive nv = csa_kl_megatron_f32(x, lse, r.cand);
  const CsaKlMags mg = csa_kl_mags(x, r);
  const double f = 8 * 0x1p-24 * (1 + mg.zmax);
  if (const char* v = std::getenv("HMLA_REPORT_ERRORS"); v && *v)
    std::printf("csa_kl %s %s (zmax %.3g):\n", row.name.c_str(), device_name(dev), mg.zmax);
  double worst = 0;
  err += csa_kl_within("kl_sum", std::vector<double>{g.kl_sum}, std::vector<float>{float(nv.kl_sum)},
                       std::vector<double>{r.kl_sum}, f * mg.kl, worst);
  err += csa_kl_within("dqI", g.dqI, nv.dqI, r.dqI, f * mg.dqI, worst);
  err += csa_kl_within("dkI", g.dkI, nv.dkI, r.dkI, (f + double(shards - 1) * 0x1p-24) * mg.dkI, worst);
  err += csa_kl_within("dw", g.dw, nv.dw, r.dw, f * mg.dw, worst);
  return err;
}

inline CompressedIndexKlParams params(const CsaKlRow& r) {
  CompressedIndexKlParams p;
  p.b = r.c.b, p.s = p.sq = r.c.s, p.nI = r.c.nI, p.dI = r.c.dI, p.H = r.c.H, p.d = r.c.d, p.K = r.c.K;
  p.dtype = p.qk_dtype = r.bf16 ? DType::bf16 : DType::f32;
  return p;
}
// The runner's attention forward (f32, dense or selected on the table) and the KL.
inline void uses(Uses& u, const CsaKlRow& r, DType) {
  AttnCompressedParams a;
  a.b = r.c.b, a.s = a.sq = r.c.s, a.H = r.c.H, a.d = r.c.d, a.k = r.c.K, a.window = r.c.W;
  if (r.sink != CsaSink::none) a.sink = reinterpret_cast<const float*>(&detail::marker);
  u(Op::attn_compressed_fwd, a)(r.c.K > 0 ? Op::compressed_index_kl_sparse : Op::compressed_index_kl_dense, params(r));
}

inline void case_rows_csa_kl(const Backend& be, std::vector<RowUse>& out) {
  add_checked_rows(out, "csa_kl", be, be.compute_dtype(), csa_kl_rows());
  add_checked_rows(out, "csa_kl_bf16", be, be.compute_dtype(), csa_kl_bf16_rows());
}

}  // namespace hmla::op_cases
