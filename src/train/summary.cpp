// The console lines and summary.json of a run (summary.h).
#include "summary.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>

#include "hmla/io/safetensors.h"

namespace hmla::train {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

std::string fmt_time(double sec) {
  std::ostringstream os;
  const int64_t s = int64_t(sec + 0.5);
  os << s / 60 << "m" << std::setw(2) << std::setfill('0') << s % 60 << "s";
  return os.str();
}

}  // namespace

void print_progress(std::ostream& log, const PhaseSettings& ph, int64_t step, const StepResult& r, double per_step) {
  log << "[" << ph.name << "] step " << step + 1 << "/" << ph.steps << "  lm " << std::fixed << std::setprecision(4)
      << r.lm;
  if (is_dsa(ph.mode)) log << "  kl " << r.kl;
  if (std::isfinite(r.mtp) && r.mtp != 0) log << "  mtp " << r.mtp;
  log << "  " << std::setprecision(0) << double(r.tokens) / r.seconds << " tok/s  ETA "
      << fmt_time(per_step * double(ph.steps - step - 1)) << std::defaultfloat << std::setprecision(6) << "\n"
      << std::flush;
}

void phase_history(const std::vector<MetricsRow>& rows, std::vector<double>& losses, std::vector<double>& kls) {
  for (const MetricsRow& r : rows) {
    if (r.kind == MetricsRow::Kind::phase_end) losses.clear(), kls.clear();
    if (r.kind != MetricsRow::Kind::step) continue;
    losses.push_back(r.lm_loss);
    kls.push_back(r.indexer_kl);
  }
}

std::vector<PhaseSummary> summaries_from_metrics(const Programme& pr, const std::vector<MetricsRow>& rows) {
  std::vector<PhaseSummary> out;
  size_t peak = 0;
  for (const MetricsRow& r : rows) {
    if (r.kind == MetricsRow::Kind::step && r.peak_bytes > double(peak)) peak = size_t(r.peak_bytes);
    if (r.kind != MetricsRow::Kind::phase_end || out.size() >= pr.phases.size()) continue;
    const PhaseSettings& ph = pr.phases[out.size()];
    out.push_back({ph.name, mode_name(ph.mode), ph.steps, r.first20_lm_loss, r.last20_lm_loss, r.last20_indexer_kl,
                   r.heldout_lm_loss, r.seconds, peak, r.heldout_unavailable});
    peak = 0;
  }
  for (size_t i = 0; i < out.size(); ++i) {  // each control arm's result beside its sparse phase's
    const int64_t j = pr.phases[i].control_of;
    if (j >= 0 && size_t(j) < out.size()) out[size_t(j)].control = out[i].name, out[size_t(j)].control_heldout = out[i].heldout;
  }
  return out;
}

void print_summary_table(std::ostream& log, const std::vector<PhaseSummary>& summaries) {
  log << "\n" << std::left << std::setw(16) << "phase" << std::setw(17) << "mode" << std::right << std::setw(7) << "steps"
      << std::setw(11) << "loss_0" << std::setw(11) << "loss" << std::setw(10) << "kl" << std::setw(11) << "heldout"
      << std::setw(10) << "time" << std::setw(11) << "peak_MiB" << "\n";
  auto num = [](double x) {
    std::ostringstream os;
    if (std::isnan(x)) os << "-";
    else os << std::fixed << std::setprecision(4) << x;
    return os.str();
  };
  for (const PhaseSummary& s : summaries)
    log << std::left << std::setw(16) << s.name << std::setw(17) << s.mode << std::right << std::setw(7) << s.steps
        << std::setw(11) << num(s.first_loss) << std::setw(11) << num(s.final_loss) << std::setw(10) << num(s.final_kl)
        << std::setw(11) << (s.heldout_unavailable.empty() ? num(s.heldout) : "n/a") << std::setw(10) << fmt_time(s.seconds)
        << std::fixed << std::setprecision(1) << std::setw(11) << s.peak / 1048576.0 << std::defaultfloat << "\n";
  for (const PhaseSummary& s : summaries)
    if (!s.heldout_unavailable.empty())
      log << "heldout n/a in phase '" << s.name << "': " << s.heldout_unavailable << "\n";
  for (const PhaseSummary& s : summaries)
    if (!s.control.empty())
      log << "quality A/B: '" << s.name << "' held-out " << num(s.heldout) << " vs its dense control arm '" << s.control
          << "' " << num(s.control_heldout) << ": sparse - dense = " << num(s.heldout - s.control_heldout) << "\n";
}

void write_summary_json(const fs::path& out, const std::vector<PhaseSummary>& summaries) {
  auto num = [](double x) { return std::isnan(x) ? json() : json(x); };
  json table = json::array();
  for (const PhaseSummary& s : summaries) {
    table.push_back({{"phase", s.name}, {"mode", s.mode}, {"steps", s.steps}, {"first20_lm_loss", num(s.first_loss)},
                     {"last20_lm_loss", num(s.final_loss)}, {"last20_indexer_kl", num(s.final_kl)},
                     {"heldout_lm_loss", num(s.heldout)}, {"seconds", s.seconds}, {"peak_bytes", s.peak}});
    if (!s.heldout_unavailable.empty()) table.back()["heldout_unavailable"] = s.heldout_unavailable;
    if (!s.control.empty())
      table.back()["control"] = {{"phase", s.control}, {"heldout_lm_loss", num(s.control_heldout)},
                                 {"sparse_minus_dense", num(s.heldout - s.control_heldout)}};
  }
  io::write_file_atomic((out / "summary.json").string(), table.dump(2) + "\n");
}

}  // namespace hmla::train
