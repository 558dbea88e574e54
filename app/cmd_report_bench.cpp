// `hmla report --bench BENCH.jsonl --out DIR`: the benches that have a story (warmup-memory,
// attention, indexer, sparse, train), as DIR/bench.html and one SVG each (svg_chart.h). A line
// that is not JSON is skipped and counted; a plotted line whose x is not a positive number, or a
// geometry that names a file, is refused before anything is written.
#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "hmla/core/error.h"
#include "hmla/io/json_strict.h"
#include "hmla/io/paths.h"
#include "hmla/io/safetensors.h"
#include "report.h"
#include "svg_chart.h"

namespace hmla::app {

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

using Lines = std::vector<json>;

// The finite values of v, sorted, each once (the measured lengths as x ticks).
std::vector<double> distinct(std::vector<double> v) {
  std::erase_if(v, [](double x) { return !std::isfinite(x); });
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

// The MLA layer's arms, or a CSA layer's ("layer": "csa": its dense core in the mha columns, and the
// dsa_sparse arm).
Chart warmup_memory_chart(const Lines& rows, const std::string& geometry) {
  Chart c{"Peak memory of one attention core fwd+bwd (" + geometry + ")", "sequence length s (log scale)",
          "peak MiB above the inputs (log scale)", false, true, true};
  std::vector<double> s, mha, warm, sparse, legacy;
  bool csa = false;
  for (const json& r : rows) {
    if (str(r, "geometry") != geometry) continue;
    csa = csa || str(r, "layer") == "csa";
    s.push_back(number(r, "s"));
    mha.push_back(number(r, "mha_peak_bytes") / 1048576.0);
    warm.push_back(number(r, "warmup_peak_bytes") / 1048576.0);
    sparse.push_back(number(r, "sparse_peak_bytes") / 1048576.0);
    legacy.push_back(number(r, "legacy_peak_bytes") / 1048576.0);
  }
  const bool has_sparse = std::any_of(sparse.begin(), sparse.end(), [](double v) { return std::isfinite(v); });
  if (csa)
    c.series = {{"mha (dense CSA core)", "#1f77b4", s, mha, ChartSeries::line},
                {"dsa_warmup (+ dense CSA KL)", "#2ca02c", s, warm, ChartSeries::line},
                {"legacy [s, n_e] table", "#d62728", s, legacy, ChartSeries::line}};
  else
    c.series = {{"mha (phase 1)", "#1f77b4", s, mha, ChartSeries::line},
                {"dsa_warmup (hmla)", "#2ca02c", s, warm, ChartSeries::line},
                {"legacy [s, s] table", "#d62728", s, legacy, ChartSeries::line}};
  if (has_sparse) c.series.push_back({"dsa_sparse (top-k)", "#9467bd", s, sparse, ChartSeries::line});
  for (size_t i = 0, n = c.series.size(); i < n; ++i) {  // a marker at each measured s
    ChartSeries pts = c.series[i];
    pts.name = "", pts.style = ChartSeries::points;
    c.series.push_back(pts);
  }
  if (!s.empty()) {
    const size_t i = s.size() - 1;
    c.note = "at s = " + fmt(s[i], 0) + ": dsa_warmup / mha = " + fmt(warm[i] / mha[i], 3) +
             (std::isfinite(sparse[i]) ? ", dsa_sparse / mha = " + fmt(sparse[i] / mha[i], 3) : std::string()) +
             (std::isfinite(legacy[i]) ? ", legacy / mha = " + fmt(legacy[i] / mha[i], 1) : std::string());
  }
  c.x_ticks = distinct(s);
  return c;
}

// One document per row (the naive arm runs there) and packed documents, each by s.
Chart attention_chart(const Lines& rows) {
  Chart c{"Dense attention fwd+bwd throughput", "sequence length s (log scale)", "GFLOP/s", false, false, true};
  std::vector<double> s1, one, naive, sgemm, sp, packed;
  for (const json& r : rows) {
    const double s = number(r, "s"), g = number(r, "gflops");
    if (number(r, "docs") > 1) {
      sp.push_back(s), packed.push_back(g);
      continue;
    }
    s1.push_back(s), one.push_back(g);
    naive.push_back(g * number(r, "fwdbwd_ms") / number(r, "naive_fwdbwd_ms"));
    sgemm.push_back(number(r, "sgemm_gflops"));
  }
  c.series = {{"hmla, one document", "#1f77b4", s1, one, ChartSeries::line},
              {"hmla, packed documents", "#2ca02c", sp, packed, ChartSeries::line},
              {"naive (materialised scores)", "#d62728", s1, naive, ChartSeries::line},
              {"sgemm 2048^3, same threads", "#7f7f7f", s1, sgemm, ChartSeries::line}};
  if (!rows.empty())
    c.note = "BLAS kernels: " + str(rows[0], "blas_core") + ", " + rows[0].value("threads", json()).dump() +
             " threads; FLOPs of the allowed pairs (FlashAttention's convention)";
  s1.insert(s1.end(), sp.begin(), sp.end());
  c.x_ticks = distinct(s1);
  return c;
}

Chart indexer_chart(const Lines& rows) {
  Chart c{"Indexer dense KL workspace", "sequence length s (log scale)", "workspace MiB (log scale)", false, true, true};
  std::vector<double> s, fused, mat;
  for (const json& r : rows) {
    s.push_back(number(r, "s"));
    fused.push_back(number(r, "dense_kl_workspace_bytes") / 1048576.0);
    mat.push_back(number(r, "materialized_kl_workspace_bytes") / 1048576.0);
  }
  c.series = {{"fused (hmla)", "#2ca02c", s, fused, ChartSeries::line},
              {"materialised [s, s]", "#d62728", s, mat, ChartSeries::line}};
  c.x_ticks = distinct(s);
  return c;
}

Chart sparse_chart(const Lines& rows) {
  Chart c{"Sparse latent MQA fwd+bwd: time per valid pair", "sequence length s (log scale)", "ns per (row, key) pair",
          false, false, true};
  std::vector<double> s, ns;
  for (const json& r : rows) s.push_back(number(r, "s")), ns.push_back(number(r, "ns_per_pair"));
  c.series = {{"hmla", "#1f77b4", s, ns, ChartSeries::line}, {"", "#1f77b4", s, ns, ChartSeries::points}};
  c.x_ticks = distinct(s);
  return c;
}

Chart train_chart(const Lines& rows) {
  Chart c{"Training step throughput: hmla vs the PyTorch twin", "sequence length (log scale)", "tokens/s", false,
          false, true};
  std::map<std::string, std::array<std::vector<double>, 3>> by_mode;
  for (const json& r : rows) {
    auto& m = by_mode[str(r, "mode")];
    m[0].push_back(number(r, "seq_len")), m[1].push_back(number(r, "hmla_tokens_per_s")),
        m[2].push_back(number(r, "torch_tokens_per_s"));
  }
  int k = 0;
  for (const auto& [mode, m] : by_mode) {
    const std::string color = kColors[k++ % 7];
    c.series.push_back({"hmla " + mode, color, m[0], m[1], ChartSeries::line});
    c.series.push_back({"torch " + mode, color, m[0], m[2], ChartSeries::faint});
  }
  c.note = "faint: the PyTorch twin (same model, weights, batch and threads)";
  for (const auto& [mode, m] : by_mode) c.x_ticks.insert(c.x_ticks.end(), m[0].begin(), m[0].end());
  c.x_ticks = distinct(c.x_ticks);
  return c;
}

// The x each plotted bench draws against: a sequence length, on a log axis.
const std::map<std::string, const char*> kBenchX = {
    {"warmup-memory", "s"}, {"attention", "s"}, {"indexer", "s"}, {"sparse", "s"}, {"train", "seq_len"}};

// A plotted line must hold its x as a positive number (JSON holds no non-finite one: a number
// beyond the double range is refused by the parser) and, for warmup-memory, a geometry that is a
// plain name, since it names the line's SVG file. The values it plots may be missing or null:
// an arm that did not run (no --legacy, no torch, no naive arm at this s) is a gap.
void check_bench_line(const json& j, const std::string& where) {
  const std::string bench = str(j, "bench");
  const auto x = kBenchX.find(bench);
  if (x == kBenchX.end()) return;  // not plotted
  const double v = number(j, x->second);
  HMLA_CHECK(std::isfinite(v) && v > 0, IoError, where, " (", bench, "): '", x->second, "' is ",
             j.contains(x->second) ? j.at(x->second).dump() : std::string("missing"),
             "; it must be a positive number (a sequence length); nothing was written");
  if (bench != "warmup-memory") return;
  HMLA_CHECK(j.contains("geometry") && j.at("geometry").is_string(), IoError, where,
             ": a warmup-memory line needs its geometry as a string; nothing was written");
  io::check_path_name(j.at("geometry").get<std::string>(), where + ": geometry");
}

struct BenchLines {
  std::map<std::string, Lines> by_bench;
  int64_t skipped = 0, first_skipped = 0;  // lines that are not JSON (a bench killed mid-line)
};

BenchLines read_bench_lines(const fs::path& file) {
  BenchLines b;
  std::istringstream in(io::read_file(file.string()));
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.empty() || line[0] != '{') continue;  // the benches' other output
    const std::string where = file.string() + " line " + std::to_string(n);
    json j;
    try {
      j = io::parse_json(line, where);
    } catch (const IoError& e) {
      // nlohmann's out_of_range (1e999) is a number no chart can draw: an error; anything else the
      // strict parse refuses (a cut line, a key twice, nesting past its bound) is skipped.
      if (std::string(e.what()).find("json.exception.out_of_range") == std::string::npos) {
        if (b.skipped++ == 0) b.first_skipped = n;
        continue;
      }
      detail::throw_error<IoError>(where, ": a number beyond the double range (", e.what(), "); nothing was written");
    } catch (const json::exception&) {
      if (b.skipped++ == 0) b.first_skipped = n;
      continue;
    }
    if (!j.is_object() || !j.contains("bench")) continue;
    check_bench_line(j, where);
    b.by_bench[str(j, "bench")].push_back(std::move(j));
  }
  return b;
}

}  // namespace

void write_bench_report(const fs::path& file, const fs::path& out) {
  BenchLines lines = read_bench_lines(file);
  std::map<std::string, Lines>& by_bench = lines.by_bench;
  std::vector<std::pair<std::string, Chart>> charts;
  if (by_bench.count("warmup-memory")) {
    std::vector<std::string> geos;
    for (const json& r : by_bench["warmup-memory"])
      if (std::find(geos.begin(), geos.end(), str(r, "geometry")) == geos.end()) geos.push_back(str(r, "geometry"));
    for (const std::string& g : geos) charts.push_back({"warmup_memory_" + g, warmup_memory_chart(by_bench["warmup-memory"], g)});
  }
  if (by_bench.count("attention")) charts.push_back({"attention", attention_chart(by_bench["attention"])});
  if (by_bench.count("indexer")) charts.push_back({"indexer", indexer_chart(by_bench["indexer"])});
  if (by_bench.count("sparse")) charts.push_back({"sparse", sparse_chart(by_bench["sparse"])});
  if (by_bench.count("train")) charts.push_back({"train", train_chart(by_bench["train"])});
  HMLA_CHECK(!charts.empty(), IoError, file.string(), ": no bench line with a plot (warmup-memory, attention, indexer, "
                                                        "sparse, train); run hmla bench ... --json");
  std::error_code ec;
  fs::create_directories(out, ec);
  HMLA_CHECK(!ec, IoError, out.string(), ": cannot create the directory (", ec.message(), ")");
  std::ostringstream html;
  html << "<!DOCTYPE html>\n<html><head><meta charset='utf-8'/><title>hmla benches</title>" << kStyle
       << "</head><body>\n<h1>hmla benches: " << xml_escape(file.string()) << "</h1>\n";
  for (const auto& [name, chart] : charts) {
    const std::string svg = render_svg(chart);
    io::write_file_atomic((out / (name + ".svg")).string(), "<?xml version='1.0' encoding='UTF-8'?>\n" + svg);
    html << svg;
    std::cout << "wrote " << (out / (name + ".svg")).string() << "\n";
  }
  io::write_file_atomic((out / "bench.html").string(), html.str() + "</body></html>\n");
  std::cout << "wrote " << (out / "bench.html").string() << "\n";
  if (lines.skipped > 0)
    std::cerr << "hmla: note: skipped " << lines.skipped << " malformed line(s) of " << file.string() << " (the first: line "
              << lines.first_skipped << ")\n";
}

}  // namespace hmla::app
