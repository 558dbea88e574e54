// `hmla report RUN_DIR`: RUN_DIR/report.html, one self-contained page (inline SVG, no scripts):
// the run's configuration and environment, LM loss and indexer KL over the global step (raw and
// smoothed, phase boundaries, held-out points, the equivalence check), the learning rate, the
// gradient norms, a MoE model's load imbalance per MoE layer, a DeepSeek-V4 stack's indexer KL and
// attention mass per layer kind, and per phase its speed and memory.
// `hmla report --bench BENCH.jsonl --out DIR` is cmd_report_bench.cpp's.
// Whatever a run left (a resume, a phase of 0 steps, a stop mid-phase, missing or non-finite
// metrics, a cut line) is drawn as it is: gaps, never a crash; any finite values draw (svg_chart.h).
// The page goes only into a run directory (the run marker) or to an explicit --out.
#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "commands.h"
#include "hmla/core/error.h"
#include "hmla/io/json_strict.h"
#include "hmla/io/paths.h"
#include "hmla/io/safetensors.h"
#include "hmla/model/config.h"
#include "hmla/model/indexer.h"
#include "hmla/model/model.h"
#include "hmla/train/metrics.h"
#include "hmla/train/run_dir.h"
#include "report.h"
#include "svg_chart.h"

namespace hmla::app {

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr double kEmaAlpha = 0.1;  // the smoothing of the loss and KL curves (about 20 steps)

// A JSON file of the run, or null when it is absent or unreadable (the page says so).
json read_json(const fs::path& p) {
  if (!fs::exists(p)) return nullptr;
  try {
    return io::load_json(p.string());
  } catch (const std::exception&) {
    return nullptr;
  }
}

double median(std::vector<double> v) {
  std::erase_if(v, [](double x) { return !std::isfinite(x); });
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double max_finite(const std::vector<double>& v) {
  double m = std::nan("");
  for (double x : v)
    if (std::isfinite(x) && !(x <= m)) m = x;
  return m;
}

// ---- the run -------------------------------------------------------------------------------

struct Phase {
  std::string name, mode;
  double start = 0;                           // global step before its first step
  std::vector<double> x, lm, kl, lr, gb, gi, tps, peak, mtp;  // per step (mtp: NaN outside MTP phases)
  std::vector<double> kl_csa, kl_hybrid;                      // a V4 stack's KL per layer kind, per step
  std::array<std::array<std::vector<double>, 3>, 3> mass;     // a V4 stack's attention mass [kind][part], per step
  double heldout = std::nan(""), heldout_x = std::nan("");
  double eq_diff = std::nan(""), eq_logit = std::nan("");
  std::optional<MetricsRow> end;  // its phase-end row (none if the run stopped inside it)
};

struct Run {
  std::vector<Phase> phases;
  // A MoE model's load imbalance per MoE layer over the global step (x, y), from the step rows.
  std::map<int64_t, std::pair<std::vector<double>, std::vector<double>>> imbalance;
  int64_t skipped = 0;  // malformed lines (MetricsFile::malformed)
};

// A phase-end row's number, NaN without one (a stopped phase).
double end_value(const Phase& p, double MetricsRow::*field) { return p.end ? (*p.end).*field : std::nan(""); }

Run read_run(const fs::path& metrics, const json& programme) {
  std::map<std::string, std::string> modes;
  if (programme.is_object() && programme.contains("phases") && programme.at("phases").is_array())
    for (const json& p : programme.at("phases")) modes[str(p, "name")] = str(p, "mode");
  Run run;
  double global = 0;
  auto phase = [&](const std::string& name) -> Phase& {
    if (run.phases.empty() || run.phases.back().name != name) {
      Phase p;
      p.name = name;
      p.mode = modes.count(name) ? modes[name] : "?";
      p.start = global;
      run.phases.push_back(std::move(p));
    }
    return run.phases.back();
  };
  MetricsFile file = read_metrics(metrics);  // the trainer's reader: one rule for each row's kind
  run.skipped = file.malformed;                // e.g. a line cut by a crash: draw the rest
  for (MetricsRow& r : file.rows) {
    Phase& p = phase(r.phase);
    switch (r.kind) {
      case MetricsRow::Kind::step:
        global += 1;
        p.x.push_back(global);
        p.lm.push_back(r.lm_loss), p.kl.push_back(r.indexer_kl), p.lr.push_back(r.lr);
        p.gb.push_back(r.grad_norm_backbone), p.gi.push_back(r.grad_norm_indexer);
        p.tps.push_back(r.tokens_per_s), p.peak.push_back(r.peak_bytes), p.mtp.push_back(r.mtp_loss);
        p.kl_csa.push_back(r.indexer_kl_csa), p.kl_hybrid.push_back(r.indexer_kl_hybrid);
        for (size_t k = 0; k < 3; ++k)
          for (size_t q = 0; q < 3; ++q) p.mass[k][q].push_back(r.attn_mass[k][q]);
        for (size_t i = 0; i < r.moe_layers.size(); ++i) {
          auto& [x, y] = run.imbalance[r.moe_layers[i]];
          x.push_back(global);
          y.push_back(i < r.moe_imbalance.size() ? r.moe_imbalance[i] : std::nan(""));
        }
        break;
      case MetricsRow::Kind::equivalence:
        if (!std::isfinite(p.eq_diff)) p.eq_diff = r.equivalence_max_diff, p.eq_logit = r.equivalence_max_logit;
        break;
      case MetricsRow::Kind::phase_end:
        p.heldout = r.heldout_lm_loss;
        p.heldout_x = global;
        p.end = std::move(r);
        break;
      case MetricsRow::Kind::other:
        break;
    }
  }
  return run;
}

std::vector<ChartMarker> boundaries(const Run& run) {
  std::vector<ChartMarker> m;
  for (const Phase& p : run.phases) m.push_back({p.start + 0.5, p.name + " · " + p.mode});
  return m;
}

// One phase-coloured raw + smoothed pair per phase with values; held-out points; boundaries.
Chart per_phase_chart(const Run& run, const std::string& title, const std::string& y_title,
                      std::vector<double> Phase::*values, bool smooth, bool heldout, bool log) {
  Chart c{title, "global step (all phases)", y_title, true, log};
  c.markers = boundaries(run);
  std::vector<double> hx, hy;
  for (size_t i = 0; i < run.phases.size(); ++i) {
    const Phase& p = run.phases[i];
    const std::vector<double>& y = p.*values;
    const std::string color = kColors[i % 7];
    if (std::any_of(y.begin(), y.end(), [](double v) { return std::isfinite(v); })) {
      if (smooth) {
        c.series.push_back({"", color, p.x, y, ChartSeries::faint});
        c.series.push_back({p.name + " (" + p.mode + ")", color, p.x, ema(y, kEmaAlpha), ChartSeries::line});
      } else {
        c.series.push_back({p.name + " (" + p.mode + ")", color, p.x, y, ChartSeries::line});
      }
    }
    if (heldout && std::isfinite(p.heldout)) hx.push_back(p.heldout_x), hy.push_back(p.heldout);
  }
  if (!hx.empty()) c.series.push_back({"held-out loss", "#ffd700", hx, hy, ChartSeries::points});
  if (smooth)
    c.note = "faint: every step; bold: its EMA (alpha = " + fmt(kEmaAlpha, 1) +
             ", bias-corrected, restarted at each phase); dashed: a phase starts";
  return c;
}

Chart grad_norm_chart(const Run& run) {
  Chart c{"Gradient norms (before clipping)", "global step (all phases)", "L2 norm (log scale)", true, true};
  c.markers = boundaries(run);
  std::vector<double> x, gb, gi;
  for (const Phase& p : run.phases) {
    x.insert(x.end(), p.x.begin(), p.x.end());
    gb.insert(gb.end(), p.gb.begin(), p.gb.end());
    gi.insert(gi.end(), p.gi.begin(), p.gi.end());
  }
  c.series.push_back({"backbone", "#1f77b4", x, gb, ChartSeries::line});
  c.series.push_back({"indexer", "#d62728", x, gi, ChartSeries::line});
  c.note = "zeros (a part that does not train in a phase) are not drawn on the log axis";
  return c;
}

bool any_finite(const std::vector<double>& v) {
  return std::any_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); });
}

// A V4 stack's indexer KL per layer kind (DESIGN.md section 10), the EMA of each phase's steps.
Chart kl_kind_chart(const Run& run) {
  Chart c{"Indexer KL per layer kind (DeepSeek-V4 stacks)", "global step (all phases)",
          "KL(attention || indexer), log scale", true, true};
  c.markers = boundaries(run);
  for (const Phase& p : run.phases) {
    if (any_finite(p.kl_csa)) c.series.push_back({"CSA · " + p.name, "#d62728", p.x, ema(p.kl_csa, kEmaAlpha)});
    if (any_finite(p.kl_hybrid))
      c.series.push_back({"hybrid_mla · " + p.name, "#1f77b4", p.x, ema(p.kl_hybrid, kEmaAlpha)});
  }
  c.note = "CSA: the full-CSA-denominator KL over compressed entries (docs/csa_indexer_kl.md); hybrid_mla: DESIGN.md "
           "section 6; EMA alpha " + fmt(kEmaAlpha, 1);
  return c;
}

// A V4 stack's attention mass for one layer kind (docs/v4_attention.md "Attention mass"): one line
// per part over the logging steps of every phase; nothing where no step logged the kind.
std::string mass_chart(const Run& run, size_t kind) {
  static constexpr const char* kTitle[3] = {"sliding", "CSA", "HCA"};
  static constexpr const char* kPart[3] = {"window keys", "compressed entries", "sink"};
  Chart c{std::string("Attention mass, ") + kTitle[kind] + " layers (DeepSeek-V4 stacks)", "global step (all phases)",
          "share of the softmax", true, false};
  c.markers = boundaries(run);
  for (size_t q = 0; q < 3; ++q) {
    ChartSeries line{kPart[q], kColors[q], {}, {}, ChartSeries::line};
    for (const Phase& p : run.phases)
      for (size_t i = 0; i < p.x.size(); ++i)
        if (std::isfinite(p.mass[kind][q][i])) line.x.push_back(p.x[i]), line.y.push_back(p.mass[kind][q][i]);
    if (!line.x.empty()) c.series.push_back(std::move(line));
  }
  if (c.series.empty()) return "";
  c.note = "the mean over the loss rows, heads and layers of the kind, on the logging steps (log_every); in "
           "dsa_sparse a CSA layer's entries are its top-k";
  return render_svg(c);
}

// Quality parity (docs/programme.md "The control arm"): each sparse phase beside its dense control
// arm, step by step from the same model and data, and the held-out losses' difference.
std::string control_sections(const Run& run, const json& programme) {
  std::ostringstream os;
  const json phases = programme.is_object() ? programme.value("phases", json::array()) : json::array();
  for (const json& pc : phases.is_array() ? phases : json::array()) {
    if (!pc.is_object() || !pc.contains("control_of") || !pc["control_of"].is_number_integer()) continue;
    const size_t j = pc["control_of"].get<size_t>();
    if (j >= phases.size() || !phases[j].is_object()) continue;
    const std::string arm = str(pc, "name"), sparse = str(phases[j], "name");
    const Phase *a = nullptr, *b = nullptr;
    for (const Phase& p : run.phases) a = p.name == sparse ? &p : a, b = p.name == arm ? &p : b;
    if (!a || !b) continue;
    Chart c{"Quality A/B: " + sparse + " (dsa_sparse) against its dense control arm", "step within the phase",
            "LM loss (nats per token), EMA", true, false};
    for (const auto& [p, color] : {std::pair{a, "#d62728"}, std::pair{b, "#1f77b4"}}) {
      std::vector<double> x;
      for (size_t i = 0; i < p->lm.size(); ++i) x.push_back(double(i + 1));
      c.series.push_back({p->name + " (" + p->mode + ")", color, x, ema(p->lm, kEmaAlpha)});
    }
    c.note = "both arms from the same checkpoint over the same data; held-out loss: sparse " + fmt(a->heldout, 4) +
             ", dense " + fmt(b->heldout, 4) + ", difference (sparse - dense) " + fmt(a->heldout - b->heldout, 4);
    os << "<h2>Quality A/B</h2>\n" << render_svg(c) << "<p>" << xml_escape(c.note) << "</p>\n";
  }
  return os.str();
}

// One line per MoE layer: max / mean of the step's global expert load (docs/moe.md).
Chart imbalance_chart(const Run& run) {
  Chart c{"MoE load imbalance", "global step (all phases)", "max / mean expert load", true, false};
  c.markers = boundaries(run);
  size_t i = 0;
  for (const auto& [L, xy] : run.imbalance)
    c.series.push_back({"layer " + std::to_string(L), kColors[i++ % 7], xy.first, xy.second, ChartSeries::line});
  c.note = "1: every expert chose equally often; the correction bias (moe_bias_update_rate) pulls it down; "
           "dashed: a phase starts";
  return c;
}

// The multi-token-prediction loss (phases with mtp_loss_coeff > 0), or nothing in a run without one.
std::string mtp_chart(const Run& run) {
  for (const Phase& p : run.phases)
    if (std::any_of(p.mtp.begin(), p.mtp.end(), [](double v) { return std::isfinite(v); }))
      return render_svg(per_phase_chart(run, "MTP loss (phases with mtp_loss_coeff > 0)",
                                        "MTP loss (nats per token, mean over depths)", &Phase::mtp, true, false, false));
  return "";
}

// A small inline sparkline of v (the phase's tokens/s per step), at most 120 points (bucket means).
std::string sparkline(const std::vector<double>& raw) {
  const size_t per = (raw.size() + 119) / 120;
  std::vector<double> v;
  for (size_t i = 0; i < raw.size(); i += per) {
    const size_t end = std::min(raw.size(), i + per);
    const auto n = std::count_if(raw.begin() + i, raw.begin() + end, [](double x) { return std::isfinite(x); });
    double mean = 0;  // a sum of x / n, which cannot overflow as the sum of x can
    for (size_t j = i; j < end; ++j)
      if (std::isfinite(raw[j])) mean += raw[j] / double(n);
    v.push_back(n ? mean : std::nan(""));
  }
  double lo = INFINITY, hi = -INFINITY;
  for (double y : v)
    if (std::isfinite(y)) lo = std::min(lo, y), hi = std::max(hi, y);
  if (!(lo <= hi)) return "";
  const bool flat = indistinct(lo, hi);  // drawn at mid height
  std::ostringstream os, pts;
  const double W = 120, H = 24;
  for (size_t i = 0; i < v.size(); ++i)
    if (std::isfinite(v[i]))
      pts << W * double(i) / std::max<double>(double(v.size()) - 1, 1) << ","
          << H - 2 - (H - 4) * (flat ? 0.5 : unit_position(v[i], lo, hi)) << " ";
  os << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H << "' class='sparkline'>"
     << "<polyline fill='none' stroke='#1f77b4' stroke-width='1' points='" << pts.str() << "'/></svg>";
  return os.str();
}

std::string bar(double v, double max) {
  if (!std::isfinite(v) || !(max > 0)) return "";
  std::ostringstream os;
  os << "<svg xmlns='http://www.w3.org/2000/svg' width='100' height='12' class='bar'><rect width='"
     << std::max(1.0, 100 * std::clamp(v / max, 0.0, 1.0)) << "' height='12' fill='#9467bd'/></svg>";
  return os.str();
}

std::string phase_table(const Run& run) {
  double max_peak = 0;
  for (const Phase& p : run.phases)
    if (const double m = max_finite(p.peak); std::isfinite(m)) max_peak = std::max(max_peak, m);
  std::ostringstream os;
  os << "<h2>Phases</h2>\n<table class='phases'>\n<tr><th>phase</th><th>mode</th><th>steps</th><th>tokens/s (median)"
        "</th><th>tokens/s per step</th><th>peak MiB</th><th></th><th>loss (first 20)</th><th>loss (last 20)</th>"
        "<th>KL (last 20)</th><th>held-out loss</th><th>time (s)</th></tr>\n";
  for (const Phase& p : run.phases) {
    const double peak = max_finite(p.peak);
    const std::string unavailable = p.end && !p.end->heldout_unavailable.empty() ? p.end->heldout_unavailable : "not run";
    os << "<tr><td>" << xml_escape(p.name) << "</td><td>" << xml_escape(p.mode) << "</td><td>" << p.x.size()
       << (p.end ? "" : " (stopped)") << "</td><td>" << fmt(median(p.tps), 0) << "</td><td>" << sparkline(p.tps)
       << "</td><td>" << fmt(peak, 1, 1048576.0) << "</td><td>" << bar(peak, max_peak) << "</td><td>"
       << fmt(end_value(p, &MetricsRow::first20_lm_loss), 4) << "</td><td>"
       << fmt(end_value(p, &MetricsRow::last20_lm_loss), 4) << "</td><td>"
       << fmt(end_value(p, &MetricsRow::last20_indexer_kl), 4) << "</td><td>" << fmt(p.heldout, 4)
       << (std::isfinite(p.heldout) || !p.end ? "" : " (" + xml_escape(unavailable) + ")") << "</td><td>"
       << fmt(end_value(p, &MetricsRow::seconds), 1) << "</td></tr>\n";
  }
  return os.str() + "</table>\n";
}

std::string row(const std::string& k, const std::string& v) {
  return "<tr><th>" + xml_escape(k) + "</th><td>" + xml_escape(v) + "</td></tr>\n";
}

// Model geometry, parameter count, programme and environment.
std::string config_summary(const fs::path& dir, const json& programme, const json& marker) {
  std::ostringstream os;
  os << "<h2>Configuration</h2>\n<table class='config'>\n";
  const json cfg = read_json(dir / "config.json");
  if (cfg.is_object()) {
    auto g = [&](const char* k) { return cfg.contains(k) ? cfg[k].dump() : std::string("-"); };
    os << row("model", "hidden " + g("hidden_size") + ", layers " + g("num_hidden_layers") + ", heads " +
                           g("num_attention_heads") + ", q_lora_rank " + g("q_lora_rank") + ", kv_lora_rank " +
                           g("kv_lora_rank") + ", qk " + g("qk_nope_head_dim") + "+" + g("qk_rope_head_dim") + ", v " +
                           g("v_head_dim") + ", intermediate " + g("intermediate_size") + ", vocab " + g("vocab_size"))
       << row("indexer", "heads " + g("index_n_heads") + ", head dim " + g("index_head_dim") + ", top-k " +
                             g("index_topk"));
    try {
      const ModelConfig c = parse_model_config(cfg, "config.json");
      const int64_t backbone = table_numel(model_param_table(c, std::vector<bool>(c.num_hidden_layers, false)));
      os << row("parameters", std::to_string(backbone) + " (backbone) + " +
                                  std::to_string(table_numel(indexer_param_table(c))) + " per layer with an indexer");
    } catch (const std::exception& e) {
      os << row("parameters", std::string("- (") + e.what() + ")");
    }
  } else {
    os << row("model", "config.json is missing or unreadable");
  }
  if (programme.is_object()) {
    std::string ph;
    const json phases = programme.value("phases", json::array());
    for (const json& p : phases.is_array() ? phases : json::array()) {
      if (!p.is_object()) continue;
      ph += (ph.empty() ? "" : "; ") + str(p, "name") + " " + str(p, "mode") + " x " + p.value("steps", json()).dump() +
            " (" + str(p, "optimizer") + ", lr " + p.value("lr", json()).dump() + ", batch " + p.value("batch", json()).dump() +
            " x seq " + p.value("seq_len", json()).dump() + ")";
    }
    os << row("programme", str(marker, "programme", "?") + ", data " + str(programme, "data") + ", seed " +
                               programme.value("seed", json()).dump())
       << row("phases", ph);
  }
  const json env = marker.is_object() ? marker.value("environment", json()) : json();
  if (env.is_object())
    os << row("hmla", str(env, "hmla_version") + " (commit " + str(env, "commit") + ")")
       << row("device", str(env, "device") + ", " + env.value("threads", json()).dump() + " threads, " + str(env, "cpu_isa"))
       << row("BLAS", str(env, "blas") + "; kernels: " + str(env, "blas_core"));
  else
    os << row("environment", "not recorded (a run from before hmla recorded it in hmla-run.json)");
  const json tok = marker.is_object() ? marker.value("tokenizer", json()) : json();
  if (tok.is_object())
    os << row("tokenizer", str(tok, "describe") + "; vocab_size " + tok.value("vocab_size", json()).dump() + " (" +
                               str(tok, "fingerprint") + ")");
  return os.str() + "</table>\n";
}

std::string equivalence_note(const Run& run) {
  std::string out;
  for (const Phase& p : run.phases)
    if (std::isfinite(p.eq_diff)) {
      out = "<p class='equivalence'>Equivalence check (phase " + xml_escape(p.name) +
            "): the latent MQA form's logits differ from MHA's by at most " + sci(p.eq_diff) + " (largest |logit| " +
            sci(p.eq_logit) + ").</p>\n";
      break;
    }
  return out;
}

void write_run_report(const fs::path& dir, const fs::path& page) {
  const json programme = read_json(dir / "programme.json"), marker = read_json(dir / "hmla-run.json");
  const Run run = read_run(dir / "metrics.jsonl", programme);
  std::ostringstream html;
  html << "<!DOCTYPE html>\n<html><head><meta charset='utf-8'/><title>hmla run " << xml_escape(dir.filename().string())
       << "</title>" << kStyle << "</head><body>\n<h1>hmla run: " << xml_escape(dir.string()) << "</h1>\n"
       << config_summary(dir, programme, marker) << "<h2>Training curves</h2>\n"
       << render_svg(per_phase_chart(run, "LM loss", "LM loss (nats per token)", &Phase::lm, true, true, false))
       << equivalence_note(run)
       << render_svg(per_phase_chart(run, "Indexer KL (dsa phases)", "KL(attention || indexer), log scale", &Phase::kl,
                                     true, false, true))
       << mtp_chart(run)
       << render_svg(per_phase_chart(run, "Learning rate", "learning rate", &Phase::lr, false, false, false))
       << render_svg(grad_norm_chart(run)) << (run.imbalance.empty() ? "" : render_svg(imbalance_chart(run)));
  const bool kinds = std::any_of(run.phases.begin(), run.phases.end(),
                                 [](const Phase& p) { return any_finite(p.kl_csa) || any_finite(p.kl_hybrid); });
  if (kinds) html << render_svg(kl_kind_chart(run));
  for (size_t k = 0; k < 3; ++k) html << mass_chart(run, k);
  html << phase_table(run) << control_sections(run, programme) << "</body></html>\n";
  io::write_file_atomic(page.string(), html.str());
  std::cout << "wrote " << page.string() << "\n";
  if (run.skipped > 0) std::cerr << "hmla: note: skipped " << run.skipped << " malformed line(s) of metrics.jsonl\n";
}

}  // namespace

void add_report_command(CLI::App& app) {
  struct Opts {
    std::string dir, bench, out;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* rep = app.add_subcommand(
      "report", "Write RUN_DIR/report.html (configuration, loss/KL/lr/gradient-norm plots, phase table), or with "
                "--bench BENCH.jsonl --out DIR the bench plots as DIR/*.svg and DIR/bench.html.");
  rep->add_option("run_dir", o->dir, "run directory of hmla train")->check(CLI::ExistingDirectory);
  rep->add_option("--bench", o->bench, "JSON lines of hmla bench ... --json")->check(CLI::ExistingFile);
  rep->add_option("--out", o->out, "with --bench: the directory to write the plots to; with RUN_DIR: the page to write "
                                   "(default RUN_DIR/report.html, written only into a run directory)");
  rep->callback([o] {
    HMLA_CHECK(o->dir.empty() != o->bench.empty(), ConfigError,
               "hmla report: give either RUN_DIR or --bench BENCH.jsonl --out DIR");
    if (!o->bench.empty()) {
      HMLA_CHECK(!o->out.empty(), ConfigError, "hmla report --bench: --out DIR is required");
      write_bench_report(o->bench, o->out);
    } else {
      HMLA_CHECK(fs::exists(fs::path(o->dir) / "metrics.jsonl"), IoError, o->dir,
                 ": no metrics.jsonl; is it a run directory of hmla train?");
      // RUN_DIR/report.html is the run's own file; in any other directory it may be the user's.
      HMLA_CHECK(!o->out.empty() || is_run_directory(o->dir), IoError, o->dir, ": not an hmla run directory (no ",
                 kRunMarker, "), so its report.html may not be hmla's to replace; write the page elsewhere with "
                 "--out FILE.html (nothing was written)");
      const fs::path page = o->out.empty() ? fs::path(o->dir) / "report.html" : fs::path(o->out);
      io::check_output_file(page.string(), o->out.empty() ? "" : "--out");
      write_run_report(o->dir, page);
    }
  });
}

}  // namespace hmla::app
