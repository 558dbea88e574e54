// JSON as hmla reads its files (config.json, sharded indexes, safetensors headers): nlohmann
// keeps the last of two equal keys in an object, so a duplicated key would silently override
// the first; here it is an error that names the key and where it sits.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace hmla::io {

// Parses `text`; IoError "<what>: not valid JSON: ..." or "<what>: key 'k' appears twice in
// <object path>".
nlohmann::json parse_json(const std::string& text, const std::string& what);

}  // namespace hmla::io
