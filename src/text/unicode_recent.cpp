// Folds kRecentRanges into a PCRE2 pattern (unicode_recent.h): one pass over the pattern that tracks
// whether it is inside a character class, skips \Q...\E and POSIX [:name:] classes, and appends the
// ranges of the new code points to each class escape it widens.
#include "unicode_recent.h"

#include <cstdio>

namespace hmla::text {

namespace {

bool in_property(std::string_view name, std::string_view cat) {
  if (name.size() == 1) return cat[0] == name[0];
  if (name == "L&" || name == "LC") return cat == "Lu" || cat == "Ll" || cat == "Lt";
  return name == cat;
}
bool is_category(std::string_view name) {
  static constexpr std::string_view kNames[] = {
      "L",  "M",  "N",  "P",  "S",  "Z",  "C",  "L&", "LC", "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd",
      "Nl", "No", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf"};
  for (std::string_view n : kNames)
    if (n == name) return true;
  return false;
}

// The new code points whose category `keep` accepts, as class items: \x{A}-\x{B}...
template <class Keep>
std::string class_items(Keep keep) {
  std::string s;
  char buf[40];
  for (size_t i = 0; i < kRecentRangeCount; ++i) {
    const RecentRange& r = kRecentRanges[i];
    if (!keep(std::string_view(r.category))) continue;
    if (r.first == r.last) std::snprintf(buf, sizeof buf, "\\x{%X}", unsigned(r.first));
    else std::snprintf(buf, sizeof buf, "\\x{%X}-\\x{%X}", unsigned(r.first), unsigned(r.last));
    s += buf;
  }
  return s;
}

}  // namespace

std::string with_recent_unicode(std::string_view p) {
  std::string out;
  out.reserve(p.size());
  bool in_class = false;
  for (size_t i = 0; i < p.size();) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char d = p[i + 1];
      if (d == 'Q') {  // a literal run up to \E
        const size_t e = p.find("\\E", i + 2);
        const size_t end = e == std::string_view::npos ? p.size() : e + 2;
        out.append(p.substr(i, end - i));
        i = end;
        continue;
      }
      std::string escape(p.substr(i, 2)), positive, items;
      bool negated = false;
      size_t end = i + 2;
      if (d == 'p' || d == 'P') {
        std::string_view name;
        if (end < p.size() && p[end] == '{') {
          const size_t close = p.find('}', end);
          if (close != std::string_view::npos) {
            name = p.substr(end + 1, close - end - 1);
            end = close + 1;
          }
        } else if (end < p.size()) {
          name = p.substr(end++, 1);
        }
        escape = std::string(p.substr(i, end - i));
        negated = d == 'P';
        if (!name.empty() && name[0] == '^') {
          negated = !negated;
          name.remove_prefix(1);
        }
        if (is_category(name)) {
          positive = "\\p{" + std::string(name) + "}";
          items = class_items([&](std::string_view cat) { return in_property(name, cat); });
        }
      } else if (d == 'd' || d == 'D' || d == 'w' || d == 'W') {
        negated = d == 'D' || d == 'W';
        positive = d == 'd' || d == 'D' ? "\\d" : "\\w";
        items = class_items([&](std::string_view cat) {
          return cat == "Nd" || (positive == "\\w" && (cat[0] == 'L' || cat[0] == 'M'));
        });
      } else if (d == 'c' && end < p.size()) {  // \cX: X is a literal, even '['
        escape = std::string(p.substr(i, 3));
        end = i + 3;
      }
      if (items.empty() || (in_class && negated)) out += escape;
      else if (in_class) out += escape + items;
      else out += (negated ? "[^" : "[") + positive + items + "]";
      i = end;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      ++i;
      if (i < p.size() && p[i] == '^') out += p[i++];
      if (i < p.size() && p[i] == ']') out += p[i++];  // a leading ] is a literal
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:]
      const size_t e = p.find(":]", i + 2);
      const size_t end = e == std::string_view::npos ? i + 1 : e + 2;
      out.append(p.substr(i, end - i));
      i = end;
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
    ++i;
  }
  return out;
}

bool has_recent_code_point(std::string_view s) {
  const char32_t lowest = kRecentRanges[0].first;  // U+0897: three bytes, so two-byte leads are skipped
  const unsigned char lead_min = lowest < 0x800 ? 0xC0 : lowest < 0x10000 ? 0xE0 : 0xF0;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < lead_min) continue;  // ASCII, continuation bytes and leads of smaller code points
    const size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    if (i + n > s.size()) break;
    char32_t cp = c & (0x7F >> n);
    for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    i += n - 1;
    size_t lo = 0, hi = kRecentRangeCount;  // the first range whose last >= cp
    while (lo < hi) {
      const size_t mid = (lo + hi) / 2;
      if (kRecentRanges[mid].last < cp) lo = mid + 1;
      else hi = mid;
    }
    if (lo < kRecentRangeCount && kRecentRanges[lo].first <= cp) return true;
  }
  return false;
}

}  // namespace hmla::text
