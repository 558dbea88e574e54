// One causal document per s. Inputs (not counted): qI, kI, w, the attention's q, k and lse.
// Workspace = allocator peak above the inputs, minus the gradient outputs dqI, dkI, dw that
// every implementation returns alike.
#include "indexer_bench.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <random>

#include "hmla/ops/attention.h"
#include "bench_util.h"
#include "hmla/ops/nn.h"
#include "hmla/ops/sparse_attention.h"
#include "indexer_materialized.h"

namespace hmla::bench {

namespace {

struct Timed {
  double ms = 0;
  size_t workspace = 0;
  double kl = 0;
};

template <class F>
Timed measure(F f, Device dev = Device::cpu) {
  Allocator& a = allocator(dev);
  const size_t live = a.live_bytes();
  a.reset_peak();
  auto t0 = Clock::now();
  IndexerKlResult r = f();
  a.synchronize();
  Timed out;
  out.ms = ms_since(t0);
  const size_t grads = r.dqI.nbytes() + r.dkI.nbytes() + r.dw.nbytes();
  out.workspace = a.peak_bytes() - live - grads;
  out.kl = r.kl_sum;
  return out;
}

}  // namespace

void run_indexer_bench(const IndexerBenchOptions& o, std::ostream& os) {
  const int threads = omp_get_max_threads();
  std::mt19937_64 rng(7);
  if (!o.json)
    os << std::left << std::setw(7) << "s" << std::right << std::setw(16) << "scores_topk_ms" << std::setw(14)
       << "dense_kl_ms" << std::setw(14) << "kl_ws_MiB" << std::setw(16) << "material_ms" << std::setw(16)
       << "material_MiB" << std::setw(10) << "ws_ratio" << "\n";
  for (int64_t s : o.seq_lens) {
    DocLayout layout = layout_causal(1, s);
    IndexerKlInputs in;
    in.sc = {randn({1, s, o.index_heads, o.index_dim}, rng, 0.3f), randn({1, s, o.index_dim}, rng, 0.3f),
             randn({1, s, o.index_heads}, rng, 0.1f), &layout};
    in.q = randn({1, s, o.heads, o.dqk}, rng, 1.f);
    in.k = randn({1, s, o.heads, o.dqk}, rng, 1.f);
    in.scale = 1.f / std::sqrt(float(o.dqk));
    in.coeff = 0.01f;
    in.row_weight = Tensor::empty({1, s}, DType::f32);
    for (int64_t t = 0; t < s; ++t) in.row_weight.data<float>()[t] = 1.f / float(s);
    const Device dev = o.cuda ? Device::cuda : Device::cpu;
    double topk_ms = 0;
    Tensor idx;  // the selection table (the GPU's, for the sparse KL arm)
    if (!o.cuda) {  // the attention's lse: an input, computed once and not timed
      AttnDenseInputs a{in.q, in.k, in.k.slice(3, 0, 8), &layout, {}, in.scale};
      in.lse_c = attn_dense_fwd(a).lse;
      auto t0 = Clock::now();
      { Tensor idx = indexer_topk(in.sc, o.topk, 0); }
      topk_ms = ms_since(t0);
    } else {  // on the GPU: the KL's inputs there; the kernel computes lseC itself (no CPU attention at long s)
      for (Tensor* t : {&in.sc.qI, &in.sc.kI, &in.sc.w, &in.q, &in.k, &in.row_weight}) *t = t->to(dev);
      IndexerScores sc = in.sc;  // the scores' kernel takes bf16 copies
      sc.qI = converted(sc.qI, DType::bf16), sc.kI = converted(sc.kI, DType::bf16);
      allocator(dev).synchronize();
      auto t0 = Clock::now();
      idx = indexer_topk(sc, o.topk, 0);
      allocator(dev).synchronize();
      topk_ms = ms_since(t0);
      // The KL on the training step's dtypes (bf16 qI, kI, q, k): its tensor-core path.
      for (Tensor* t : {&in.sc.qI, &in.sc.kI, &in.q, &in.k}) *t = converted(*t, DType::bf16);
    }
    Timed fused = measure([&] { return indexer_kl_dense(in); }, dev);
    // On the GPU, the sparse KL as dsa_sparse runs it: over the table's K candidates, against the
    // latent form's H x latent_dqk queries and one shared key, lseC given by the sparse forward
    // (untimed, as the attention's lse above); op FLOPs 2 H Dqk + 6 HI DI per candidate.
    Timed sparse;
    double sparse_tflops = 0;
    if (o.cuda) {
      IndexerKlInputs sp = in;
      sp.q = converted(randn({1, s, o.heads, o.latent_dqk}, rng, 1.f).to(dev), DType::bf16);
      sp.k = converted(randn({1, s, 1, o.latent_dqk}, rng, 1.f).to(dev), DType::bf16);
      sp.scale = 1.f / std::sqrt(float(o.latent_dqk));
      sp.topk = idx, sp.K = o.topk, sp.topk_origin = TableOrigin::own;
      const AttnSparseSaved sv = attn_sparse_fwd(
          AttnSparseInputs{sp.q, sp.k.view({1, s, o.latent_dqk}), o.latent_dqk - 64, idx, o.topk, Tensor(), sp.scale,
                           TableOrigin::own});
      sp.lse_c = sv.lse_c;
      sparse = measure([&] { return indexer_kl_sparse(sp); }, dev);
      const int64_t pairs = s <= o.topk ? s * (s + 1) / 2 : o.topk * (o.topk + 1) / 2 + (s - o.topk) * o.topk;
      sparse_tflops = double(pairs) * (2.0 * o.heads * o.latent_dqk + 6.0 * o.index_heads * o.index_dim) /
                      (sparse.ms * 1e-3) / 1e12;
    }
    Timed mat;
    if (o.materialized && !o.cuda) mat = measure([&] { return indexer_kl_materialized(in); });
    if (o.json) {
      nlohmann::ordered_json j;
      j["bench"] = o.cuda ? "indexer-cuda" : "indexer";
      j["s"] = s;
      j["H"] = o.heads;
      j["dqk"] = o.dqk;
      j["HI"] = o.index_heads;
      j["DI"] = o.index_dim;
      j["K"] = o.topk;
      j["threads"] = threads;
      j["scores_topk_ms"] = topk_ms;
      j["dense_kl_ms"] = fused.ms;
      j["dense_kl_workspace_bytes"] = fused.workspace;
      j["dense_kl"] = fused.kl;
      if (o.cuda) {
        j["latent_dqk"] = o.latent_dqk;
        j["sparse_kl_ms"] = sparse.ms;
        j["sparse_kl_workspace_bytes"] = sparse.workspace;
        j["sparse_kl_tflops"] = sparse_tflops;
      }
      if (o.materialized && !o.cuda) {
        j["materialized_kl_ms"] = mat.ms;
        j["materialized_kl_workspace_bytes"] = mat.workspace;
        j["kl_rel_diff"] = std::abs(fused.kl - mat.kl) / std::max(std::abs(mat.kl), 1e-30);
      }
      os << j.dump() << std::endl;
    } else {
      os << std::left << std::setw(7) << s << std::right << std::fixed << std::setprecision(1) << std::setw(16)
         << topk_ms << std::setw(14) << fused.ms << std::setw(14) << fused.workspace / 1048576.0;
      if (o.materialized && !o.cuda)
        os << std::setw(16) << mat.ms << std::setw(16) << mat.workspace / 1048576.0 << std::setw(10)
           << double(mat.workspace) / double(fused.workspace);
      os << std::endl;
    }
  }
}

}  // namespace hmla::bench
