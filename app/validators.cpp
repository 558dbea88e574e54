// Readable CLI validators (validators.h).
#include "validators.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace hmla::app {

namespace {

std::string int_range(int64_t lo, int64_t hi) {
  if (hi == std::numeric_limits<int64_t>::max()) return "an integer >= " + std::to_string(lo);
  return "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

std::string real_range(double lo, bool lo_open, double hi) {
  std::ostringstream os;
  os << "a finite number " << (lo_open ? "> " : ">= ") << lo;
  if (std::isfinite(hi)) os << " and <= " << hi;
  return os.str();
}

}  // namespace

CLI::Validator Int(int64_t lo, int64_t hi) {
  const std::string range = int_range(lo, hi);
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        int64_t v = 0;
        const char* end = s.data() + s.size();
        auto [p, ec] = std::from_chars(s.data() + (!s.empty() && s[0] == '+'), end, v);
        if (ec == std::errc() && p == end && v >= lo && v <= hi) return "";
        if (ec == std::errc::result_out_of_range && p == end)
          return "must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + s + "'";
        return "must be " + range + ", got '" + s + "'";
      },
      "(" + range.substr(range.find(' ', 3) + 1) + ")");
}

CLI::Validator Real(double lo, bool lo_open, double hi) {
  const std::string range = real_range(lo, lo_open, hi);
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = s.empty() ? std::nan("") : std::strtod(s.c_str(), &end);
        const bool parsed = !s.empty() && end == s.c_str() + s.size();
        if (parsed && std::isfinite(v) && (lo_open ? v > lo : v >= lo) && v <= hi) return "";
        return "must be " + range + ", got '" + s + "'";
      },
      "(" + range.substr(std::string("a finite number ").size()) + ")");
}

CLI::Validator NonEmpty() {
  return CLI::Validator([](std::string& s) -> std::string { return s.empty() ? "must not be empty" : ""; },
                        "");
}

CLI::Validator OneOf(const std::vector<std::string>& names, const std::string& what) {
  std::string list;
  for (size_t i = 0; i < names.size(); ++i) list += (i ? ", " : "") + names[i];
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        for (const std::string& n : names)
          if (s == n) return "";
        return "unknown " + what + " '" + s + "'; use one of " + list;
      },
      "{" + list + "}");
}

}  // namespace hmla::app
