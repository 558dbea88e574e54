// Helpers for tests that run whole programmes: a fresh directory per test, a programme's text over
// the shipped demo data, and a run with its log discarded. The test target defines
// HMLA_SOURCE_DIR (the model configs and data are read from the source tree).
#pragma once
#include <unistd.h>

#include <filesystem>
#include <sstream>
#include <string>

#include "hmla/train/trainer.h"

namespace hmla::testing {

// An empty directory under the system's temporary directory, unique to this process and name.
inline std::filesystem::path tmpdir(const std::string& name) {
  const std::filesystem::path d =
      std::filesystem::temp_directory_path() / ("hmla_test_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// A programme over the demo data: the model config (a path under the source tree), its seed, the
// base's own keys (after the shared 4 x 32-token batch, lr 3e-3 for both groups, 4 held-out rows),
// the phases, and top-level lines before the base (`extra`, e.g. an init_checkpoint).
inline std::string programme_text(const std::string& model, int seed, const std::string& base,
                                  const std::string& phases, const std::string& extra = "") {
  return std::string("model: ") + HMLA_SOURCE_DIR + "/" + model + "\ndata: " + HMLA_SOURCE_DIR +
         "/data/demo\nseed: " + std::to_string(seed) + "\n" + extra +
         "base: {batch: 4, seq_len: 32, lr: 3.0e-3, indexer_lr: 3.0e-3, log_every: 100, eval_rows: 4, " + base +
         "}\nphases:\n" + phases;
}

// Runs the programme `text` into `out` (its p.yaml names the programme in messages).
inline void run_text(const std::string& text, const std::filesystem::path& out, TrainOptions o = {}) {
  std::ostringstream log;
  o.out_dir = out.string();
  run_programme(parse_programme(text, (out / "p.yaml").string()), o, log);
}

}  // namespace hmla::testing
