// `hmla bench attention`: the dense attention core against the naive materialised arm and
// OpenBLAS's sgemm, side by side in one run (see README and docs/bench.md for the fields).
#pragma once
#include <cstdint>
#include <ostream>
#include <vector>

namespace hmla::bench {

struct AttentionBenchOptions {
  std::vector<int64_t> seq_lens{1024, 2048, 4096, 8192};
  std::vector<int64_t> doc_lens{0, 512};  // 0: one document per row
  int64_t batch = 1, heads = 16, kv_heads = 16, dqk = 192, dv = 128;
  int reps = 0;              // 0: by s (5 up to 2048, 3 at 4096, 2 above)
  int64_t naive_max_s = 4096;  // the naive arm is omitted above this s
  bool json = false;
};

void run_attention_bench(const AttentionBenchOptions& opt, std::ostream& os);

}  // namespace hmla::bench
