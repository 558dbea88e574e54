// `hmla bench warmup-memory` (the memory table: mha vs dsa_warmup vs the legacy full-table arm, for
// the MLA layer and for a DeepSeek-V4 CSA layer) and `hmla bench sparse` (sparse latent MQA
// attention over the indexer's top-k).
#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace hmla::bench {

struct MemoryGeometry {
  std::string name;
  int64_t H, Dn, Dr, Dv, Rkv, HI, DI, K;
  std::vector<int64_t> seq_lens;
};

// A DeepSeek-V4 CSA layer's attention core (H heads of width d, one shared K = V head, a window, a
// sink) and its indexer (HI heads of width DI, top-K), entries of m tokens (bench/csa_memory.cpp).
struct CsaMemoryGeometry {
  std::string name;
  int64_t H, d, HI, DI, K, window, m;
  std::vector<int64_t> seq_lens;
};

// Peak bytes above the inputs per arm (csa_memory.cpp's header); legacy 0 when not run.
struct CsaMemoryPeaks {
  size_t dense = 0, warmup = 0, sparse = 0, legacy = 0;
  int64_t n_e = 0;
};
CsaMemoryPeaks csa_memory_peaks(const CsaMemoryGeometry& g, int64_t s, bool legacy);

struct WarmupMemoryOptions {
  std::vector<MemoryGeometry> geometries{
      {"paddlefleet", 64, 192, 64, 256, 512, 64, 128, 2048, {1024, 2048, 4096}},
      {"small", 8, 192, 64, 256, 512, 8, 128, 2048, {1024, 2048, 4096, 8192, 16384}}};
  // DeepSeek-V4-Flash's CSA layer (head_dim 512, index_head_dim 128, index_topk 512, sliding_window
  // 128, rate 4) with H = 2 of its 64 heads and 8 of its 64 index heads: the dense core, the dense
  // KL and the selection are O(s^2 / 8) pairs, and Flash's heads would cost tens of minutes per arm
  // at s = 32768 on 2 cores; these take about 15 minutes for all four arms at every s there.
  std::vector<CsaMemoryGeometry> csa_geometries{{"v4_csa_h2_i8", 2, 512, 8, 128, 512, 128, 4, {4096, 8192, 16384, 32768}}};
  bool legacy = true;
  bool json = false;
};

void run_warmup_memory_bench(const WarmupMemoryOptions& opt, std::ostream& os);

struct SparseBenchOptions {
  std::vector<int64_t> seq_lens{4096, 8192, 16384};
  int64_t heads = 16, dqk = 576, dv = 512, topk = 2048;
  bool json = false;
};

void run_sparse_bench(const SparseBenchOptions& opt, std::ostream& os);

}  // namespace hmla::bench
