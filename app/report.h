// What hmla report's two pages share (cmd_report.cpp: the run report; cmd_report_bench.cpp: the
// bench report): reading numbers and strings out of JSON lines, number formats, the series colours
// and the page style; and the bench report's entry point.
#pragma once
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace hmla::app {

inline constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"};

inline constexpr const char* kStyle =
    "<style>body{font-family:sans-serif;max-width:980px;margin:auto}table{border-collapse:collapse;margin:8px 0}"
    "td,th{border:1px solid #ccc;padding:3px 6px;text-align:left;font-size:13px}svg{display:block}"
    "td svg{display:inline}</style>";

// A number, or NaN where the field is missing, null or not a number (drawn as a gap).
inline double number(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : std::nan("");
}

inline std::string str(const nlohmann::json& j, const char* key, const std::string& fallback = "?") {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : fallback;
}

inline std::string sci(double v) {
  if (!std::isfinite(v)) return "-";
  std::ostringstream c;
  c << std::setprecision(3) << v;
  return c.str();
}

// Fixed-point with `prec` decimals; scientific from 1e15 on (1e308 would be 309 digits).
inline std::string fmt(double v, int prec, double div = 1) {
  if (!std::isfinite(v / div)) return "-";
  if (std::abs(v / div) >= 1e15) return sci(v / div);
  std::ostringstream c;
  c << std::fixed << std::setprecision(prec) << v / div;
  return c.str();
}

// `hmla report --bench FILE --out DIR`: the bench plots as DIR/*.svg and DIR/bench.html.
void write_bench_report(const std::filesystem::path& file, const std::filesystem::path& out);

}  // namespace hmla::app
