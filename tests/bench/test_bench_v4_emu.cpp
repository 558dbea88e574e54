// `hmla bench v4 --device cuda` (bench/v4_bench.cpp) on the SIMT-emulated device at toy widths: the
// GPU run's code path without a GPU. Every row runs the variant the CUDA plan names on device
// tensors (the attention's operands in the device's bf16), or, where the backend does not run the
// op (V4's sqrtsoftplus router, the CPU's so far), is a line saying why; the work counted is the CPU
// run's, row by row.
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
    if (k.starts_with("moe_route")) {
      ASSERT_TRUE(g.contains("skipped"));
      EXPECT_NE(g.at("skipped").get<std::string>().find("sigmoid"), std::string::npos);
      continue;
    }
    ASSERT_TRUE(g.contains("ms"));
    EXPECT_EQ(g.at("impl"), "simt");
    EXPECT_EQ(c.at("impl"), "cpu");
    EXPECT_EQ(g.at("dtype"), k.find("attn") != std::string::npos ? "bf16" : "f32");
    EXPECT_GT(g.at("ms").get<double>(), 0);
    for (const char* f : {"flops", "bytes", "pairs", "n_e"}) EXPECT_EQ(g.value(f, -1.0), c.value(f, -1.0)) << f;
  }
}

}  // namespace
}  // namespace hmla::bench
