// `hmla bench train`: hmla's whole training step (forward + backward + AdamW, f32, this machine's
// threads) next to a PyTorch twin of the same model, weights and batch (tests/python/
// train_twin.py, run by Debian's python3 with python3-torch), interleaved rep by rep.
#pragma once
#include <ostream>
#include <string>
#include <vector>

namespace hmla::bench {

struct TrainBenchOptions {
  std::string config = "configs/demo_model.json";
  std::vector<int64_t> seq_lens{128, 512};
  std::vector<std::string> modes{"mha", "dsa_sparse"};
  int64_t batch = 4;
  int reps = 5;
  bool json = true;  // the only format (--json accepted like the other benches)
  std::string python = "/usr/bin/python3";  // "" or missing: hmla's arm only
  std::string twin;                          // train_twin.py (default: the source tree's)
};

void run_train_bench(const TrainBenchOptions& opt, std::ostream& os);

}  // namespace hmla::bench
