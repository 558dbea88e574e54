// Peak bytes are the CPU allocator's peak above what was live when an arm started (its inputs),
// for one attention core forward + backward of each arm of the MLA layer:
//   mha     the dense per-head core (Dqk = Dn + Dr, Dv): out, lse, dq, dk, dv, scratch;
//   warmup  the same core plus the indexer's selection (scores + [s, K] table) and the fused
//           dense KL with its gradients (qI, kI, w are inputs);
//   legacy  the old warmup: a [b, s, s] i32 table of every allowed key, fed to the sparse latent
//           MQA kernel (Rkv + Dr wide key, Rkv-wide value) and the sparse KL.
// The CSA geometries' arms (dense in the mha columns, warmup, sparse, legacy) are csa_memory.cpp's.
#include "dsa_bench.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <random>

#include "hmla/ops/attention.h"
#include "hmla/ops/indexer.h"
#include "bench_util.h"
#include "hmla/ops/sparse_attention.h"

namespace hmla::bench {

namespace {

Tensor uniform_rows(int64_t s) {
  Tensor rw = Tensor::empty({1, s}, DType::f32);
  for (int64_t t = 0; t < s; ++t) rw.data<float>()[t] = 1.f / float(s);
  return rw;
}

// One line of the table or one JSON object; sparse and legacy 0: not run (a "-", or left out).
// extra: the layer's own geometry fields (after K).
void memory_row(const WarmupMemoryOptions& o, std::ostream& os, const std::string& layer, const std::string& geometry,
                int64_t s, int64_t H, int64_t HI, int64_t K, const nlohmann::ordered_json& extra, size_t mha, size_t warm,
                size_t sparse, size_t legacy) {
  if (o.json) {
    nlohmann::ordered_json j;
    j["bench"] = "warmup-memory";
    j["layer"] = layer;
    j["geometry"] = geometry;
    j["s"] = s;
    j["H"] = H;
    j["HI"] = HI;
    j["K"] = K;
    for (const auto& [k, v] : extra.items()) j[k] = v;
    j["threads"] = omp_get_max_threads();
    j["mha_peak_bytes"] = mha;
    j["warmup_peak_bytes"] = warm;
    if (sparse) j["sparse_peak_bytes"] = sparse;
    if (legacy) j["legacy_peak_bytes"] = legacy;
    os << j.dump() << std::endl;
    return;
  }
  auto mib = [&](size_t v) {
    if (v) os << std::setprecision(1) << std::setw(13) << v / 1048576.0;
    else os << std::setw(13) << "-";
  };
  os << std::left << std::setw(13) << geometry << std::setw(7) << s << std::right << std::fixed << std::setprecision(1)
     << std::setw(12) << mha / 1048576.0 << std::setw(13) << warm / 1048576.0;
  mib(sparse);
  mib(legacy);
  os << std::setprecision(3) << std::setw(13) << double(warm) / double(mha);
  if (legacy)
    os << std::setw(13) << double(legacy) / double(mha);
  else
    os << std::setw(13) << "-";
  os << std::endl;
}

}  // namespace

void run_warmup_memory_bench(const WarmupMemoryOptions& o, std::ostream& os) {
  std::mt19937_64 rng(3);
  if (!o.json)
    os << std::left << std::setw(13) << "geometry" << std::setw(7) << "s" << std::right << std::setw(12) << "mha_MiB"
       << std::setw(13) << "warmup_MiB" << std::setw(13) << "sparse_MiB" << std::setw(13) << "legacy_MiB"
       << std::setw(13) << "warmup/mha" << std::setw(13) << "legacy/mha" << "\n";
  for (const MemoryGeometry& g : o.geometries)
    for (int64_t s : g.seq_lens) {
      DocLayout layout = layout_causal(1, s);
      const int64_t Dqk = g.Dn + g.Dr;
      const float scale = 1.f / std::sqrt(float(Dqk));
      IndexerScores sc{randn({1, s, g.HI, g.DI}, rng, 0.3f), randn({1, s, g.DI}, rng, 0.3f),
                       randn({1, s, g.HI}, rng, 0.1f), &layout};
      Tensor rw = uniform_rows(s);
      size_t mha = 0, warm = 0, legacy = 0;
      {
        AttnDenseInputs in{randn({1, s, g.H, Dqk}, rng, 1.f), randn({1, s, g.H, Dqk}, rng, 1.f),
                           randn({1, s, g.H, g.Dv}, rng, 1.f), &layout, {}, scale};
        Tensor dout = randn({1, s, g.H, g.Dv}, rng, 1.f);
        mha = peak_above_live([&] {
          AttnDenseSaved sv = attn_dense_fwd(in);
          AttnDenseGrads gr = attn_dense_bwd(in, sv, dout);
        });
        warm = peak_above_live([&] {
          AttnDenseSaved sv = attn_dense_fwd(in);
          Tensor topk = indexer_topk(sc, g.K, 0);
          IndexerKlInputs kl;
          kl.sc = sc;
          kl.q = in.q;
          kl.k = in.k;
          kl.scale = scale;
          kl.lse_c = sv.lse;
          kl.row_weight = rw;
          IndexerKlResult r = indexer_kl_dense(kl);
          AttnDenseGrads gr = attn_dense_bwd(in, sv, dout);
        });
      }
      if (o.legacy) {
        const int64_t Wa = g.Rkv + g.Dr;
        Tensor q = randn({1, s, g.H, Wa}, rng, 1.f), kv = randn({1, s, Wa}, rng, 1.f);
        Tensor dout = randn({1, s, g.H, g.Rkv}, rng, 1.f);
        legacy = peak_above_live([&] {
          Tensor table = Tensor::empty({1, s, s}, DType::i32);  // every allowed key, -1 padded
          int32_t* t = table.data<int32_t>();
          for (int64_t r = 0; r < s; ++r)
            for (int64_t j = 0; j < s; ++j) t[r * s + j] = j <= r ? int32_t(j) : -1;
          AttnSparseInputs in{q, kv, g.Rkv, table, s, {}, scale};
          AttnSparseSaved sv = attn_sparse_fwd(in);
          IndexerKlInputs kl;
          kl.sc = sc;
          kl.q = q;
          kl.k = kv.view({1, s, 1, Wa});
          kl.scale = scale;
          kl.lse_c = sv.lse_c;
          kl.row_weight = rw;
          kl.topk = table;
          kl.K = s;
          IndexerKlResult r = indexer_kl_sparse(kl);
          AttnSparseGrads gr = attn_sparse_bwd(in, sv, dout);
        });
      }
      memory_row(o, os, "mla", g.name, s, g.H, g.HI, g.K, {}, mha, warm, 0, o.legacy ? legacy : 0);
    }
  // The CSA layer: its dense core stands in the mha columns (the CSA layer in mha).
  for (const CsaMemoryGeometry& g : o.csa_geometries)
    for (int64_t s : g.seq_lens) {
      const CsaMemoryPeaks p = csa_memory_peaks(g, s, o.legacy);
      const nlohmann::ordered_json extra{{"d", g.d}, {"DI", g.DI}, {"window", g.window}, {"m", g.m}, {"n_e", p.n_e}};
      memory_row(o, os, "csa", g.name, s, g.H, g.HI, g.K, extra, p.dense, p.warmup, p.sparse, p.legacy);
    }
}

void run_sparse_bench(const SparseBenchOptions& o, std::ostream& os) {
  std::mt19937_64 rng(5);
  if (!o.json)
    os << std::left << std::setw(7) << "s" << std::right << std::setw(14) << "valid_pairs" << std::setw(11) << "fwd_ms"
       << std::setw(12) << "fwdbwd_ms" << std::setw(14) << "ns_per_pair" << std::setw(12) << "peak_MiB" << "\n";
  for (int64_t s : o.seq_lens) {
    DocLayout layout = layout_causal(1, s);
    // The selection comes from a small random indexer (HI = 8, DI = 64): only the table matters.
    IndexerScores sc{randn({1, s, 8, 64}, rng, 0.3f), randn({1, s, 64}, rng, 0.3f), randn({1, s, 8}, rng, 0.1f), &layout};
    Tensor idx = indexer_topk(sc, o.topk, 0);
    int64_t valid = 0;
    for (int64_t i = 0; i < idx.numel(); ++i) valid += idx.data<int32_t>()[i] >= 0;
    AttnSparseInputs in{randn({1, s, o.heads, o.dqk}, rng, 1.f), randn({1, s, o.dqk}, rng, 1.f), o.dv, idx, o.topk, {},
                        1.f / std::sqrt(float(o.dqk))};
    Tensor dout = randn({1, s, o.heads, o.dv}, rng, 1.f);
    double fwd_ms = 0, fb_ms = 0;
    const size_t peak = peak_above_live([&] {
      auto t0 = Clock::now();
      AttnSparseSaved sv = attn_sparse_fwd(in);
      fwd_ms = ms_since(t0);
      AttnSparseGrads g = attn_sparse_bwd(in, sv, dout);
      fb_ms = ms_since(t0);
    });
    if (o.json) {
      nlohmann::ordered_json j;
      j["bench"] = "sparse";
      j["s"] = s;
      j["K"] = o.topk;
      j["H"] = o.heads;
      j["dqk"] = o.dqk;
      j["dv"] = o.dv;
      j["threads"] = omp_get_max_threads();
      j["valid_pairs"] = valid;
      j["fwd_ms"] = fwd_ms;
      j["fwdbwd_ms"] = fb_ms;
      j["ns_per_pair"] = fb_ms * 1e6 / double(valid);
      j["peak_bytes"] = peak;
      os << j.dump() << std::endl;
    } else {
      os << std::left << std::setw(7) << s << std::right << std::setw(14) << valid << std::fixed << std::setprecision(1)
         << std::setw(11) << fwd_ms << std::setw(12) << fb_ms << std::setprecision(2) << std::setw(14)
         << fb_ms * 1e6 / double(valid) << std::setprecision(1) << std::setw(12) << peak / 1048576.0 << std::endl;
    }
  }
}

}  // namespace hmla::bench
