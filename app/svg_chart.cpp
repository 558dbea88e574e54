#include "svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
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

std::vector<double> nice_ticks(double lo, double hi, int target, bool integer) {
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / std::max(target, 1);
  const double e = std::pow(10.0, std::floor(std::log10(raw)));
  double step = e;
  for (double f : {1.0, 2.0, 5.0, 10.0})
    if (f * e >= raw) {
      step = f * e;
      break;
    }
  if (integer) step = std::max(1.0, std::round(step));
  std::vector<double> t;
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step)
    t.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  return t;
}

std::vector<double> log_ticks(double lo, double hi) {
  std::vector<double> t;
  const int k0 = int(std::floor(std::log10(lo))), k1 = int(std::ceil(std::log10(hi)));
  const bool dense = k1 - k0 <= 3;  // a short range: 1, 2, 5 in each decade
  for (int k = k0; k <= k1; ++k)
    for (double f : dense ? std::vector<double>{1, 2, 5} : std::vector<double>{1}) {
      const double v = f * std::pow(10.0, k);
      if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) t.push_back(v);
    }
  return t;
}

std::string tick_label(double v, double spacing, bool log) {
  char buf[32];
  if (log) {
    if (v > 0 && (v >= 1e5 || v < 1e-3)) {  // "1e6", "2e-4": log ticks are 1, 2 or 5 x 10^k
      const int k = int(std::floor(std::log10(v) + 1e-9));
      std::snprintf(buf, sizeof buf, "%de%d", int(std::lround(v / std::pow(10.0, k))), k);
      return buf;
    }
    spacing = std::pow(10.0, std::floor(std::log10(std::abs(v))));
  }
  const int decimals = spacing > 0 ? std::max(0, int(std::ceil(-std::log10(spacing) - 1e-9))) : 0;
  std::snprintf(buf, sizeof buf, "%.*f", std::min(decimals, 6), v);
  return buf;
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

// Ticks and the axis range they span (the data range widened to whole ticks on a linear axis).
struct Axis {
  bool log;
  double lo, hi;
  std::vector<double> ticks;
  double map(double v, double a, double b) const {  // v -> [a, b]
    const double t = log ? (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo)) : (v - lo) / (hi - lo);
    return a + t * (b - a);
  }
};

Axis make_axis(Range r, bool log, bool integer, int target) {
  if (log) {
    if (r.hi == r.lo) r.lo /= 2, r.hi *= 2;
    Axis a{true, r.lo, r.hi, log_ticks(r.lo, r.hi)};
    if (a.ticks.size() < 2) {  // within one 1-2-5 step: widen to the neighbouring decade marks
      a.lo = std::pow(10.0, std::floor(std::log10(r.lo)));
      a.hi = std::pow(10.0, std::ceil(std::log10(r.hi)));
      if (a.hi == a.lo) a.hi *= 10;
      a.ticks = log_ticks(a.lo, a.hi);
    }
    return a;
  }
  if (r.hi == r.lo) r.lo -= integer ? 1 : std::max(std::abs(r.lo) * 0.1, 1e-3), r.hi += integer ? 1 : std::max(std::abs(r.hi) * 0.1, 1e-3);
  std::vector<double> t = nice_ticks(r.lo, r.hi, target, integer);
  const double step = t.size() > 1 ? t[1] - t[0] : 1;
  Axis a{false, std::min(r.lo, t.front()), std::max(r.hi, t.back()), {}};
  if (t.front() > r.lo) a.lo = t.front() - step;
  if (t.back() < r.hi) a.hi = t.back() + step;
  a.ticks = nice_ticks(a.lo, a.hi, target, integer);
  return a;
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
  Axis ax = make_axis(xr, c.x_log, c.x_integer, 8);
  const Axis ay = make_axis(yr, c.y_log, false, 5);
  if (!c.x_ticks.empty()) {  // exactly these, the axis spanning them and the data
    ax.ticks = c.x_ticks;
    ax.lo = std::min(xr.lo, *std::min_element(c.x_ticks.begin(), c.x_ticks.end()));
    ax.hi = std::max(xr.hi, *std::max_element(c.x_ticks.begin(), c.x_ticks.end()));
    if (ax.hi == ax.lo) ax.lo = c.x_log ? ax.lo / 2 : ax.lo - 1, ax.hi = c.x_log ? ax.hi * 2 : ax.hi + 1;
  }
  auto X = [&](double v) { return ax.map(v, px0, px1); };
  auto Y = [&](double v) { return ay.map(v, py0, py1); };
  // Grid, ticks and axis titles.
  os << "<g class='axes' stroke='#ddd'>\n";
  for (double t : ay.ticks) os << "<line x1='" << px0 << "' x2='" << px1 << "' y1='" << Y(t) << "' y2='" << Y(t) << "'/>\n";
  os << "</g>\n<rect x='" << px0 << "' y='" << py1 << "' width='" << px1 - px0 << "' height='" << py0 - py1
     << "' fill='none' stroke='#888'/>\n";
  const double xs = !c.x_ticks.empty() ? 1 : ax.ticks.size() > 1 ? ax.ticks[1] - ax.ticks[0] : 1, ys = ay.ticks.size() > 1 ? ay.ticks[1] - ay.ticks[0] : 1;
  for (double t : ax.ticks)
    os << "<line x1='" << X(t) << "' x2='" << X(t) << "' y1='" << py0 << "' y2='" << py0 + 4 << "' stroke='#888'/>"
       << "<text class='tick' x='" << X(t) << "' y='" << py0 + 16 << "' text-anchor='middle'>" << tick_label(t, xs, c.x_log)
       << "</text>\n";
  for (double t : ay.ticks)
    os << "<text class='tick' x='" << px0 - 6 << "' y='" << Y(t) + 4 << "' text-anchor='end'>" << tick_label(t, ys, c.y_log)
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
  // Series: polylines broken at gaps, or point markers.
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
    if (!s.name.empty()) {
      const double ly = py1 + 8 + 16 * legend++;
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
