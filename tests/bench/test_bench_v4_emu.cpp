// `hmla bench v4 --device cuda` (bench/v4_bench.cpp) on the SIMT-emulated device at toy widths: the
// GPU run's code path without a GPU. Every row runs the variant the CUDA plan names on device
// tensors (the attention's operands in the device's bf16) and counts the CPU run's work, row by
// row; a row whose plan refuses its shapes is a line with the plan's reason.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "v4_bench.h"

namespace hmla::bench {
namespace {

std::vector<nlohmann::json> lines(const V4BenchOptions& o) {
  std::ostringstream os;
  run_v4_bench(o, os);
  std::vector<nlohmann::json> out;
  std::istringstream is(os.str());
  for (std::string ln; std::getline(is, ln);) out.push_back(nlohmann::json::parse(ln));
  return out;
}

TEST(BenchV4, EveryRowRunsOnTheEmulatedDeviceOrSaysWhy) {
  V4BenchOptions o;
  o.seq_lens = {64};
  o.heads = 2, o.head_dim = 64, o.index_heads = 2, o.index_dim = 32, o.topk = 8;
  o.csa_rate = 4, o.hca_rate = 16, o.window = 16;
  o.hc_mult = 2, o.hidden = 64, o.sinkhorn_iters = 3, o.experts = 8, o.experts_per_tok = 2;
  o.reps = 1;
  o.device = "cuda";
  const std::vector<nlohmann::json> gpu = lines(o);
  o.device = "cpu";
  const std::vector<nlohmann::json> cpu = lines(o);
  ASSERT_EQ(gpu.size(), v4_bench_kernels().size());
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t i = 0; i < gpu.size(); ++i) {
    const nlohmann::json &g = gpu[i], &c = cpu[i];
    const std::string k = g.at("kernel");
    SCOPED_TRACE(g.dump());
    EXPECT_EQ(k, v4_bench_kernels()[i]);
    EXPECT_EQ(g.at("device"), "hmla SIMT emulator (CPU)");
    EXPECT_FALSE(g.contains("error"));
    ASSERT_TRUE(g.contains("ms"));
    // The attention core's rows (bf16) run the tensor-core kernels, the others the SIMT ones.
    EXPECT_EQ(g.at("impl"), k.find("attn") != std::string::npos ? "mma" : "simt");
    EXPECT_EQ(c.at("impl"), "cpu");
    EXPECT_EQ(g.at("dtype"), k.find("attn") != std::string::npos ? "bf16" : "f32");
    EXPECT_GT(g.at("ms").get<double>(), 0);
    for (const char* f : {"flops", "bytes", "pairs", "n_e"}) EXPECT_EQ(g.value(f, -1.0), c.value(f, -1.0)) << f;
  }
}

// The SIMT top-k sorts min(K, n_e) keys in shared memory (at most 4096): K = 4097 over more entries
// than that is refused by the plan, before any input is made, and the line says why.
TEST(BenchV4, ARowThePlanRefusesIsALineWithItsReason) {
  V4BenchOptions o;
  o.device = "cuda";
  o.kernels = {"csa_index_topk"};
  o.topk = 4097;
  o.seq_lens = {4 * 4097 + 4};
  const std::vector<nlohmann::json> gpu = lines(o);
  ASSERT_EQ(gpu.size(), 1u);
  EXPECT_FALSE(gpu[0].contains("ms"));
  EXPECT_NE(gpu[0].value("skipped", "").find("the cuda backend does not run it: compressed index: K = 4097 above 4096"),
            std::string::npos)
      << gpu[0].dump();
}

}  // namespace
}  // namespace hmla::bench
