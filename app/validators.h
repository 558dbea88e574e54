// CLI11 validators whose messages name the allowed values readably ("--tokens: must be an
// integer >= 1, got '0'"), for every option of every command. They parse the text themselves,
// so a malformed number gets the same message as an out-of-range one.
#pragma once
#include <CLI/CLI.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace hmla::app {

// An integer in [lo, hi].
CLI::Validator Int(int64_t lo, int64_t hi = std::numeric_limits<int64_t>::max());
// A finite number > lo (lo_open) or >= lo, and <= hi.
CLI::Validator Real(double lo, bool lo_open, double hi = std::numeric_limits<double>::infinity());
// A non-empty string (paths, separators, prompts).
CLI::Validator NonEmpty();
// One of `names`.
CLI::Validator OneOf(const std::vector<std::string>& names, const std::string& what);

}  // namespace hmla::app
