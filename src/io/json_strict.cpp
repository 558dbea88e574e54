// parse_json: nlohmann's parser with a callback that tracks each open object's keys.
#include "hmla/io/json_strict.h"

#include <set>
#include <vector>

#include "hmla/core/error.h"

namespace hmla::io {

namespace {

using nlohmann::json;

// One open object or array: its keys so far (objects), and the key or index it sits under.
struct Level {
  bool object = false;
  std::set<std::string> keys;
  std::string name;
};

std::string object_path(const std::vector<Level>& open) {
  std::string p;
  for (size_t i = 1; i < open.size(); ++i) p += (p.empty() || open[i].name.rfind('[', 0) == 0 ? "" : ".") + open[i].name;
  return p.empty() ? "the top-level object" : "'" + p + "'";
}

}  // namespace

json parse_json(const std::string& text, const std::string& what) {
  std::vector<Level> open;
  std::string pending = "";  // the key the next value belongs to
  auto cb = [&](int, json::parse_event_t ev, json& parsed) {
    switch (ev) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start: {
        std::string name = pending;
        if (!open.empty() && !open.back().object) name = "[]";
        open.push_back({ev == json::parse_event_t::object_start, {}, name});
        break;
      }
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        open.pop_back();
        break;
      case json::parse_event_t::key: {
        pending = parsed.get<std::string>();
        HMLA_CHECK(open.back().keys.insert(pending).second, IoError, what, ": key '", pending, "' appears twice in ",
                   object_path(open), "; give it once");
        break;
      }
      case json::parse_event_t::value:
        break;
    }
    return true;
  };
  try {
    return json::parse(text, cb);
  } catch (const json::exception& e) {
    throw IoError(what + ": not valid JSON: " + e.what());
  }
}

}  // namespace hmla::io
