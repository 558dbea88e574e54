// `hmla bench v4`: DeepSeek-V4's kernels, each through its op entry point (include/hmla/ops), at
// DeepSeek-V4-Flash's shapes (configs/deepseek_v4_flash.json) on one causal document of s rows: one
// JSON line per (kernel, s) with the median time, the work counted as docs/bench.md says, the
// rate, the device and the implementation the backend's plan names. A row whose inputs cannot fit
// the device, or that the backend does not run, is one line saying why.
#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace hmla::bench {

struct V4BenchOptions {
  std::vector<int64_t> seq_lens{4096, 16384, 65536};
  std::string device = "cuda";
  int64_t heads = 64, head_dim = 512;               // num_attention_heads, head_dim (RoPE slice included)
  int64_t index_heads = 64, index_dim = 128, topk = 512;  // index_n_heads, index_head_dim, index_topk
  int64_t csa_rate = 4, hca_rate = 128, window = 128;     // compress_rates, sliding_window
  int64_t hc_mult = 4, hidden = 4096, sinkhorn_iters = 20;
  int64_t experts = 256, experts_per_tok = 6;       // n_routed_experts, num_experts_per_tok
  int reps = 0;                   // timed runs after one warm-up; 0: up to 5, as many as fit ~2 s
  int64_t dense_max_s = 0;        // the dense CSA rows (every visible entry) only up to this s; 0: all
  std::vector<std::string> kernels;  // empty: every kernel
};

// The kernels, in the order each s runs them.
const std::vector<std::string>& v4_bench_kernels();

void run_v4_bench(const V4BenchOptions& opt, std::ostream& os);

}  // namespace hmla::bench
