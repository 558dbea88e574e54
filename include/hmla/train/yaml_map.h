// Reading hmla's YAML files (programmes, `hmla layer --settings`) strictly: every key a plain string that
// appears once per mapping (yaml-cpp keeps both entries of a duplicated key, so a loop over them
// would silently let the last one win), and every error names the file, the line and the key.
#pragma once
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "hmla/core/error.h"

namespace hmla {

// Parses YAML text; ConfigError "<what>: not valid YAML: line L, column C: <reason>".
YAML::Node load_yaml(const std::string& text, const std::string& what);

// " (line 7)" for a node that came from a file, "" otherwise.
std::string yaml_line(const YAML::Node& n);

// Calls fn(key, value) for each entry of the mapping, in file order; ConfigError naming `where`
// for a key that is not a plain string or that appears twice.
void for_each_key(const YAML::Node& map, const std::string& where,
                  const std::function<void(const std::string&, const YAML::Node&)>& fn);

template <class T> constexpr const char* yaml_kind() {
  if constexpr (std::is_same_v<T, bool>) return "true or false";
  else if constexpr (std::is_same_v<T, std::string>) return "a string";
  else if constexpr (std::is_same_v<T, uint64_t>) return "a non-negative integer";
  else if constexpr (std::is_integral_v<T>) return "an integer";
  else if constexpr (std::is_floating_point_v<T>) return "a number";
  else if constexpr (std::is_same_v<T, std::vector<int64_t>>) return "a list of integers";
  else return "a value of another type";
}

// The value of `key` as T; ConfigError "<where>: <key> (line L) must be <kind>, got '<text>'".
template <class T>
T yaml_get(const YAML::Node& n, const std::string& key, const std::string& where) {
  try {
    if (n.IsScalar() || std::is_same_v<T, std::vector<int64_t>>) return n.as<T>();
  } catch (const YAML::Exception&) {
  }
  throw ConfigError(where + ": " + key + yaml_line(n) + " must be " + yaml_kind<T>() + ", got '" + YAML::Dump(n) + "'");
}

}  // namespace hmla
