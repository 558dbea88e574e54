// `hmla report`'s charts (app/svg_chart.h) over the whole double range: the ranges that crashed or
// hung (+-1e308, values 1 ulp apart), then a fuzz of values drawn from every part of the range
// (random bit patterns, +-DBL_MAX, denormals, zeros, equal and ulp-close values). Each chart must
// finish, keep every axis within kMaxTicks ticks and put every coordinate it writes, finite,
// inside its viewport. HMLA_FUZZ_ITERS sets the iterations (default 200; the `fuzz` label 20000).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <sstream>
#include <regex>

#include "svg_chart.h"

namespace hmla::app {
namespace {

constexpr double kMax = std::numeric_limits<double>::max();

int iters() {
  const char* e = std::getenv("HMLA_FUZZ_ITERS");
  return e ? std::max(1, std::atoi(e)) : 200;
}

// Every coordinate attribute (and polyline point, and translate()) is a finite number inside
// [0, width] or [0, height]; at most kMaxTicks tick labels per axis, each short and a number.
void expect_in_viewport(const std::string& svg, const Chart& c, const std::string& what) {
  static const std::regex attr(R"re( (x|x1|x2|cx|width|y|y1|y2|cy|height|r)='([^']*)')re");
  static const std::regex points(R"re(points='([^']*)')re"), translate(R"re(translate\(([^,]*),([^)]*)\))re");
  auto check = [&](const std::string& name, const std::string& text, double limit) {
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    EXPECT_TRUE(end != text.c_str() && *end == '\0' && std::isfinite(v) && v >= 0 && v <= limit)
        << what << ": " << name << "='" << text << "' outside [0, " << limit << "]";
  };
  for (std::sregex_iterator it(svg.begin(), svg.end(), attr), e; it != e; ++it) {
    const std::string name = (*it)[1];
    const bool horizontal = name[0] == 'x' || name == "cx" || name == "width" || name == "r";
    check(name, (*it)[2], horizontal ? c.width : c.height);
  }
  for (std::sregex_iterator it(svg.begin(), svg.end(), points), e; it != e; ++it) {
    std::istringstream in((*it)[1].str());
    std::string pair;
    while (in >> pair) {
      const size_t comma = pair.find(',');
      ASSERT_NE(comma, std::string::npos) << what << ": point " << pair;
      check("points x", pair.substr(0, comma), c.width);
      check("points y", pair.substr(comma + 1), c.height);
    }
  }
  for (std::sregex_iterator it(svg.begin(), svg.end(), translate), e; it != e; ++it)
    check("translate x", (*it)[1], c.width), check("translate y", (*it)[2], c.height);
  static const std::regex tick(R"re(class='tick' x='[^']*' y='[^']*' text-anchor='(middle|end)'>([^<]*)<)re");
  int x_ticks = 0, y_ticks = 0;
  static const std::regex label(R"re(-?\d+(\.\d+)?(e-?\d+)?)re");
  for (std::sregex_iterator it(svg.begin(), svg.end(), tick), e; it != e; ++it) {
    ++((*it)[1] == "middle" ? x_ticks : y_ticks);
    const std::string text = (*it)[2];
    EXPECT_TRUE(text.size() <= 24 && std::regex_match(text, label)) << what << ": tick label '" << text << "'";
  }
  EXPECT_LE(x_ticks, kMaxTicks) << what;
  EXPECT_LE(y_ticks, kMaxTicks) << what;
}

Chart one_series(std::vector<double> x, std::vector<double> y, bool y_log = false) {
  Chart c{"t", "x", "y", true, y_log};
  c.series.push_back({"s", "#000", std::move(x), std::move(y), ChartSeries::line});
  c.series.push_back({"", "#000", c.series[0].x, ema(c.series[0].y, 0.1), ChartSeries::faint});
  return c;
}

// The reproductions of issue 24: a segfault (the ticks of an overflowing span were empty) and a
// hang growing until out of memory (a step below the values' ulp never advanced the tick loop).
TEST(Chart, WholeDoubleRangeAndUlpCloseValues) {
  const double five_ulp = std::nextafter(5.0, 6.0), lr = 1e-3, lr_ulp = std::nextafter(1e-3, 1.0);
  const std::vector<std::pair<double, double>> cases = {
      {1e308, -1e308}, {kMax, -kMax}, {5.0, five_ulp}, {lr, lr_ulp}, {kMax, kMax}, {-kMax, -kMax},
      {4.9e-324, 0.0}, {4.9e-324, 9.9e-324}, {0.0, 0.0}, {1e-300, 2e-300}};
  for (const auto& [a, b] : cases) {
    std::ostringstream what_os;
    what_os << a << ", " << b;
    const std::string what = what_os.str();
    const Chart c = one_series({1, 2}, {a, b});
    const std::string svg = render_svg(c);
    expect_in_viewport(svg, c, what);
    EXPECT_NE(svg.find("<polyline"), std::string::npos) << what;  // both points drawn
    EXPECT_EQ(svg.find("no data"), std::string::npos) << what;
    if (a > 0 && b > 0) {
      const Chart l = one_series({1, 2}, {a, b}, true);
      expect_in_viewport(render_svg(l), l, what + " (log)");
    }
  }
  // More series than legend rows: the legend stays beside the plot.
  Chart many = one_series({1, 2}, {1, 2});
  for (int i = 0; i < 40; ++i) many.series.push_back({std::to_string(i), "#000", {1, 2}, {3, 4 + double(i)}});
  const std::string svg = render_svg(many);
  expect_in_viewport(svg, many, "40 series");
  EXPECT_NE(svg.find(" more series)"), std::string::npos);
  // The x range too (bench plots: s on a log axis, given ticks).
  Chart b{"b", "s", "gflops", false, false, true};
  b.series.push_back({"g", "#000", {1e308, kMax}, {1e308, -1e308}, ChartSeries::line});
  b.x_ticks = {1e308, kMax};
  expect_in_viewport(render_svg(b), b, "bench");
  EXPECT_LE(nice_ticks(5.0, five_ulp, 5, false).size(), 1u);
  EXPECT_LE(nice_ticks(-kMax, kMax, 5, false).size(), size_t(kMaxTicks));
  EXPECT_GE(nice_ticks(-kMax, kMax, 5, false).size(), 3u);
  EXPECT_LE(log_ticks(4.9e-324, kMax).size(), size_t(kMaxTicks));
}

TEST(Chart, TickLabels) {
  EXPECT_EQ(tick_label(0.5, 0.5, false), "0.5");
  EXPECT_EQ(tick_label(1200, 200, false), "1200");
  EXPECT_EQ(tick_label(1e-4, 0, true), "1e-4");
  EXPECT_EQ(tick_label(2e6, 0, true), "2e6");
  EXPECT_EQ(tick_label(0.002, 0, true), "0.002");
  EXPECT_EQ(tick_label(131072, 1, true), "131072");  // a measured s, not "1e5"
  EXPECT_EQ(tick_label(-1.5e308, 5e307, false), "-1.5e308");
  EXPECT_EQ(tick_label(1e308, 5e307, false), "1e308");
  EXPECT_EQ(tick_label(1.0002e-3, 2e-7, false), "1.0002e-3");
  EXPECT_EQ(tick_label(0, 2e-7, false), "0");
}

// A value from anywhere in the double range, often equal or 1 to 3 ulps from `anchor`.
double wild(std::mt19937_64& rng, double anchor) {
  const double sign = rng() % 2 ? 1 : -1;
  switch (rng() % 11) {
    case 0: return std::bit_cast<double>(uint64_t(rng()));  // anything, NaN and inf included (gaps)
    case 1: return sign * (rng() % 2 ? kMax : 1e308);
    case 2: return sign * std::bit_cast<double>(uint64_t(rng() % (uint64_t(1) << 52)));  // a denormal
    case 3: return sign * 0.0;
    case 4: return anchor;
    case 5: {
      double v = anchor;
      for (int k = int(rng() % 3); k >= 0; --k) v = std::nextafter(v, sign * INFINITY);
      return v;
    }
    case 6: return anchor * (1 + sign * 1e-13 * double(rng() % 100));
    case 7: return sign * std::pow(10.0, double(int(rng() % 617)) - 308);
    case 8: return std::uniform_real_distribution<double>(-10, 10)(rng);
    case 9: return double(rng() % 1000);
    default: return sign * std::numeric_limits<double>::min() * double(rng() % 4);
  }
}

std::vector<double> wild_values(std::mt19937_64& rng, double anchor, size_t n) {
  std::vector<double> v(n);
  for (double& x : v) x = wild(rng, anchor);
  return v;
}

TEST(ChartFuzz, WholeDoubleRange) {
  std::mt19937_64 rng(24);
  for (int it = 0; it < iters(); ++it) {
    const double ax = wild(rng, 1.0), ay = wild(rng, 5.0);
    Chart c{"fuzz", "x", "y", rng() % 2 == 0, rng() % 3 == 0, rng() % 3 == 0};
    if (rng() % 2) c.note = "note";
    for (int s = int(rng() % 4); s >= 0; --s) {
      const size_t n = 1 + rng() % 6;
      const auto style = ChartSeries::Style(rng() % 3);
      c.series.push_back({rng() % 2 ? "series" : "", "#123", wild_values(rng, ax, n), wild_values(rng, ay, n), style});
    }
    for (int m = int(rng() % 3); m > 0; --m) c.markers.push_back({wild(rng, ax), "m"});
    if (rng() % 4 == 0) c.x_ticks = wild_values(rng, ax, rng() % 40);
    expect_in_viewport(render_svg(c), c, "iteration " + std::to_string(it));
    if (HasFailure()) return;
  }
}

TEST(ChartFuzz, TicksOfAnyRange) {
  std::mt19937_64 rng(7);
  for (int it = 0; it < 20 * iters(); ++it) {
    double lo = wild(rng, 1.0), hi = wild(rng, lo);
    if (!std::isfinite(lo) || !std::isfinite(hi)) continue;
    if (hi < lo) std::swap(lo, hi);
    const int target = int(rng() % 40) - 2;
    const bool integer = rng() % 3 == 0;
    const std::vector<double> t = nice_ticks(lo, hi, target, integer);
    ASSERT_FALSE(t.empty());
    ASSERT_LE(t.size(), size_t(kMaxTicks)) << lo << " " << hi;
    const double step = t.size() > 1 ? t[1] - t[0] : integer ? 1 : 0;
    const double tol = 1e-8 * std::max(step, (hi / 2 - lo / 2) * 2);  // ticks may sit 1e-9 step outside
    for (size_t i = 0; i < t.size(); ++i) {
      ASSERT_TRUE(std::isfinite(t[i]) && t[i] >= lo - tol && t[i] <= hi + tol)
          << lo << " " << hi << ": " << t[i];
      if (i) {
        ASSERT_GT(t[i], t[i - 1]) << lo << " " << hi;
      }
      EXPECT_TRUE(std::isfinite(unit_position(t[i], lo, hi)));
    }
    for (double v : t) {
      const std::string l = tick_label(v, step, false);
      ASSERT_TRUE(l.size() <= 24 && l.find_first_of("ni?") == std::string::npos) << v << ": " << l;
    }
    if (lo > 0) {
      const std::vector<double> lt = log_ticks(lo, hi);
      ASSERT_LE(lt.size(), size_t(kMaxTicks)) << lo << " " << hi;
      for (size_t i = 0; i < lt.size(); ++i) {
        ASSERT_TRUE(std::isfinite(lt[i]) && lt[i] > 0 && lt[i] >= lo * (1 - 1e-8) && lt[i] <= hi * (1 + 1e-8))
            << lo << " " << hi << ": " << lt[i];
        if (i) {
          ASSERT_GT(lt[i], lt[i - 1]);
        }
        const std::string l = tick_label(lt[i], 0, true);
        ASSERT_TRUE(l.size() <= 24 && l.find_first_of("ni?") == std::string::npos) << lt[i] << ": " << l;
      }
    }
  }
}

}  // namespace
}  // namespace hmla::app
