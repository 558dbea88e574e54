// `hmla bench indexer`: scores + top-k, and the fused dense KL against the materialised arm.
#pragma once
#include <cstdint>
#include <ostream>
#include <vector>

namespace hmla::bench {

struct IndexerBenchOptions {
  std::vector<int64_t> seq_lens{2048, 4096, 8192, 16384};
  int64_t heads = 16, dqk = 192, index_heads = 64, index_dim = 128, topk = 2048;
  int64_t latent_dqk = 576;  // the sparse KL's (GPU only) latent q / key width, Rkv + Dr (Dr = 64)
  bool materialized = true;
  bool json = false;
  bool cuda = false;  // the fused KL on the GPU (its materialised arm: tests/cuda/torch_kl_bench.py)
};

void run_indexer_bench(const IndexerBenchOptions& opt, std::ostream& os);

}  // namespace hmla::bench
