// UTF-8 validation and the maximal-subpart U+FFFD repair (include/hmla/text/utf8.h).
#include "hmla/text/utf8.h"

#include <cstdint>

namespace hmla::text {

namespace {

// The length of the valid sequence at s[i], or 0 with `bad` set to the maximal invalid subpart's length.
size_t sequence_at(std::string_view s, size_t i, size_t& bad) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (c >= 0xC2 && c <= 0xDF) need = 1;
  else if (c == 0xE0) need = 2, lo = 0xA0;
  else if (c == 0xED) need = 2, hi = 0x9F;
  else if (c >= 0xE1 && c <= 0xEF) need = 2;
  else if (c == 0xF0) need = 3, lo = 0x90;
  else if (c >= 0xF1 && c <= 0xF3) need = 3;
  else if (c == 0xF4) need = 3, hi = 0x8F;
  else return bad = 1, 0;
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) return bad = k, 0;
    const auto d = static_cast<unsigned char>(s[i + k]);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (d < l || d > h) return bad = k, 0;
  }
  return need + 1;
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {  // ASCII runs, eight bytes at a time
      while (i + 8 <= s.size()) {
        uint64_t w;
        __builtin_memcpy(&w, s.data() + i, 8);
        if (w & 0x8080808080808080ull) break;
        i += 8;
      }
      if (i < s.size() && static_cast<unsigned char>(s[i]) < 0x80) ++i;
      continue;
    }
    size_t bad = 0;
    const size_t n = sequence_at(s, i, bad);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string replace_invalid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  for (size_t i = 0; i < s.size();) {
    size_t bad = 0;
    const size_t n = sequence_at(s, i, bad);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out.append("\xEF\xBF\xBD");
      i += bad;
    }
  }
  return out;
}

}  // namespace hmla::text
