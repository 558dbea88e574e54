// What a run records beside its weights so that --resume continues exactly the run it stopped, or
// refuses with the reason: each checkpoint's state.json (where the run stands, which data it read,
// how far metrics.jsonl had got) and the run's programme.json (the programme as resolved).
// Everything read back is checked against what it indexes before it is used.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "hmla/data/token_set.h"
#include "hmla/train/programme.h"

namespace hmla {

struct RunState {
  int64_t phase = 0, step = 0;     // the next step to run
  std::vector<int64_t> data_pos;   // PackedLoader::position() of that phase ({} at a phase start)
  std::string data_fingerprint;    // data_fingerprint() (data/fingerprint.h) of the data the run read
  int64_t metrics_bytes = 0;       // length of metrics.jsonl when the checkpoint was taken
};

std::string run_state_json(const RunState& st);
// Parses and checks a state.json against the programme (phase and step in range) and the training
// data (the position lies inside it). `what` names the file in errors.
RunState parse_run_state(const std::string& text, const std::string& what, const Programme& pr,
                         const TokenSet& train);

// The programme as resolved (every phase key with its default applied; the model config's text
// hashed), as canonical JSON text.
std::string programme_json(const Programme& pr);
// The keys whose values differ between two programme_json texts ("phases[1].lr: 0.003 -> 0.001").
// With allow_safe, changes to steps, log_every, checkpoint_every and eval_rows of phases at or
// after `from_phase` are accepted (they change neither the past nor the meaning of a checkpoint).
// `saved_what` names the saved text in errors.
std::vector<std::string> programme_changes(const std::string& saved, const std::string& current,
                                           int64_t from_phase, bool allow_safe,
                                           const std::string& saved_what = "programme.json");

}  // namespace hmla
