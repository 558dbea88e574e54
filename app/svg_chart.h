// Line charts as standalone SVG (no scripts, no external fonts), for `hmla report`: axis titles,
// "nice" 1-2-5 ticks (linear or log10), several series (faint raw lines, bold smoothed ones,
// point markers), labelled vertical markers (phase boundaries) and a legend. Non-finite values
// are gaps, never a crash; an empty chart says "no data". Any finite range draws (-DBL_MAX to
// DBL_MAX, denormals): spans are taken in halves, a range indistinct from a constant (1 ulp) is
// drawn as one, no axis has more than kMaxTicks ticks, and every coordinate lies in the viewport.
#pragma once
#include <string>
#include <vector>

namespace hmla::app {

struct ChartSeries {
  std::string name;   // legend entry ("" = not in the legend)
  std::string color;  // CSS color
  std::vector<double> x, y;
  enum Style { line, faint, points } style = line;
};

struct ChartMarker {  // a vertical line at x with a label at its top
  double x;
  std::string label;
};

struct Chart {
  std::string title, x_title, y_title;
  bool x_integer = false;  // integer ticks (steps)
  bool y_log = false;      // log10 y axis; values <= 0 are gaps
  bool x_log = false;      // log10 x axis
  std::vector<ChartSeries> series = {};
  std::vector<ChartMarker> markers = {};
  std::string note = {};  // one line under the plot (e.g. the smoothing used)
  std::vector<double> x_ticks = {};  // given x ticks (e.g. the measured lengths), else nice ones
  double width = 860, height = 300;
};

// The chart as an <svg> element (well-formed XML).
std::string render_svg(const Chart& c);

// The most ticks an axis gets, whatever its range (given x ticks are thinned to it).
inline constexpr int kMaxTicks = 32;

// Tick positions: multiples of 1, 2 or 5 x 10^k in [lo, hi] with about `target` ticks (integers
// only when `integer`), or on a log axis (0 < lo <= hi) the powers of ten (1-2-5 within a short
// range, every m-th decade within a long one). At most kMaxTicks, all finite, for any input; an
// indistinct range (below) gives {lo}.
std::vector<double> nice_ticks(double lo, double hi, int target, bool integer);
std::vector<double> log_ticks(double lo, double hi);
// A tick label: as few decimals as the tick spacing needs ("0.5", "1200"), scientific
// ("1.0002e-3", "-1.5e308") where that would take more than 6 decimals or 15 digits; log ticks
// "1e-4".."1e6" beyond [1e-3, 1e5).
std::string tick_label(double v, double spacing, bool log);

// (v - lo) / (hi - lo) clamped to [0, 1], taken in halves so that it stays finite for any
// finite lo < hi (hi - lo overflows for -1e308..1e308); 0.5 when the range is empty or v is not
// finite. Every position a chart draws goes through it.
double unit_position(double v, double lo, double hi);
// True when [lo, hi] is too narrow to draw apart from a constant: values 1 ulp apart, closer
// than 1e-12 of their magnitude, or closer than 1e-290 (where a tick step would be denormal).
// Such a range is drawn as the constant it is.
bool indistinct(double lo, double hi);

// Exponential moving average with weight alpha on the new value, bias-corrected at the start
// (TensorBoard's smoothing); a non-finite value leaves the average unchanged and stays a gap.
std::vector<double> ema(const std::vector<double>& y, double alpha);

// Escapes &, <, >, ' and " for XML text and attributes.
std::string xml_escape(const std::string& s);

}  // namespace hmla::app
