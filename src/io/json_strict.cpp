// parse_json: nlohmann's parser with a callback that tracks each open object's keys and the
// nesting depth, and refuses a duplicated key or a level past kMaxJsonDepth as it is opened (so
// nothing deeper is ever built).
#include "hmla/io/json_strict.h"

#include <set>
#include <vector>

#include "hmla/core/error.h"
#include "hmla/core/size_check.h"
#include "hmla/io/safetensors.h"

namespace hmla::io {

namespace {

// One open object or array: its keys so far (objects), and the key or index it sits under.
struct Level {
  bool object = false;
  std::set<std::string> keys;
  std::string name;
};

std::string object_path(const std::vector<Level>& open) {
  std::string p;
  for (size_t i = 1; i < open.size(); ++i) p += (p.empty() || open[i].name.rfind('[', 0) == 0 ? "" : ".") + open[i].name;
  if (p.size() > 60) p = p.substr(0, 60) + "...";  // a path as deep as kMaxJsonDepth is mostly "[]"
  return p.empty() ? "the top-level object" : "'" + p + "'";
}

template <class J>
J parse_strict(const std::string& text, const std::string& what) {
  HMLA_CHECK(text.size() <= kMaxJsonBytes, IoError, what, ": ", text.size(), " bytes of JSON, more than the ",
             format_bytes(double(kMaxJsonBytes)), " hmla reads");
  std::vector<Level> open;
  std::string pending = "";  // the key the next value belongs to
  auto cb = [&](int, typename J::parse_event_t ev, J& parsed) {
    switch (ev) {
      case J::parse_event_t::object_start:
      case J::parse_event_t::array_start: {
        std::string name = pending;
        if (!open.empty() && !open.back().object) name = "[]";
        open.push_back({ev == J::parse_event_t::object_start, {}, name});
        HMLA_CHECK(open.size() <= kMaxJsonDepth, IoError, what, ": nests deeper than ", kMaxJsonDepth,
                   " levels (at ", object_path(open), "); hmla reads JSON of at most ", kMaxJsonDepth, " levels");
        break;
      }
      case J::parse_event_t::object_end:
      case J::parse_event_t::array_end:
        open.pop_back();
        break;
      case J::parse_event_t::key: {
        pending = parsed.template get<std::string>();
        HMLA_CHECK(open.back().keys.insert(pending).second, IoError, what, ": key '", pending, "' appears twice in ",
                   object_path(open), "; give it once");
        break;
      }
      case J::parse_event_t::value:
        break;
    }
    return true;
  };
  try {
    return J::parse(text, cb);
  } catch (const nlohmann::json::exception& e) {
    throw IoError(what + ": not valid JSON: " + e.what());
  }
}

}  // namespace

nlohmann::json parse_json(const std::string& text, const std::string& what) {
  return parse_strict<nlohmann::json>(text, what);
}

nlohmann::ordered_json parse_ordered_json(const std::string& text, const std::string& what) {
  return parse_strict<nlohmann::ordered_json>(text, what);
}

nlohmann::json load_json(const std::string& path) { return parse_json(read_file(path, kMaxJsonBytes), path); }

}  // namespace hmla::io
