// `hmla bench ep` (run under mpirun; DESIGN.md section 8, docs/scale_out.md "Expert parallel"):
// expert parallelism's exchange (hmla/dist/ep.h) over every rank of the job as one EP group, at a
// model config's MoE geometry (hidden_size, n_routed_experts, num_experts_per_tok): per MoE layer
// and micro-batch of tokens = micro_batch x seq_len, the forward's dispatch and combine and the
// backward's two exchanges of the same rows, with balanced routing (slot (t, j) of the rank's
// tokens to expert (t k + j + rank) mod E). The bytes each rank sends are measured on the wire
// (Comm::bytes_sent) and checked against `hmla plan`'s count (ep_traffic.h); rank 0 prints one JSON
// line with them and the median time of a layer's four exchanges.
#pragma once
#include <cstdint>
#include <ostream>
#include <string>

namespace hmla::bench {

struct EpBenchOptions {
  std::string config;
  int64_t seq_len = 4096, micro_batch = 1;
  std::string dtype = "bf16";  // the rows' dtype: bf16 (what a GPU run moves) or f32 (the CPU's)
  int reps = 5;                // timed layers after one warm-up
};

// Throws ConfigError when the job's ranks do not divide the experts or the check fails (every rank
// compares its own bytes with the count).
void run_ep_bench(const EpBenchOptions& opt, std::ostream& os);

}  // namespace hmla::bench
