// Standalone SVG line charts for `hmla report` (svg_chart.h): nice 1-2-5 ticks (linear or log10),
// raw and smoothed series, markers and a legend; non-finite values are gaps.
#include "svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <sstream>

namespace hmla::app {

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '\'': out += "&#39;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

namespace {

constexpr double kMax = std::numeric_limits<double>::max();

double half_span(double lo, double hi) { return hi / 2 - lo / 2; }  // (hi - lo) / 2, never overflowing

// The smallest step of 1, 2 or 5 x 10^k at least `raw` (> 0, finite); 1e308 where that overflows.
double nice_step(double raw) {
  const double e = std::pow(10.0, std::floor(std::log10(raw)));
  for (double f : {1.0, 2.0, 5.0, 10.0})
    if (f * e >= raw) return std::isfinite(f * e) ? f * e : e;
  return e;
}

}  // namespace

double unit_position(double v, double lo, double hi) {
  const double span = half_span(lo, hi);
  if (!(span > 0) || !std::isfinite(span) || !std::isfinite(v)) return 0.5;
  return std::clamp((v / 2 - lo / 2) / span, 0.0, 1.0);
}

bool indistinct(double lo, double hi) {
  const double mag = std::max(std::abs(lo), std::abs(hi));
  return !(half_span(lo, hi) > std::max(mag * 1e-12, 1e-290) / 2);
}

std::vector<double> nice_ticks(double lo, double hi, int target, bool integer) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) return {};
  if (indistinct(lo, hi)) return {lo};  // below 1e-12 of lo a step is lost in lo's rounding
  target = std::clamp(target, 1, kMaxTicks - 2);
  const double raw = std::min(half_span(lo, hi) / target, kMax / 2) * 2;  // (hi - lo) / target
  double step = nice_step(raw);
  if (integer) step = std::max(1.0, std::round(step));
  if (!(step > 0) || !std::isfinite(step)) return {lo};
  // Multiples of the step by index, not by adding it up: a step below lo's ulp would never move
  // the sum (the hang of a range 1 ulp wide), and the count is capped whatever the rounding.
  const double slack = step * 1e-9;
  std::vector<double> t;
  for (double k = std::ceil(lo / step - 1e-9); t.size() < size_t(kMaxTicks); ++k) {
    const double v = k * step;
    if (!(v <= hi + slack) || !std::isfinite(v)) break;  // hi + slack overflows at DBL_MAX
    if (v >= lo - slack) t.push_back(k == 0 ? 0.0 : v);
  }
  if (t.empty()) t.push_back(lo);
  return t;
}

std::vector<double> log_ticks(double lo, double hi) {
  if (!(lo > 0) || !(hi >= lo) || !std::isfinite(hi)) return {};
  // Decades k with 10^k a positive finite double: 1e-323 (a denormal) to 1e308.
  const int k0 = std::max(-323, int(std::floor(std::log10(lo)))), k1 = std::min(308, int(std::ceil(std::log10(hi))));
  const bool dense = k1 - k0 <= 3;  // a short range: 1, 2, 5 in each decade
  const int every = std::max(1, (k1 - k0 + 11) / 12);  // a long one: about 12 decade marks
  std::vector<double> t;
  for (int k = k0; k <= k1 && t.size() < size_t(kMaxTicks); ++k) {
    if (((k % every) + every) % every != 0) continue;
    for (double f : dense ? std::vector<double>{1, 2, 5} : std::vector<double>{1}) {
      const double v = f * std::pow(10.0, k);
      if (std::isfinite(v) && v > 0 && v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) t.push_back(v);
    }
  }
  return t;
}

namespace {

// "%.*e" without trailing mantissa zeros, the plus sign and leading exponent zeros: "1.5e308",
// "1e308", "2e-7".
std::string scientific(double v, int digits) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*e", std::clamp(digits, 0, 16), v);
  const std::string s = buf;
  const size_t e = s.find('e');
  std::string mantissa = s.substr(0, e);
  if (mantissa.find('.') != std::string::npos) {
    while (mantissa.back() == '0') mantissa.pop_back();
    if (mantissa.back() == '.') mantissa.pop_back();
  }
  size_t d = e + 2;
  while (d + 1 < s.size() && s[d] == '0') ++d;
  return mantissa + (s[e + 1] == '-' ? "e-" : "e") + s.substr(d);
}

}  // namespace

std::string tick_label(double v, double spacing, bool log) {
  if (!std::isfinite(v)) return "?";
  if (v == 0) return "0";
  if (log && v > 0) {
    // "1e6", "2e-4": a 1-2-5 log tick beyond [1e-3, 1e5) (a given tick that is not one, e.g.
    // s = 131072, is written out; a denormal's mantissa is not exact, so it is rounded below)
    const std::string s = scientific(v, 9);
    if ((v >= 1e5 || v < 1e-3) && s.find('.') == std::string::npos) return s;
    spacing = v;
  }
  const double lg = spacing > 0 && std::isfinite(spacing) ? std::floor(std::log10(spacing) + 1e-9) : 0;
  const int decimals = std::max(0, int(-lg));
  if (decimals <= 6 && std::abs(v) < 1e15) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
    return buf;
  }
  // The digits after the mantissa's point that tell neighbouring ticks apart.
  return scientific(v, int(std::floor(std::log10(std::max(std::abs(v), spacing)))) - int(lg));
}

std::vector<double> ema(const std::vector<double>& y, double alpha) {
  std::vector<double> out(y.size(), std::nan(""));
  double avg = 0, weight = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (!std::isfinite(y[i])) continue;
    avg = (1 - alpha) * avg + alpha * y[i];
    weight = (1 - alpha) * weight + alpha;
    out[i] = avg / weight;
  }
  return out;
}

namespace {

struct Range {
  double lo = INFINITY, hi = -INFINITY;
  void add(double v) { lo = std::min(lo, v), hi = std::max(hi, v); }
  bool empty() const { return !(lo <= hi); }
};

bool usable(double v, bool log) { return std::isfinite(v) && (!log || v > 0); }

// An axis: its range in axis units (the value, or log10 of it on a log axis; lo < hi) and its
// ticks (values).
struct Axis {
  bool log;
  double lo, hi;
  std::vector<double> ticks;
  double spacing = 1;  // between neighbouring ticks, for their labels' decimals
  double map(double v, double a, double b) const {  // v -> [a, b]
    return a + unit_position(log ? std::log10(v) : v, lo, hi) * (b - a);
  }
};

// The data range in axis units, drawable: a constant, or a range indistinct from one, is widened
// around itself (within the finite doubles), so that every axis spans a proper range.
Range drawable(Range r, bool log, bool integer) {
  if (log) {
    r = {std::log10(r.lo), std::log10(r.hi)};  // finite for every positive finite double
    if (r.hi - r.lo < 1e-9) r.lo -= std::log10(2.0), r.hi += std::log10(2.0);  // a factor of 2 each way
    return r;
  }
  if (integer) r = {std::floor(r.lo), std::ceil(r.hi)};
  if (!indistinct(r.lo, r.hi)) return r;
  const double mag = std::max(std::abs(r.lo), std::abs(r.hi));
  const double w = integer ? std::max(1.0, mag * 1e-9) : std::max(mag * 0.1, 1e-3);
  return {std::max(r.lo - w, -kMax), std::min(r.hi + w, kMax)};
}

// 10^u for an axis bound, within the positive finite doubles (a widened bound may lie beyond).
double axis_value(double u) {
  return std::clamp(std::pow(10.0, u), std::numeric_limits<double>::denorm_min(), kMax);
}

Axis log_axis(Range data) {
  Range r = drawable(data, true, false);
  std::vector<double> t = log_ticks(axis_value(r.lo), axis_value(r.hi));
  if (t.size() < 2) {  // within one 1-2-5 step: widen to the neighbouring decade marks
    r = {std::floor(r.lo), std::ceil(r.hi)};
    if (r.hi == r.lo) r.hi += 1;
    t = log_ticks(axis_value(r.lo), axis_value(r.hi));
  }
  for (double v : t) r.add(std::log10(v));
  return {true, r.lo, r.hi, t};
}

// The data range widened to whole ticks.
Axis linear_axis(Range data, bool integer, int target) {
  const Range r = drawable(data, false, integer);
  std::vector<double> t = nice_ticks(r.lo, r.hi, target, integer);
  Range a = r;
  if (t.size() > 1) {
    const double step = t[1] - t[0];
    if (t.front() > r.lo) a.lo = std::max(t.front() - step, -kMax);
    if (t.back() < r.hi) a.hi = std::min(t.back() + step, kMax);
  }
  t = nice_ticks(a.lo, a.hi, target, integer);
  for (double v : t) a.add(v);
  return {false, a.lo, a.hi, t, t.size() > 1 ? t[1] - t[0] : 1};
}

// Exactly the given ticks (those the axis can show, thinned to kMaxTicks), the axis spanning them
// and the data; nullopt when none is usable.
std::optional<Axis> given_axis(Range data, const std::vector<double>& given, bool log) {
  std::vector<double> t;
  for (double v : given)
    if (usable(v, log)) t.push_back(v);
  if (t.empty()) return std::nullopt;
  if (t.size() > size_t(kMaxTicks)) {
    const size_t every = (t.size() + kMaxTicks - 1) / kMaxTicks;
    std::vector<double> kept;
    for (size_t i = 0; i < t.size(); i += every) kept.push_back(t[i]);
    t = std::move(kept);
  }
  double spacing = INFINITY;  // the smallest gap (given ticks need not be evenly spaced)
  for (size_t i = 1; i < t.size(); ++i)
    if (t[i] != t[i - 1]) spacing = std::min(spacing, std::abs(half_span(t[i - 1], t[i])) * 2);
  for (double v : t) data.add(v);
  const Range r = drawable(data, log, false);
  return Axis{log, r.lo, r.hi, t, std::isfinite(spacing) ? spacing : 1};
}

Axis make_axis(Range data, bool log, bool integer, int target, const std::vector<double>& given = {}) {
  if (std::optional<Axis> a = given_axis(data, given, log)) return *a;
  return log ? log_axis(data) : linear_axis(data, integer, target);
}

}  // namespace

std::string render_svg(const Chart& c) {
  const double W = c.width, H = c.height, L = 70, R = 210, T = 34, B = c.note.empty() ? 48 : 64;
  const double px0 = L, px1 = W - R, py0 = H - B, py1 = T;  // plot area: x left..right, y bottom..top
  std::ostringstream os;
  os << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H << "' viewBox='0 0 " << W << " "
     << H << "' font-family='sans-serif' font-size='12'>\n<title>" << xml_escape(c.title) << "</title>\n"
     << "<rect width='" << W << "' height='" << H << "' fill='white'/>\n<text x='" << W / 2 << "' y='18' text-anchor='middle' "
     << "font-size='14' font-weight='bold' class='chart-title'>" << xml_escape(c.title) << "</text>\n";
  Range xr, yr;
  for (const ChartSeries& s : c.series)
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
      if (usable(s.x[i], c.x_log) && usable(s.y[i], c.y_log)) xr.add(s.x[i]), yr.add(s.y[i]);
  if (xr.empty()) return os.str() + "<text x='" + std::to_string(int(W / 2)) + "' y='" + std::to_string(int(H / 2)) +
                         "' text-anchor='middle' class='no-data'>no data</text>\n</svg>\n";
  for (const ChartMarker& m : c.markers)
    if (usable(m.x, c.x_log)) xr.add(m.x);
  const Axis ax = make_axis(xr, c.x_log, c.x_integer, 8, c.x_ticks);
  const Axis ay = make_axis(yr, c.y_log, false, 5);
  auto X = [&](double v) { return ax.map(v, px0, px1); };
  auto Y = [&](double v) { return ay.map(v, py0, py1); };
  // Grid, ticks and axis titles.
  os << "<g class='axes' stroke='#ddd'>\n";
  for (double t : ay.ticks) os << "<line x1='" << px0 << "' x2='" << px1 << "' y1='" << Y(t) << "' y2='" << Y(t) << "'/>\n";
  os << "</g>\n<rect x='" << px0 << "' y='" << py1 << "' width='" << px1 - px0 << "' height='" << py0 - py1
     << "' fill='none' stroke='#888'/>\n";
  for (double t : ax.ticks)
    os << "<line x1='" << X(t) << "' x2='" << X(t) << "' y1='" << py0 << "' y2='" << py0 + 4 << "' stroke='#888'/>"
       << "<text class='tick' x='" << X(t) << "' y='" << py0 + 16 << "' text-anchor='middle'>" << tick_label(t, ax.spacing, c.x_log)
       << "</text>\n";
  for (double t : ay.ticks)
    os << "<text class='tick' x='" << px0 - 6 << "' y='" << Y(t) + 4 << "' text-anchor='end'>" << tick_label(t, ay.spacing, c.y_log)
       << "</text>\n";
  os << "<text class='x-title' x='" << (px0 + px1) / 2 << "' y='" << py0 + 34 << "' text-anchor='middle'>"
     << xml_escape(c.x_title) << "</text>\n<text class='y-title' transform='translate(16," << (py0 + py1) / 2
     << ") rotate(-90)' text-anchor='middle'>" << xml_escape(c.y_title) << "</text>\n";
  if (!c.note.empty())
    os << "<text class='note' x='" << px0 << "' y='" << H - 8 << "' fill='#555' font-size='11'>" << xml_escape(c.note)
       << "</text>\n";
  // Markers (phase boundaries), labels staggered so that neighbours do not overwrite each other.
  int k = 0;
  for (const ChartMarker& m : c.markers) {
    if (!usable(m.x, c.x_log)) continue;
    os << "<g class='marker'><line x1='" << X(m.x) << "' x2='" << X(m.x) << "' y1='" << py0 << "' y2='" << py1
       << "' stroke='#444' stroke-dasharray='4 3'/><text x='" << X(m.x) + 3 << "' y='" << py1 + 12 + 12 * (k++ % 3)
       << "' font-size='11' fill='#222'>" << xml_escape(m.label) << "</text></g>\n";
  }
  // Series: polylines broken at gaps, or point markers. The legend takes the rows that fit beside
  // the plot; the last one says how many more series there are.
  const int legend_rows = std::max(1, int((py0 - py1 - 8) / 16) + 1);
  const int named =
      int(std::count_if(c.series.begin(), c.series.end(), [](const ChartSeries& s) { return !s.name.empty(); }));
  int legend = 0;
  for (const ChartSeries& s : c.series) {
    const bool faint = s.style == ChartSeries::faint;
    os << "<g class='series' stroke='" << s.color << "' fill='" << s.color << "'>\n";
    if (s.style == ChartSeries::points) {
      for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
        if (usable(s.x[i], c.x_log) && usable(s.y[i], c.y_log))
          os << "<circle cx='" << X(s.x[i]) << "' cy='" << Y(s.y[i]) << "' r='4' stroke='black' stroke-width='0.8'/>\n";
    } else {
      std::ostringstream pts;
      int n = 0;
      double px = 0, py = 0;  // the run's last point (a run of one is drawn as a dot)
      auto flush = [&] {
        if (n > 1)
          os << "<polyline fill='none' stroke-width='" << (faint ? 0.8 : 1.8) << "' stroke-opacity='"
             << (faint ? 0.3 : 1.0) << "' points='" << pts.str() << "'/>\n";
        else if (n == 1)
          os << "<circle cx='" << px << "' cy='" << py << "' r='1.5'/>\n";
        pts.str(""), n = 0;
      };
      for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
        if (!usable(s.x[i], c.x_log) || !usable(s.y[i], c.y_log)) {
          flush();
          continue;
        }
        px = X(s.x[i]), py = Y(s.y[i]);
        pts << (n++ ? " " : "") << px << "," << py;
      }
      flush();
    }
    os << "</g>\n";
    if (!s.name.empty() && legend < legend_rows) {
      const double ly = py1 + 8 + 16 * legend++;
      if (legend == legend_rows && named > legend_rows) {
        os << "<g class='legend'><text x='" << px1 + 12 << "' y='" << ly + 4 << "'>(" << named - legend_rows + 1
           << " more series)</text></g>\n";
        continue;
      }
      os << "<g class='legend'>";
      if (s.style == ChartSeries::points)
        os << "<circle cx='" << px1 + 20 << "' cy='" << ly << "' r='4' fill='" << s.color << "' stroke='black' stroke-width='0.8'/>";
      else
        os << "<line x1='" << px1 + 12 << "' x2='" << px1 + 28 << "' y1='" << ly << "' y2='" << ly << "' stroke='" << s.color
           << "' stroke-width='2'/>";
      os << "<text x='" << px1 + 34 << "' y='" << ly + 4 << "'>" << xml_escape(s.name) << "</text></g>\n";
    }
  }
  return os.str() + "</svg>\n";
}

}  // namespace hmla::app
