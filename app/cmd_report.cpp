// `hmla report RUN_DIR`: a self-contained HTML page (inline SVG, no scripts) with the LM loss and
// the indexer KL per phase and the phase table, from metrics.jsonl and summary.json.
#include <algorithm>
#include <cmath>
#include <iomanip>
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

// A number, or NaN where the field is missing, null or not a number (drawn as a gap).
double number(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : std::nan("");
}

std::string text(const json& j, const char* key) {
  auto it = j.find(key);
  std::string v = it != j.end() && it->is_string() ? it->get<std::string>() : "?", out;
  for (char c : v) out += c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '&' ? "&amp;" : c == '\'' ? "&#39;" : std::string(1, c);
  return out;
}

struct Series {
  std::string phase;
  std::vector<std::pair<double, double>> pts;  // (global step, value)
};

std::string svg_plot(const std::string& title, const std::vector<Series>& series) {
  const double W = 760, H = 260, L = 60, R = 150, T = 30, B = 40;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const Series& s : series)
    for (auto [x, y] : s.pts) {
      if (!std::isfinite(y)) continue;
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
    for (auto [x, y] : s.pts) {
      if (std::isfinite(y)) os << X(x) << "," << Y(y) << " ";
      else os << "'/>\n<polyline fill='none' stroke='" << c << "' stroke-width='1.2' points='";  // a gap
    }
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
    int64_t skipped = 0;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      json j;
      try {
        j = json::parse(line);
      } catch (const json::exception&) {  // e.g. a line cut by a crash: draw the rest
        ++skipped;
        continue;
      }
      if (!j.is_object() || !j.contains("step")) continue;
      const std::string ph = text(j, "phase");
      if (!idx.count(ph)) {
        idx[ph] = loss.size();
        loss.push_back({ph, {}});
        kl.push_back({ph, {}});
      }
      global += 1;
      loss[idx[ph]].pts.push_back({global, number(j, "lm_loss")});
      if (j.contains("indexer_kl") && !j["indexer_kl"].is_null()) kl[idx[ph]].pts.push_back({global, number(j, "indexer_kl")});
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
      json table;
      try {
        table = json::parse(io::read_file((run / "summary.json").string()));
      } catch (const json::exception&) {
        throw IoError((run / "summary.json").string() + ": not JSON");
      }
      for (const json& r : table.is_array() ? table : json::array()) {
        auto cell = [&](const char* k, int prec, double div = 1) {
          std::ostringstream c;
          const double v = number(r, k);
          if (std::isfinite(v)) c << std::fixed << std::setprecision(prec) << v / div;
          else c << "-";
          return c.str();
        };
        html << "<tr><td>" << text(r, "phase") << "</td><td>" << text(r, "mode") << "</td><td>" << cell("steps", 0)
             << "</td><td>" << cell("first20_lm_loss", 4) << "</td><td>" << cell("last20_lm_loss", 4) << "</td><td>"
             << cell("last20_indexer_kl", 4) << "</td><td>" << cell("heldout_lm_loss", 4) << "</td><td>"
             << cell("seconds", 1) << "</td><td>" << cell("peak_bytes", 1, 1048576.0) << "</td></tr>\n";
      }
    }
    html << "</table>\n</body></html>\n";
    io::write_file_atomic((run / "report.html").string(), html.str());
    std::cout << "wrote " << (run / "report.html").string() << "\n";
    if (skipped > 0) std::cerr << "hmla: note: skipped " << skipped << " malformed line(s) of metrics.jsonl\n";
  });
}

}  // namespace hmla::app
