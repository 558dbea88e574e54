// Reading hmla's YAML files (programmes, `hmla layer --settings`) strictly: every key a plain string that
// appears once per mapping (yaml-cpp keeps both entries of a duplicated key, so a loop over them
// would silently let the last one win), a number or a boolean is a plain scalar (a quoted "2" or
// a `!!str 2` is a string, as YAML says, never silently read as 2), the text is one document of
// bounded size and nesting, and every error is one line naming the file, the line and the key.
#pragma once
#include <yaml-cpp/yaml.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "hmla/core/error.h"

namespace hmla {

// Far beyond any file hmla reads (a programme nests 3 levels: phases, a phase, a list), and
// far below yaml-cpp's own recursion guard (2000 levels), whose recursive parse and dump take
// stack per level.
inline constexpr size_t kMaxYamlDepth = 64;
// A programme of a thousand phases is about 100 KB.
inline constexpr size_t kMaxYamlBytes = size_t(1) << 20;

// Parses YAML text: one document of at most kMaxYamlBytes, nesting at most kMaxYamlDepth levels
// (checked on the parser's events, before anything deeper is built). ConfigError "<what>: not
// valid YAML: line L, column C: <reason>", "<what>: line L: nests deeper than 64 levels", "<what>:
// line L: a second YAML document".
YAML::Node load_yaml(const std::string& text, const std::string& what);

// " (line 7)" for a node that came from a file, "" otherwise.
std::string yaml_line(const YAML::Node& n);

// A node as one line of flow YAML for messages ("{a: 1, b: 2}", "\"2\""), cut after about 80
// characters; a block mapping or a multi-line scalar never breaks an error message into lines.
std::string yaml_text(const YAML::Node& n);

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

// True when a scalar may be read as a number or a boolean: plain (untagged, unquoted) or tagged
// with YAML's own tag for one (!!int, !!float, !!bool).
bool yaml_plain_or_tagged(const YAML::Node& n, bool integer, bool boolean);

// The value of `key` as T; ConfigError "<where>: <key> (line L) must be <kind>, got '<text>'".
template <class T>
T yaml_get(const YAML::Node& n, const std::string& key, const std::string& where) {
  constexpr bool is_list = std::is_same_v<T, std::vector<int64_t>>;
  constexpr bool is_text = std::is_same_v<T, std::string>;
  try {
    if constexpr (is_list) {
      bool plain = n.IsSequence();
      for (size_t i = 0; plain && i < n.size(); ++i) plain = n[i].IsScalar() && yaml_plain_or_tagged(n[i], true, false);
      if (plain) return n.as<T>();
    } else if (n.IsScalar() && (is_text || yaml_plain_or_tagged(n, std::is_integral_v<T>, std::is_same_v<T, bool>))) {
      return n.as<T>();
    }
  } catch (const YAML::Exception&) {
  }
  const bool text = !is_text && n.IsScalar() && !yaml_plain_or_tagged(n, std::is_integral_v<T>, std::is_same_v<T, bool>);
  throw ConfigError(where + ": " + key + yaml_line(n) + " must be " + yaml_kind<T>() + ", got '" + yaml_text(n) + "'" +
                    (text ? " (a string: write it without quotes or a tag)" : ""));
}

}  // namespace hmla
