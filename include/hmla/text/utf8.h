// UTF-8 checks and repair. replace_invalid_utf8 reads bytes as Python's
// bytes.decode("utf-8", errors="replace") does: each maximal invalid subpart (Unicode's "maximal
// subpart" practice) becomes one U+FFFD; surrogates, overlongs and code points above U+10FFFF are invalid.
#pragma once
#include <string>
#include <string_view>

namespace hmla::text {

bool is_valid_utf8(std::string_view s);
std::string replace_invalid_utf8(std::string_view s);

}  // namespace hmla::text
