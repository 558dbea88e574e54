// JSON as hmla reads its files (config.json, sharded indexes, safetensors headers, a run's
// programme.json, state.json and metrics.jsonl, the bench twin's replies; `hmla report`'s metrics
// and bench lines are meant to as well): such text goes through parse_json or
// parse_ordered_json, which bound it and refuse what nlohmann would accept silently.
// - A duplicated key is an error naming the key and where it sits (nlohmann keeps the last of two
//   equal keys, so the second would silently override the first).
// - Nesting is bounded (kMaxJsonDepth): nlohmann's parser is iterative, but copying, comparing and
//   dumping a value recurse once per level, so 100,000 nested arrays in an unknown key overflowed
//   the stack long after the parse.
// - Size is bounded (kMaxJsonBytes): the parsed value takes about 10x the text in memory.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace hmla::io {

// Deeper than any file hmla reads or writes (config.json: 3 levels, programme.json: 3, a
// safetensors header: 3, transformers' configs: 4 or 5) by a wide margin, and shallow enough that
// every recursive walk of the value (a few hundred bytes of stack a level) stays far below even
// a 256 KiB thread stack.
inline constexpr size_t kMaxJsonDepth = 64;
// The safetensors header bound (the largest JSON hmla reads: a header lists every tensor; a
// sharded index of a 100k-tensor model is about 10 MiB).
inline constexpr uint64_t kMaxJsonBytes = 100ull << 20;

// Parses `text`; IoError "<what>: not valid JSON: ...", "<what>: key 'k' appears twice in
// <object path>", "<what>: nests deeper than 64 levels at <path>" or "<what>: N bytes of JSON, more
// than the 100.0 MiB hmla reads".
nlohmann::json parse_json(const std::string& text, const std::string& what);
// The same, keeping each object's keys in file order.
nlohmann::ordered_json parse_ordered_json(const std::string& text, const std::string& what);
// parse_json of a file's text (read_file: a regular file, at most kMaxJsonBytes, checked before
// it is read); `path` names it in errors.
nlohmann::json load_json(const std::string& path);

}  // namespace hmla::io
