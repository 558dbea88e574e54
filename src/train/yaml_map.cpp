// Strict YAML mapping reads for programmes and settings (yaml_map.h).
#include "hmla/train/yaml_map.h"

#include <map>

namespace hmla {

YAML::Node load_yaml(const std::string& text, const std::string& what) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(what + ": not valid YAML: line " + std::to_string(e.mark.line + 1) + ", column " +
                      std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
}

std::string yaml_line(const YAML::Node& n) {
  const YAML::Mark m = n.Mark();
  return m.is_null() ? "" : " (line " + std::to_string(m.line + 1) + ")";
}

void for_each_key(const YAML::Node& map, const std::string& where,
                  const std::function<void(const std::string&, const YAML::Node&)>& fn) {
  std::map<std::string, YAML::Node> seen;
  for (const auto& kv : map) {
    HMLA_CHECK(kv.first.IsScalar(), ConfigError, where, yaml_line(kv.first), ": a key must be a plain name, got '",
               YAML::Dump(kv.first), "'");
    const std::string key = kv.first.Scalar();
    auto [it, fresh] = seen.emplace(key, kv.first);
    if (!fresh) {
      const YAML::Mark a = it->second.Mark(), b = kv.first.Mark();
      std::string lines;
      if (!a.is_null() && !b.is_null())
        lines = a.line == b.line ? " (line " + std::to_string(a.line + 1) + ")"
                                 : " (lines " + std::to_string(a.line + 1) + " and " + std::to_string(b.line + 1) + ")";
      throw ConfigError(where + ": key '" + key + "' appears twice" + lines + "; give it once");
    }
    fn(key, kv.second);
  }
}

}  // namespace hmla
