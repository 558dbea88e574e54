// The CSA indexer over compressed entries (hmla/ops/compressed_index.h) in the registry: packed
// documents (one shorter than the rate, so without entries; a padded tail), b = 2, K below and
// above the visible count (-1 pads), K = 1, no entries at all, more visible entries than a CUDA
// block has threads, nI and dI that are multiples of nothing, and exact ties (entries with
// identical kI, entries with kI = 0 and query rows with qI = 0, whose scores are exactly 0). Each
// row's check (tests/ops/test_case_rows.cpp, the CPU and the emulated CUDA device) compares the
// scores and the table with compressed_index_ref, the float64 definition with plain loops, and on
// CUDA also the CPU's scores and table on the same inputs, bit for bit.
//
// The error argument (u = 2^-24, gamma_n = n u / (1 - n u)). Per head the f32 dot product is a
// chain of dI fmaf steps, each rounding once: |d^ - d| <= gamma_dI A_h with A_h = sum_c |q_c k_c|;
// relu is 1-Lipschitz; the head sum is a chain of nI fmaf steps: |I^ - I| <= gamma_dI M +
// gamma_nI (1 + gamma_dI) M =: delta(t, e), M = sum_h |w_h| A_h (plus 2^-149 per step for an
// underflow). The scores check asserts exactly that per element (-inf exactly where not visible).
//
// bf16 rows (compressed_index_bf16: bf16 qI and kI, f32 w; CUDA only, the CPU's plans take f32):
// the inputs are rounded to bf16 first, so the oracle sees the op's values and the rounding of the
// inputs costs nothing; what remains is the f32 arithmetic on them. The SIMT path widens bf16 exactly
// and runs the f32 chain above: the same delta, and the CPU's bits on f32 tensors holding the same
// values. The tensor-core path (nI, dI multiples of 16): a product of two bf16 is exact in f32, the
// mma sums the dI products in f32 in an order of its own (any order: gamma_dI A_h), and the head sum
// is nI products w relu(d) added in an order of its own (lanes, then a shuffle tree): gamma_(nI+1)
// (1 + gamma_dI) M. The tensor cores' additions are not specified to round to nearest (truncation
// doubles the unit roundoff), so the rows allow twice that: delta_tc = 2 (gamma_dI + gamma_(nI+1)
// (1 + gamma_dI)) M. The tables follow by the same argument with delta_tc for delta: a selected
// entry's true score is within 2 delta_row of the oracle's K-th best at its slot. Ties certain on the
// tensor cores: M = 0 only (every product exactly 0); entries with identical kI are not, since the
// order of an mma's sum is its own per output column (the emulator's schedules vary it).
// Tables: if every computed score is within delta_row (the row's largest delta) of the true one,
// the computed k-th largest score is within delta_row of the true k-th largest (order statistics
// are 1-Lipschitz in the max norm), so the entry a backend puts at slot k has a true score within
// 2 delta_row of the oracle's k-th: where the oracle's neighbours are closer than that, either
// order passes; elsewhere only the oracle's entry does. The count of valid slots, the -1 pads, the
// visibility and distinctness of the picks are exact. Ties that are certain in f32 as well (two
// entries with bitwise identical kI, or M = 0 for both: every product is exactly 0) must come out
// by ascending entry, wherever they sit in the row.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "case_support.h"
#include "hmla/core/layout.h"
#include "hmla/ops/compressed_index.h"

namespace hmla::op_cases {

struct CompressedIndexCase {
  std::string name;
  Oracle oracle;
  int64_t b, s, nI, dI, m, K;            // m: the compressor's rate (an entry per m rows of a document)
  std::vector<std::vector<int64_t>> cu;  // per batch row: cu_seqlens (rows after the last: padding)
  bool ties = false;                     // identical kI pairs, kI = 0 entries, qI = 0 query rows
  bool bf16 = false;                     // bf16 qI and kI (CUDA: the tensor cores at widths they take)
};
inline void PrintTo(const CompressedIndexCase& c, std::ostream* os) { print_row(c, os); }

inline std::vector<CompressedIndexCase> compressed_index_cases() {
  const Oracle o = Oracle::compressed_index_ref;
  // Documents [0,3) shorter than the rate (no entry), [3,9), [9,33); rows 33..39 padding.
  const std::vector<int64_t> packed{0, 3, 9, 33};
  return {
      {"packed_k_small", o, 1, 40, 3, 7, 4, 3, {packed}},
      {"k_over_visible", o, 1, 36, 5, 13, 2, 20, {{0, 11, 36}}},
      {"two_rows", o, 2, 30, 2, 9, 3, 4, {{0, 13, 30}, {0, 1, 4, 26}}},
      {"ties", o, 2, 32, 3, 5, 2, 6, {{0, 17, 32}, {0, 32}}, true},
      {"ties_k_over_visible", o, 1, 24, 1, 3, 2, 16, {{0, 5, 24}}, true},
      {"k1_m1", o, 1, 20, 2, 3, 1, 1, {{0, 7, 20}}},
      {"no_entries", o, 1, 10, 2, 3, 16, 4, {{0, 10}}},
      // Up to 150 visible entries: more than a CUDA block's 128 threads, and a radix select.
      {"many_entries", o, 1, 300, 4, 11, 2, 37, {{0, 290}}, true},
  };
}

// The bf16 rows (the error argument above): widths the tensor cores take (nI, dI multiples of 16), in
// packed documents, b = 2, ties, K over the visible count, no entries, more rows than a chunk's block
// and more entries than a key tile; and widths they do not take (the SIMT kernels, widened).
inline std::vector<CompressedIndexCase> compressed_index_bf16_cases() {
  const Oracle o = Oracle::compressed_index_ref;
  const std::vector<int64_t> packed{0, 3, 9, 33};
  return {
      {"mma_packed", o, 1, 40, 16, 32, 4, 3, {packed}, false, true},
      {"mma_two_rows_ties", o, 2, 48, 32, 16, 2, 8, {{0, 21, 48}, {0, 1, 4, 40}}, true, true},
      {"mma_k_over_visible", o, 1, 36, 16, 16, 2, 20, {{0, 11, 36}}, false, true},
      {"mma_no_entries", o, 1, 10, 16, 16, 16, 4, {{0, 10}}, false, true},
      // Up to 95 visible entries: two key tiles of 64, a radix select.
      {"mma_many_entries", o, 1, 200, 16, 32, 2, 37, {{0, 190}}, true, true},
      {"simt_odd_widths", o, 1, 36, 5, 13, 2, 6, {{0, 11, 36}}, true, true},
  };
}

// A row's inputs, f64 (the values every backend sees: f32-representable; bf16 rows' qI and kI
// bf16-representable).
struct CompressedIndexData {
  int64_t n_e = 0;
  std::vector<double> qI, kI, w;
  std::vector<int32_t> ent_last, ent_doc;
  DocLayout layout;
};

inline CompressedIndexData compressed_index_data(const CompressedIndexCase& c) {
  CompressedIndexData x;
  x.layout = layout_from_cu_seqlens(c.s, c.cu);
  std::vector<std::vector<std::pair<int32_t, int32_t>>> ents(size_t(c.b));  // (doc, last) per row
  for (int64_t bb = 0; bb < c.b; ++bb)
    for (size_t i = 0; i + 1 < c.cu[size_t(bb)].size(); ++i) {
      const int64_t st = c.cu[size_t(bb)][i], en = c.cu[size_t(bb)][i + 1];
      for (int64_t w = 0; (w + 1) * c.m <= en - st; ++w) ents[size_t(bb)].push_back({int32_t(st), int32_t(st + (w + 1) * c.m - 1)});
    }
  for (const auto& r : ents) x.n_e = std::max<int64_t>(x.n_e, int64_t(r.size()));
  x.ent_last.assign(size_t(c.b * x.n_e), -1), x.ent_doc.assign(size_t(c.b * x.n_e), -1);  // a shorter row's tail
  for (int64_t bb = 0; bb < c.b; ++bb)
    for (size_t e = 0; e < ents[size_t(bb)].size(); ++e)
      x.ent_doc[size_t(bb * x.n_e) + e] = ents[size_t(bb)][e].first, x.ent_last[size_t(bb * x.n_e) + e] = ents[size_t(bb)][e].second;
  std::mt19937 g(uint32_t(c.s * 131 + c.nI * 7 + c.dI + c.K));
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  auto fill = [&](std::vector<double>& v, size_t n, double a) {
    v.resize(n);
    for (double& e : v) e = double(float(a * u(g)));
  };
  fill(x.qI, size_t(c.b * c.s * c.nI * c.dI), 1.0);
  fill(x.kI, size_t(c.b * x.n_e * c.dI), 1.0);
  if (c.bf16)
    for (std::vector<double>* v : {&x.qI, &x.kI})
      for (double& e : *v) e = double(bf16_to_f32(f32_to_bf16(float(e))));
  fill(x.w, size_t(c.b * c.s * c.nI), 1.0 / std::sqrt(double(c.nI * c.dI)));  // both scales folded in, both signs
  if (c.ties) {
    const size_t dI = size_t(c.dI);
    for (int64_t i = 0; i < c.b * x.n_e; ++i) {
      double* k = x.kI.data() + size_t(i) * dI;
      if (i % 4 == 1) std::copy(k - dI, k, k);  // entry e ties entry e - 1 exactly (same document mostly)
      if (i % 4 == 3) std::fill(k, k + dI, 0.0);  // score exactly 0
    }
    for (int64_t r = 0; r < c.b * c.s; ++r)
      if (r % 5 == 1) std::fill(x.qI.begin() + r * c.nI * c.dI, x.qI.begin() + (r + 1) * c.nI * c.dI, 0.0);  // a row of 0s
  }
  return x;
}

// The float64 definition: plain loops, visibility tested entry by entry (no binary search), the
// selection a stable sort of every visible entry. mag: M(t, e) = sum_h |w_h| sum_c |q_c k_c|.
struct CompressedIndexRef {
  std::vector<double> scores, mag;  // [b, s, n_e]; -inf and 0 where not visible
  std::vector<int32_t> idx;         // [b, s, K]
};

inline CompressedIndexRef compressed_index_ref(const CompressedIndexCase& c, const CompressedIndexData& x) {
  const int64_t n_e = x.n_e, nI = c.nI, dI = c.dI;
  const int32_t* ds = x.layout.doc_start.data<int32_t>();
  CompressedIndexRef r;
  r.scores.assign(size_t(c.b * c.s * n_e), -INFINITY), r.mag.assign(r.scores.size(), 0.0);
  r.idx.assign(size_t(c.b * c.s * c.K), -1);
  for (int64_t bb = 0; bb < c.b; ++bb)
    for (int64_t t = 0; t < c.s; ++t) {
      const int64_t row = bb * c.s + t, st = ds[row];
      std::vector<int32_t> vis;
      for (int64_t e = 0; e < n_e; ++e) {
        if (st > t || x.ent_doc[size_t(bb * n_e + e)] != st || x.ent_last[size_t(bb * n_e + e)] > t) continue;
        double I = 0, M = 0;
        for (int64_t h = 0; h < nI; ++h) {
          double d = 0, a = 0;
          for (int64_t ch = 0; ch < dI; ++ch) {
            const double p = x.qI[size_t((row * nI + h) * dI + ch)] * x.kI[size_t((bb * n_e + e) * dI + ch)];
            d += p, a += std::abs(p);
          }
          const double wh = x.w[size_t(row * nI + h)];
          I += wh * std::max(d, 0.0), M += std::abs(wh) * a;
        }
        r.scores[size_t(row * n_e + e)] = I, r.mag[size_t(row * n_e + e)] = M;
        vis.push_back(int32_t(e));
      }
      std::stable_sort(vis.begin(), vis.end(), [&](int32_t a, int32_t b2) {
        return r.scores[size_t(row * n_e + a)] > r.scores[size_t(row * n_e + b2)];
      });
      for (size_t i = 0; i < vis.size() && int64_t(i) < c.K; ++i) r.idx[size_t(row * c.K) + i] = vis[i];
    }
  return r;
}

inline CompressedIndexParams params(const CompressedIndexCase& c, bool topk) {
  const CompressedIndexData x = compressed_index_data(c);
  CompressedIndexParams p;
  p.dtype = c.bf16 ? DType::bf16 : DType::f32;
  p.b = c.b, p.s = p.sq = c.s, p.nI = c.nI, p.dI = c.dI, p.n_e = x.n_e, p.K = topk ? c.K : 0;
  return p;
}
// The row's dtype whatever the backend's compute dtype (f32 rows: the CPU's bits on CUDA too).
inline void uses(Uses& u, const CompressedIndexCase& c, DType) {
  u(Op::compressed_index_topk, params(c, true))(Op::compressed_index_scores, params(c, false));
}

// delta(t, e) of the error argument above; tc: the tensor cores' delta_tc.
inline double compressed_index_bound(const CompressedIndexCase& c, double mag, bool tc = false) {
  const double u = 0x1p-24;
  auto gamma = [u](double n) { return n * u / (1 - n * u); };
  const double under = double(c.nI * (c.dI + 1)) * 0x1p-149;
  if (tc) return 2 * (gamma(double(c.dI)) + gamma(double(c.nI + 1)) * (1 + gamma(double(c.dI)))) * mag + 2 * under;
  return (gamma(double(c.dI)) + gamma(double(c.nI)) * (1 + gamma(double(c.dI)))) * mag + under;
}

// The table of one row (valid slots first) against the oracle, by the argument above; "" or what differs.
inline std::string compressed_index_check_table(const CompressedIndexCase& c, const CompressedIndexData& x,
                                                const CompressedIndexRef& r, const std::vector<int32_t>& got,
                                                bool tc = false) {
  const int64_t n_e = x.n_e, K = c.K;
  for (int64_t row = 0; row < c.b * c.s; ++row) {
    const int64_t bb = row / c.s, t = row % c.s;
    const int32_t* g = got.data() + row * K;
    const int32_t* want = r.idx.data() + row * K;
    const std::string at = "row " + std::to_string(bb) + ", t " + std::to_string(t) + ": ";
    int64_t n_vis = 0, n_got = 0;
    double delta = 0;
    for (int64_t e = 0; e < n_e; ++e)
      if (std::isfinite(r.scores[size_t(row * n_e + e)]))
        ++n_vis, delta = std::max(delta, compressed_index_bound(c, r.mag[size_t(row * n_e + e)], tc));
    while (n_got < K && g[n_got] != -1) ++n_got;
    for (int64_t k = n_got; k < K; ++k)
      if (g[k] != -1) return at + "slot " + std::to_string(k) + " holds " + std::to_string(g[k]) + " after a -1";
    if (n_got != std::min(n_vis, K))
      return at + std::to_string(n_got) + " picks, expected min(K, visible) = " + std::to_string(std::min(n_vis, K));
    std::vector<double> sorted;  // the oracle's scores of the visible entries, descending
    for (int64_t e = 0; e < n_e; ++e)
      if (std::isfinite(r.scores[size_t(row * n_e + e)])) sorted.push_back(r.scores[size_t(row * n_e + e)]);
    std::sort(sorted.begin(), sorted.end(), [](double a, double b2) { return a > b2; });
    for (int64_t k = 0; k < n_got; ++k) {
      if (g[k] < 0 || g[k] >= n_e || !std::isfinite(r.scores[size_t(row * n_e + g[k])]))
        return at + "slot " + std::to_string(k) + " picks " + std::to_string(g[k]) + ", not a visible entry";
      for (int64_t k2 = 0; k2 < k; ++k2)
        if (g[k2] == g[k]) return at + "entry " + std::to_string(g[k]) + " picked twice";
      const double sc = r.scores[size_t(row * n_e + g[k])];
      if (g[k] != want[k] && !(std::abs(sc - sorted[size_t(k)]) <= 2 * delta))
        return at + "slot " + std::to_string(k) + " picks " + std::to_string(g[k]) + " (score " + std::to_string(sc) +
               "), the oracle " + std::to_string(want[k]) + " (" + std::to_string(sorted[size_t(k)]) + "), 2 delta " +
               std::to_string(2 * delta);
    }
    auto certain_tie = [&](int32_t a, int32_t b2) {
      const double* ka = x.kI.data() + (bb * n_e + a) * c.dI;
      const double* kb = x.kI.data() + (bb * n_e + b2) * c.dI;
      return (!tc && std::equal(ka, ka + c.dI, kb)) ||
             (r.mag[size_t(row * n_e + a)] == 0 && r.mag[size_t(row * n_e + b2)] == 0);
    };
    for (int64_t k = 0; k < n_got; ++k)
      for (int64_t k2 = k + 1; k2 < n_got; ++k2)
        if (g[k2] < g[k] && certain_tie(g[k], g[k2]))
          return at + "exact tie of entries " + std::to_string(g[k2]) + " and " + std::to_string(g[k]) +
                 ": the smaller must come first";
  }
  return "";
}

// The row on a device: the table (run twice: the bits must repeat) and the scores against the
// oracle; on CUDA also both against the CPU's on the same inputs (bf16 rows: f32 tensors holding the
// same values; not on the tensor cores, whose order is their own), bit for bit. shards > 1 (context
// parallelism's row shards): the query rows in `shards` calls at q_row0 = k s / shards, put together.
inline std::string check(const CompressedIndexCase& c, Device dev, int64_t shards = 1) {
  const CompressedIndexData x = compressed_index_data(c);
  const CompressedIndexRef r = compressed_index_ref(c, x);
  const bool tc = backend(dev).plan(Op::compressed_index_topk, params(c, true)).variant == Variant::mma;
  auto f32 = [](const Shape& sh, const std::vector<double>& v, Device d) {
    return Tensor::from_vector<float>(sh, std::vector<float>(v.begin(), v.end())).to(d);
  };
  auto in_dtype = [&](const Shape& sh, const std::vector<double>& v, Device d) {  // qI, kI: the row's dtype
    if (!c.bf16 || d == Device::cpu) return f32(sh, v, d);
    Tensor h = Tensor::empty(sh, DType::bf16);
    for (size_t i = 0; i < v.size(); ++i) h.data<bf16>()[i] = f32_to_bf16(float(v[i]));
    return h.to(d);
  };
  auto run = [&](Device d, std::vector<int32_t>& idx, std::vector<float>& scores) {
    CompressedIndexInputs in;
    in.qI = in_dtype({c.b, c.s, c.nI, c.dI}, x.qI, d);
    in.kI = in_dtype({c.b, x.n_e, c.dI}, x.kI, d);
    in.w = f32({c.b, c.s, c.nI}, x.w, d);
    in.ent_last = Tensor::from_vector<int32_t>({c.b, x.n_e}, x.ent_last).to(d);
    in.ent_doc = Tensor::from_vector<int32_t>({c.b, x.n_e}, x.ent_doc).to(d);
    in.layout = &x.layout;
    idx.assign(size_t(c.b * c.s * c.K), 0), scores.assign(size_t(c.b * c.s * x.n_e), 0.f);
    bool same = true;
    for (int64_t k = 0; k < shards; ++k) {
      const int64_t r0 = k * c.s / shards, r1 = (k + 1) * c.s / shards, sq = r1 - r0;
      CompressedIndexInputs ik = in;
      ik.qI = in.qI.slice(1, r0, r1).clone(), ik.w = in.w.slice(1, r0, r1).clone(), ik.q_row0 = r0;
      const Tensor t = compressed_index_topk(ik, c.K).to(Device::cpu);
      const Tensor t2 = compressed_index_topk(ik, c.K).to(Device::cpu);
      const Tensor sc = compressed_index_scores(ik).to(Device::cpu);
      for (int64_t bb = 0; bb < c.b; ++bb) {
        std::copy_n(t.data<int32_t>() + bb * sq * c.K, sq * c.K, idx.begin() + (bb * c.s + r0) * c.K);
        std::copy_n(sc.data<float>() + bb * sq * x.n_e, sq * x.n_e, scores.begin() + (bb * c.s + r0) * x.n_e);
      }
      same = same && std::memcmp(t.data<int32_t>(), t2.data<int32_t>(), size_t(t.numel()) * 4) == 0;
    }
    return same;
  };
  std::vector<int32_t> idx;
  std::vector<float> scores;
  std::string err;
  if (!run(dev, idx, scores)) err += "two runs' tables differ; ";
  if (dev != Device::cpu && !tc) {
    std::vector<int32_t> idx_cpu;
    std::vector<float> scores_cpu;
    run(Device::cpu, idx_cpu, scores_cpu);
    if (idx != idx_cpu) err += "the table differs from the CPU's; ";
    if (scores.size() != scores_cpu.size() || std::memcmp(scores.data(), scores_cpu.data(), scores.size() * 4) != 0)
      err += "the scores differ from the CPU's in their bits; ";
  }
  if (scores.size() != r.scores.size()) return err + "scores: " + std::to_string(scores.size()) + " values";
  double worst = 0;  // error / bound
  for (size_t i = 0; i < scores.size(); ++i) {
    if (std::isinf(r.scores[i])) {
      if (scores[i] != -INFINITY) return err + "scores: " + std::to_string(scores[i]) + " where no entry is visible";
      continue;
    }
    const double e = std::abs(double(scores[i]) - r.scores[i]), bound = compressed_index_bound(c, r.mag[i], tc);
    if (!(e <= bound)) return err + "scores[" + std::to_string(i) + "]: error " + std::to_string(e) + " > bound " + std::to_string(bound);
    if (bound > 0) worst = std::max(worst, e / bound);
  }
  if (const char* v = std::getenv("HMLA_REPORT_ERRORS"); v && *v)
    std::printf("compressed_index %s %s: scores' largest error / bound %.3g\n", c.name.c_str(), device_name(dev), worst);
  const std::string t = compressed_index_check_table(c, x, r, idx, tc);
  if (!t.empty()) err += "table: " + t;
  return err;
}

inline void case_rows_compressed_index(const Backend& be, std::vector<RowUse>& out) {
  add_checked_rows(out, "compressed_index", be, be.compute_dtype(), compressed_index_cases());
  add_checked_rows(out, "compressed_index_bf16", be, be.compute_dtype(), compressed_index_bf16_cases());
}

}  // namespace hmla::op_cases
