// `hmla bench warmup-memory`'s CSA rows at toy sizes (bench/csa_memory.cpp): DESIGN.md section 10's
// memory lesson, that the dense and warmup arms never build an [s, n_e] table, so warmup/dense peak
// stays constant in s while the legacy full table grows; and the JSON line's fields.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "dsa_bench.h"

namespace hmla::bench {
namespace {

const CsaMemoryGeometry kToy{"toy_csa", 2, 64, 4, 32, 16, 16, 4, {512, 1024}};

TEST(WarmupMemoryCsa, WarmupOverDenseIsConstantAndTheLegacyTableGrows) {
  const CsaMemoryPeaks a = csa_memory_peaks(kToy, 512, true), b = csa_memory_peaks(kToy, 1024, true);
  EXPECT_EQ(a.n_e, 128);
  EXPECT_EQ(b.n_e, 256);
  const double ra = double(a.warmup) / double(a.dense), rb = double(b.warmup) / double(b.dense);
  EXPECT_GT(ra, 1.0);
  EXPECT_NEAR(rb / ra, 1.0, 0.1) << "warmup/dense " << ra << " at s = 512, " << rb << " at s = 1024";
  EXPECT_GT(a.legacy, a.warmup);
  EXPECT_GT(b.legacy, b.warmup);
  // The legacy arm's excess is its O(s n_e) tables: 4x when s doubles (n_e = s / m doubles too).
  EXPECT_GT(double(b.legacy) / double(b.dense), double(a.legacy) / double(a.dense));
  EXPECT_GT(double(b.legacy - b.warmup), 3.0 * double(a.legacy - a.warmup))
      << "legacy " << a.legacy << ", " << b.legacy << "; warmup " << a.warmup << ", " << b.warmup;
}

TEST(WarmupMemoryCsa, JsonLineCarriesEveryArm) {
  WarmupMemoryOptions o;
  o.geometries.clear();
  o.csa_geometries = {kToy};
  o.csa_geometries[0].seq_lens = {256};
  o.json = true;
  std::ostringstream os;
  run_warmup_memory_bench(o, os);
  const nlohmann::json j = nlohmann::json::parse(os.str());
  EXPECT_EQ(j["bench"], "warmup-memory");
  EXPECT_EQ(j["layer"], "csa");
  EXPECT_EQ(j["geometry"], "toy_csa");
  EXPECT_EQ(j["s"], 256);
  EXPECT_EQ(j["n_e"], 64);
  for (const char* k : {"mha_peak_bytes", "warmup_peak_bytes", "sparse_peak_bytes", "legacy_peak_bytes"})
    EXPECT_GT(j.value(k, 0), 0) << k;
}

}  // namespace
}  // namespace hmla::bench
