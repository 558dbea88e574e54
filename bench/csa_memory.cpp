// The CSA rows of `hmla bench warmup-memory` (DESIGN.md section 10's memory lesson): peak bytes above
// the inputs of one DeepSeek-V4 CSA layer's attention core and indexer, forward + backward, per arm:
//   dense   attn_compressed over every visible entry (the CSA layer in mha);
//   warmup  the same core plus the dense CSA KL over every visible entry with the core's lse
//           (dsa_warmup; no selection);
//   sparse  the indexer's top-k, the core over it and the sparse KL (dsa_sparse);
//   legacy  the warmup through the sparse path: a [b, s, n_e] i32 table of every visible entry, the
//           selected core (k = n_e) and the sparse KL over it (K = n_e).
// One causal document of s rows, entries of m tokens (n_e = s / m). The KL runs before the core's
// backward, so its gradients are live while the core's are made (the worst order).
#include <cmath>
#include <random>

#include "bench_util.h"
#include "dsa_bench.h"
#include "hmla/ops/compress.h"
#include "hmla/ops/compressed_attention.h"
#include "hmla/ops/compressed_index.h"

namespace hmla::bench {

CsaMemoryPeaks csa_memory_peaks(const CsaMemoryGeometry& g, int64_t s, bool legacy) {
  std::mt19937_64 rng(7);
  const DocLayout layout = layout_causal(1, s);
  const CompressedEntries e = compressed_entries(layout, g.m);
  const int64_t n_e = e.n;
  Tensor ent_last = Tensor::empty({1, n_e}, DType::i32), ent_doc = Tensor::empty({1, n_e}, DType::i32);
  for (int64_t i = 0; i < n_e; ++i) {  // one document starting at row 0
    ent_last.data<int32_t>()[i] = e.first.data<int32_t>()[i] + int32_t(g.m - 1);
    ent_doc.data<int32_t>()[i] = 0;
  }
  AttnCompressedInputs in{randn({1, s, g.H, g.d}, rng, 1.f), randn({1, s, g.d}, rng, 1.f), randn({1, n_e, g.d}, rng, 1.f),
                          ent_last, ent_doc, {}, &layout, randn({g.H}, rng, 1.f), 1.f / std::sqrt(float(g.d)),
                          g.window};
  const Tensor dout = randn({1, s, g.H, g.d}, rng, 1.f);
  CompressedIndexKlInputs kl;
  kl.sc = {randn({1, s, g.HI, g.DI}, rng, 0.3f), randn({1, n_e, g.DI}, rng, 0.3f), randn({1, s, g.HI}, rng, 0.1f),
           ent_last, ent_doc, &layout};
  kl.q = in.q;
  kl.ent = in.ent;
  kl.scale = in.scale;
  kl.row_weight = Tensor::empty({1, s}, DType::f32);
  for (int64_t t = 0; t < s; ++t) kl.row_weight.data<float>()[t] = 1.f / float(s);

  CsaMemoryPeaks p;
  p.n_e = n_e;
  p.dense = peak_above_live([&] {
    AttnCompressedSaved sv = attn_compressed_fwd(in);
    AttnCompressedGrads gr = attn_compressed_bwd(in, sv, dout);
  });
  p.warmup = peak_above_live([&] {
    AttnCompressedSaved sv = attn_compressed_fwd(in);
    CompressedIndexKlInputs k = kl;
    k.lse = sv.lse;
    CompressedIndexKlResult r = compressed_index_kl_dense(k);
    AttnCompressedGrads gr = attn_compressed_bwd(in, sv, dout);
  });
  // The selected arms run the core on a table that the arm itself builds (and counts).
  auto selected = [&](const Tensor& table) {
    AttnCompressedInputs sel = in;
    sel.idx = table;
    AttnCompressedSaved sv = attn_compressed_fwd(sel);
    CompressedIndexKlInputs k = kl;
    k.lse = sv.lse;
    k.topk = table;
    CompressedIndexKlResult r = compressed_index_kl_sparse(k);
    AttnCompressedGrads gr = attn_compressed_bwd(sel, sv, dout);
  };
  p.sparse = peak_above_live([&] { selected(compressed_index_topk(kl.sc, g.K)); });
  if (legacy)
    p.legacy = peak_above_live([&] {
      Tensor table = Tensor::empty({1, s, n_e}, DType::i32);  // every visible entry, -1 padded
      int32_t* t = table.data<int32_t>();
      for (int64_t r = 0; r < s; ++r)
        for (int64_t j = 0; j < n_e; ++j) t[r * n_e + j] = ent_last.data<int32_t>()[j] <= r ? int32_t(j) : -1;
      selected(table);
    });
  return p;
}

}  // namespace hmla::bench
