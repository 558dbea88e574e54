// `hmla report RUN_DIR`: a self-contained HTML page (inline SVG, no scripts) with the LM loss and
// the indexer KL per phase and the phase table, from metrics.jsonl and summary.json.
#include <algorithm>
#include <iomanip>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.h"
#include "hmla/io/safetensors.h"

namespace hmla::app {

namespace {

using json = nlohmann::json;

struct Series {
  std::string phase;
  std::vector<std::pair<double, double>> pts;  // (global step, value)
};

std::string svg_plot(const std::string& title, const std::vector<Series>& series) {
  const double W = 760, H = 260, L = 60, R = 150, T = 30, B = 40;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const Series& s : series)
    for (auto [x, y] : s.pts) {
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  std::ostringstream os;
  os << "<h2>" << title << "</h2>\n<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H
     << "' style='font:12px sans-serif'>\n";
  if (x0 > x1) return os.str() + "<text x='20' y='40'>no data</text></svg>\n";
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + 1;
  auto X = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto Y = [&](double y) { return T + (y1 - y) / (y1 - y0) * (H - T - B); };
  os << "<rect x='" << L << "' y='" << T << "' width='" << W - L - R << "' height='" << H - T - B
     << "' fill='none' stroke='#999'/>\n";
  for (int i = 0; i <= 4; ++i) {
    const double y = y0 + (y1 - y0) * i / 4;
    os << "<text x='" << L - 6 << "' y='" << Y(y) + 4 << "' text-anchor='end'>" << std::setprecision(3) << y << "</text>\n";
  }
  os << "<text x='" << L << "' y='" << H - 12 << "'>step " << x0 << "</text><text x='" << W - R << "' y='" << H - 12
     << "' text-anchor='end'>" << x1 << "</text>\n";
  const char* colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"};
  int k = 0;
  for (const Series& s : series) {
    const char* c = colors[k % 6];
    os << "<polyline fill='none' stroke='" << c << "' stroke-width='1.2' points='";
    for (auto [x, y] : s.pts) os << X(x) << "," << Y(y) << " ";
    os << "'/>\n<text x='" << W - R + 10 << "' y='" << T + 16 * (k + 1) << "' fill='" << c << "'>" << s.phase << "</text>\n";
    ++k;
  }
  return os.str() + "</svg>\n";
}

}  // namespace

void add_report_command(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  CLI::App* rep = app.add_subcommand("report", "Write RUN_DIR/report.html: loss and indexer KL plots per phase, phase table.");
  rep->add_option("run_dir", *dir, "run directory of hmla train")->required()->check(CLI::ExistingDirectory);
  rep->callback([dir] {
    namespace fs = std::filesystem;
    const fs::path run(*dir);
    std::istringstream in(io::read_file((run / "metrics.jsonl").string()));
    std::vector<Series> loss, kl;
    std::map<std::string, size_t> idx;
    std::string line;
    double global = 0;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      json j;
      try {
        j = json::parse(line);
      } catch (const json::exception&) {
        throw IoError((run / "metrics.jsonl").string() + ": malformed line: " + line.substr(0, 80));
      }
      if (!j.contains("step")) continue;
      const std::string ph = j["phase"];
      if (!idx.count(ph)) {
        idx[ph] = loss.size();
        loss.push_back({ph, {}});
        kl.push_back({ph, {}});
      }
      global += 1;
      loss[idx[ph]].pts.push_back({global, j["lm_loss"].get<double>()});
      if (!j["indexer_kl"].is_null()) kl[idx[ph]].pts.push_back({global, j["indexer_kl"].get<double>()});
    }
    std::erase_if(kl, [](const Series& s) { return s.pts.empty(); });
    std::ostringstream html;
    html << "<!doctype html>\n<html><head><meta charset='utf-8'><title>hmla run " << run.filename().string()
         << "</title></head><body style='font-family:sans-serif;max-width:820px;margin:auto'>\n<h1>hmla run: "
         << run.string() << "</h1>\n"
         << svg_plot("LM loss per step", loss) << svg_plot("Indexer KL per step (dsa phases)", kl);
    html << "<h2>Phases</h2>\n<table border='1' cellpadding='4' style='border-collapse:collapse'>\n<tr><th>phase</th><th>mode</th>"
            "<th>steps</th><th>loss (first 20)</th><th>loss (last 20)</th><th>KL (last 20)</th><th>held-out loss</th>"
            "<th>time (s)</th><th>peak MiB</th></tr>\n";
    if (fs::exists(run / "summary.json")) {
      for (const json& r : json::parse(io::read_file((run / "summary.json").string()))) {
        auto cell = [&](const char* k, int prec) {
          std::ostringstream c;
          if (r[k].is_null()) c << "-";
          else c << std::fixed << std::setprecision(prec) << r[k].get<double>();
          return c.str();
        };
        html << "<tr><td>" << r["phase"].get<std::string>() << "</td><td>" << r["mode"].get<std::string>() << "</td><td>"
             << r["steps"] << "</td><td>" << cell("first20_lm_loss", 4) << "</td><td>" << cell("last20_lm_loss", 4)
             << "</td><td>" << cell("last20_indexer_kl", 4) << "</td><td>" << cell("heldout_lm_loss", 4) << "</td><td>"
             << cell("seconds", 1) << "</td><td>" << std::fixed << std::setprecision(1)
             << r["peak_bytes"].get<double>() / 1048576.0 << "</td></tr>\n";
      }
    }
    html << "</table>\n</body></html>\n";
    io::write_file_atomic((run / "report.html").string(), html.str());
    std::cout << "wrote " << (run / "report.html").string() << "\n";
  });
}

}  // namespace hmla::app
