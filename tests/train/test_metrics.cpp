// metrics.jsonl's one row type: the writer's lines as the trainer has always written them, the
// reader's one rule for each row's kind (the trainer's resume and `hmla report` both read
// through it), malformed lines counted and, for the trainer, refused.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "hmla/core/error.h"
#include "hmla/train/metrics.h"

namespace hmla {
namespace {

namespace fs = std::filesystem;

fs::path write_file(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / ("hmla_metrics_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p) << text;
  return p;
}

TEST(Metrics, LinesKeepTheirKeysAndNullForNaN) {
  MetricsRow step{MetricsRow::Kind::step, "pre"};
  step.step = 3, step.lm_loss = 2.5, step.lr = 1e-3, step.grad_norm_backbone = 0.5, step.grad_norm_indexer = 0;
  step.tokens_per_s = 100, step.peak_bytes = 1048576;
  EXPECT_EQ(metrics_line(step),
            R"({"phase":"pre","step":3,"lm_loss":2.5,"indexer_kl":null,"lr":0.001,"grad_norm_backbone":0.5,)"
            R"("grad_norm_indexer":0.0,"tokens_per_s":100.0,"peak_bytes":1048576})");
  MetricsRow eq{MetricsRow::Kind::equivalence, "mqa"};
  eq.equivalence_max_diff = 0.25, eq.equivalence_max_logit = 4;
  EXPECT_EQ(metrics_line(eq), R"({"phase":"mqa","equivalence_max_diff":0.25,"equivalence_max_logit":4.0})");
  MetricsRow end{MetricsRow::Kind::phase_end, "pre"};
  end.first20_lm_loss = 3, end.last20_lm_loss = 2, end.seconds = 1.5, end.heldout_unavailable = "none fits";
  EXPECT_EQ(metrics_line(end), R"({"phase":"pre","heldout_lm_loss":null,"first20_lm_loss":3.0,"last20_lm_loss":2.0,)"
                               R"("first20_indexer_kl":null,"last20_indexer_kl":null,"seconds":1.5,)"
                               R"("heldout_unavailable":"none fits"})");
}

TEST(Metrics, WhatIsWrittenReadsBack) {
  MetricsRow step{MetricsRow::Kind::step, "warm"};
  step.step = 7, step.lm_loss = 3.25, step.indexer_kl = 0.125, step.peak_bytes = 4096;
  MetricsRow end{MetricsRow::Kind::phase_end, "warm"};
  end.heldout_lm_loss = 2.75, end.last20_indexer_kl = 0.5;
  const fs::path p = write_file("roundtrip", metrics_line(step) + "\n" + metrics_line(end) + "\n");
  const MetricsFile f = read_metrics(p);
  ASSERT_EQ(f.rows.size(), 2u);
  EXPECT_EQ(f.malformed, 0);
  EXPECT_EQ(f.rows[0].kind, MetricsRow::Kind::step);
  EXPECT_EQ(f.rows[0].step, 7);
  EXPECT_EQ(f.rows[0].indexer_kl, 0.125);
  EXPECT_EQ(f.rows[0].peak_bytes, 4096);
  EXPECT_TRUE(std::isnan(f.rows[0].lr));  // written as null
  EXPECT_EQ(f.rows[1].kind, MetricsRow::Kind::phase_end);
  EXPECT_EQ(f.rows[1].phase, "warm");
  EXPECT_EQ(f.rows[1].heldout_lm_loss, 2.75);
  EXPECT_EQ(f.rows[1].last20_indexer_kl, 0.5);
  fs::remove(p);
}

// The one rule: a phase ends at a row with heldout_lm_loss (a number or null); `seconds` alone
// does not end one (the report once said it did, the trainer's resume did not).
TEST(Metrics, OneRuleForEachKind) {
  const fs::path p = write_file("kinds",
                                "{\"phase\":\"a\",\"step\":1,\"lm_loss\":\"x\"}\n"
                                "{\"phase\":\"a\",\"equivalence_max_diff\":1e-5}\n"
                                "{\"phase\":\"a\",\"heldout_lm_loss\":null,\"seconds\":1}\n"
                                "{\"phase\":\"b\",\"seconds\":2}\n"
                                "{\"phase\":7}\n");
  const MetricsFile f = read_metrics(p);
  ASSERT_EQ(f.rows.size(), 5u);
  EXPECT_EQ(f.rows[0].kind, MetricsRow::Kind::step);
  EXPECT_TRUE(std::isnan(f.rows[0].lm_loss));  // not a number: a gap
  EXPECT_EQ(f.rows[1].kind, MetricsRow::Kind::equivalence);
  EXPECT_EQ(f.rows[2].kind, MetricsRow::Kind::phase_end);
  EXPECT_TRUE(std::isnan(f.rows[2].heldout_lm_loss));
  EXPECT_EQ(f.rows[3].kind, MetricsRow::Kind::other);
  EXPECT_EQ(f.rows[4].phase, "?");
  fs::remove(p);
}

TEST(Metrics, MalformedLinesAreCountedAndTheTrainerRefusesThem) {
  const fs::path p = write_file("cut", "{\"phase\":\"a\",\"step\":1}\n\n[1]\n{\"step\":2}\n{\"phase\":\"a\",\"st\n");
  const MetricsFile f = read_metrics(p);
  EXPECT_EQ(f.rows.size(), 1u);
  EXPECT_EQ(f.malformed, 3);  // not an object, no phase, cut; the blank line holds no row
  EXPECT_EQ(f.first_malformed, 3);
  try {
    require_well_formed(f, p);
    ADD_FAILURE() << "a malformed metrics.jsonl was accepted";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("line 3"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(require_well_formed(read_metrics(p.string() + ".absent"), p));
  fs::remove(p);
}

TEST(Metrics, AMoeStepsBalancingReadsBack) {
  MetricsRow step{MetricsRow::Kind::step, "pre"};
  step.step = 1, step.lm_loss = 2.5;
  step.moe_layers = {1, 2}, step.moe_imbalance = {1.5, NAN}, step.moe_aux_loss = {1e-4, 2e-4};
  const std::string line = metrics_line(step);
  EXPECT_NE(line.find(R"("moe_layers":[1,2],"moe_imbalance":[1.5,null],"moe_aux_loss":[0.0001,0.0002])"),
            std::string::npos)
      << line;
  const MetricsFile f = read_metrics(write_file("moe", line + "\n"));
  ASSERT_EQ(f.rows.size(), 1u);
  EXPECT_EQ(f.rows[0].moe_layers, step.moe_layers);
  EXPECT_EQ(f.rows[0].moe_imbalance[0], 1.5);
  EXPECT_TRUE(std::isnan(f.rows[0].moe_imbalance[1]));
  EXPECT_EQ(f.rows[0].moe_aux_loss, step.moe_aux_loss);
  step.moe_aux_loss.clear();  // no balance loss ran (dsa_warmup, coefficient 0): no key
  EXPECT_EQ(metrics_line(step).find("moe_aux_loss"), std::string::npos);
  step.moe_layers.clear(), step.moe_imbalance.clear();  // a dense model: no MoE keys
  EXPECT_EQ(metrics_line(step).find("moe_"), std::string::npos);
}

// A V4 stack's logging step: attn_mass_<part>_<kind> for the parts and kinds it computed, in
// kinds' then parts' order, read back into the same slots; a step without any writes no key.
TEST(Metrics, AV4StepsAttentionMassReadsBack) {
  MetricsRow step{MetricsRow::Kind::step, "warm"};
  step.step = 10;
  step.attn_mass[1] = {0.625, 0.25, 0.125};  // CSA
  step.attn_mass[0][0] = 0.75, step.attn_mass[0][2] = 0.25;  // sliding: no entries
  const std::string line = metrics_line(step);
  EXPECT_NE(line.find(R"("attn_mass_window_sliding":0.75,"attn_mass_sink_sliding":0.25,"attn_mass_window_csa":0.625,)"
                      R"("attn_mass_entries_csa":0.25,"attn_mass_sink_csa":0.125})"),
            std::string::npos)
      << line;
  const MetricsFile f = read_metrics(write_file("mass", line + "\n"));
  ASSERT_EQ(f.rows.size(), 1u);
  for (size_t k = 0; k < 3; ++k)
    for (size_t q = 0; q < 3; ++q)
      EXPECT_TRUE(f.rows[0].attn_mass[k][q] == step.attn_mass[k][q] ||
                  (std::isnan(f.rows[0].attn_mass[k][q]) && std::isnan(step.attn_mass[k][q])))
          << k << " " << q;
  step.attn_mass = no_attn_mass();
  EXPECT_EQ(metrics_line(step).find("attn_mass"), std::string::npos);
}

}  // namespace
}  // namespace hmla
