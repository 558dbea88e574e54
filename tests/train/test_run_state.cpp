// What --resume reads back before it trusts it (run_state.h): a state.json's phase, step and data
// position checked at their exact bounds against the programme and the data, and which
// programme changes --allow-safe-changes admits (steps and the logging keys of phases not yet
// finished, nothing of a finished phase).
#include <gtest/gtest.h>

#include "hmla/core/error.h"
#include "hmla/train/run_state.h"

namespace hmla {
namespace {

const char* kTwoPhases = R"(model: m.json
data: d
base: {batch: 4, seq_len: 32, lr: 3.0e-3}
phases:
  - {name: pre, mode: mha, steps: 4}
  - {name: post, mode: mha, steps: 2}
)";

// A phase's step runs from 0 to its steps (a checkpoint after its last step); the phase after the
// last one is the finished run.
TEST(RunState, PhaseAndStepAtTheirBounds) {
  const Programme pr = parse_programme(kTwoPhases, "p.yaml");
  const TokenSet train{std::vector<int32_t>(100, 5), {0, 10, 40, 100}};
  auto parse = [&](int64_t phase, int64_t step) {
    return parse_run_state(run_state_json({phase, step, step > 0 ? std::vector<int64_t>{0, 1, 2} : std::vector<int64_t>{},
                                           "fp", 0}),
                           "state.json", pr, train);
  };
  EXPECT_EQ(parse(0, 4).step, 4);
  EXPECT_EQ(parse(1, 2).step, 2);
  EXPECT_EQ(parse(2, 0).phase, 2);
  EXPECT_THROW(parse(0, 5), IoError);
  EXPECT_THROW(parse(1, 3), IoError);
  EXPECT_THROW(parse(0, -1), IoError);
  EXPECT_THROW(parse(3, 0), IoError);
  EXPECT_THROW(parse(-1, 0), IoError);
}

// data_pos = [epoch, document, offset]: the document index may equal the count (the epoch's end),
// not pass it.
TEST(RunState, TheDataPositionLiesInsideTheData) {
  const Programme pr = parse_programme(kTwoPhases, "p.yaml");
  const TokenSet train{std::vector<int32_t>(100, 5), {0, 10, 40, 100}};  // 3 documents
  auto parse = [&](std::vector<int64_t> pos) {
    return parse_run_state(run_state_json({0, 2, pos, "fp", 0}), "state.json", pr, train);
  };
  EXPECT_EQ(parse({0, 3, 0}).data_pos[1], 3);
  EXPECT_THROW(parse({0, 4, 0}), IoError);
  EXPECT_THROW(parse({-1, 0, 0}), IoError);
  EXPECT_THROW(parse({0, 0, -1}), IoError);
  EXPECT_THROW(parse({0, 0}), IoError);
}

// Resuming in phase 1: its steps (and a later phase's) may change under allow_safe, phase 0's may
// not (it has run), and without allow_safe nothing may.
TEST(RunState, SafeChangesAreThoseOfPhasesNotYetFinished) {
  const std::string saved = R"({"seed": 1, "phases": [{"steps": 4, "lr": 0.1}, {"steps": 2, "lr": 0.1}, {"steps": 3}]})";
  auto changes = [&](const std::string& now, bool allow_safe) { return programme_changes(saved, now, 1, allow_safe).size(); };
  const std::string later = R"({"seed": 1, "phases": [{"steps": 4, "lr": 0.1}, {"steps": 5, "lr": 0.1}, {"steps": 9}]})";
  const std::string finished = R"({"seed": 1, "phases": [{"steps": 6, "lr": 0.1}, {"steps": 2, "lr": 0.1}, {"steps": 3}]})";
  const std::string lr = R"({"seed": 1, "phases": [{"steps": 4, "lr": 0.1}, {"steps": 2, "lr": 0.2}, {"steps": 3}]})";
  EXPECT_EQ(changes(saved, false), 0u);
  EXPECT_EQ(changes(later, true), 0u);
  EXPECT_EQ(changes(later, false), 2u);
  EXPECT_EQ(changes(finished, true), 1u);
  EXPECT_EQ(changes(lr, true), 1u);
}

}  // namespace
}  // namespace hmla
