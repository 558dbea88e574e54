// What a run tells the user as it goes and at its end: the progress line, and the end-of-run
// table (console) and summary.json, both built from metrics.jsonl so that the phases run before
// a resume are in them too.
#pragma once
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "hmla/train/metrics.h"
#include "hmla/train/programme.h"
#include "step.h"

namespace hmla::train {

// "[name] step 7/20  lm 3.1416  kl 0.1234  5123 tok/s  ETA 0m42s" (kl in dsa phases only).
void print_progress(std::ostream& log, const PhaseSettings& ph, int64_t step, const StepResult& r, double per_step);

// The LM losses and indexer KLs of the phase in progress: its step rows after the last phase end.
void phase_history(const std::vector<MetricsRow>& rows, std::vector<double>& losses, std::vector<double>& kls);

struct PhaseSummary {
  std::string name, mode;
  int64_t steps = 0;
  double first_loss = 0, final_loss = 0, final_kl = 0, heldout = 0, seconds = 0;
  size_t peak = 0;
  std::string heldout_unavailable{};
  // A sparse phase with a control arm (docs/programme.md): the arm's name and held-out loss.
  std::string control{};
  double control_heldout = NAN;  // why there is no held-out loss (heldout is NaN then)
};

// One summary per phase-end row (the programme names its phase and mode), with the peak of its
// step rows.
std::vector<PhaseSummary> summaries_from_metrics(const Programme& pr, const std::vector<MetricsRow>& rows);
// The table, one line per phase, then the phases without a held-out loss and why.
void print_summary_table(std::ostream& log, const std::vector<PhaseSummary>& summaries);
// out/summary.json: the same table as JSON (null for a number that is not one).
void write_summary_json(const std::filesystem::path& out, const std::vector<PhaseSummary>& summaries);

}  // namespace hmla::train
