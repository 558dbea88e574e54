// `hmla bench warmup-memory` (the memory table: mha vs dsa_warmup vs the legacy full-table arm)
// and `hmla bench sparse` (sparse latent MQA attention over the indexer's top-k).
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

struct WarmupMemoryOptions {
  std::vector<MemoryGeometry> geometries{
      {"paddlefleet", 64, 192, 64, 256, 512, 64, 128, 2048, {1024, 2048, 4096}},
      {"small", 8, 192, 64, 256, 512, 8, 128, 2048, {1024, 2048, 4096, 8192, 16384}}};
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
