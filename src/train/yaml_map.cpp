// Strict YAML mapping reads for programmes and settings (yaml_map.h). load_yaml runs the text
// through yaml-cpp's event parser first, counting documents and nesting, so that a hostile file is
// refused before YAML::Load builds (and later walks recursively) anything deep.
#include "hmla/train/yaml_map.h"

#include <yaml-cpp/eventhandler.h>

#include <map>
#include <sstream>

#include "hmla/core/size_check.h"

namespace hmla {

namespace {

std::string line_of(const YAML::Mark& m) { return m.is_null() ? "" : "line " + std::to_string(m.line + 1) + ": "; }

// Counts documents and open collections as the parser reports them; throws past the bounds.
class Bounds : public YAML::EventHandler {
 public:
  explicit Bounds(const std::string& what) : what_(what) {}
  void OnDocumentStart(const YAML::Mark& m) override {
    HMLA_CHECK(++documents_ == 1, ConfigError, what_, ": ", line_of(m),
               "a second YAML document (after '---'); hmla reads one document per file");
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    open(m);
  }
  void OnSequenceEnd() override { --depth_; }
  void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    open(m);
  }
  void OnMapEnd() override { --depth_; }

 private:
  void open(const YAML::Mark& m) {
    HMLA_CHECK(++depth_ <= kMaxYamlDepth, ConfigError, what_, ": ", line_of(m), "nests deeper than ", kMaxYamlDepth,
               " levels; hmla reads YAML of at most ", kMaxYamlDepth, " levels");
  }
  const std::string& what_;
  size_t depth_ = 0;
  int documents_ = 0;
};

[[noreturn]] void invalid(const YAML::Exception& e, const std::string& what) {
  std::string msg = e.msg;
  for (char& c : msg)
    if (c == '\n' || c == '\r') c = ' ';
  throw ConfigError(what + ": not valid YAML: line " + std::to_string(e.mark.line + 1) + ", column " +
                    std::to_string(e.mark.column + 1) + ": " + msg);
}

void append_text(const YAML::Node& n, std::string& out, size_t limit) {
  if (out.size() > limit) return;
  if (n.IsSequence() || n.IsMap()) {
    out += n.IsMap() ? "{" : "[";
    bool first = true;
    for (const auto& e : n) {
      if (out.size() > limit) return;
      out += first ? "" : ", ";
      first = false;
      if (n.IsMap()) {
        append_text(e.first, out, limit);
        out += ": ";
        append_text(e.second, out, limit);
      } else {
        append_text(e, out, limit);
      }
    }
    out += n.IsMap() ? "}" : "]";
  } else if (n.IsScalar()) {
    const std::string& tag = n.Tag();
    const std::string yaml_tag = "tag:yaml.org,2002:";
    if (tag != "?" && tag != "!") out += (tag.rfind(yaml_tag, 0) == 0 ? "!!" + tag.substr(yaml_tag.size()) : tag) + " ";
    std::string v;
    for (char c : n.Scalar()) v += c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t" : std::string(1, c);
    out += tag == "!" ? "\"" + v + "\"" : v;
  } else {
    out += "null";
  }
}

}  // namespace

YAML::Node load_yaml(const std::string& text, const std::string& what) {
  HMLA_CHECK(text.size() <= kMaxYamlBytes, ConfigError, what, ": ", text.size(), " bytes of YAML, more than the ",
             format_bytes(double(kMaxYamlBytes)), " hmla reads");
  try {
    std::istringstream in(text);
    YAML::Parser parser(in);
    Bounds bounds(what);
    while (parser.HandleNextDocument(bounds)) {
    }
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    invalid(e, what);
  }
}

std::string yaml_line(const YAML::Node& n) {
  const YAML::Mark m = n.Mark();
  return m.is_null() ? "" : " (line " + std::to_string(m.line + 1) + ")";
}

std::string yaml_text(const YAML::Node& n) {
  constexpr size_t kLimit = 80;
  std::string out;
  append_text(n, out, kLimit);
  if (out.size() > kLimit) out = out.substr(0, kLimit) + "...";
  return out;
}

bool yaml_plain_or_tagged(const YAML::Node& n, bool integer, bool boolean) {
  const std::string& tag = n.Tag();
  if (tag == "?") return true;
  if (boolean) return tag == "tag:yaml.org,2002:bool";
  return tag == "tag:yaml.org,2002:int" || (!integer && tag == "tag:yaml.org,2002:float");
}

void for_each_key(const YAML::Node& map, const std::string& where,
                  const std::function<void(const std::string&, const YAML::Node&)>& fn) {
  std::map<std::string, YAML::Node> seen;
  for (const auto& kv : map) {
    HMLA_CHECK(kv.first.IsScalar(), ConfigError, where, yaml_line(kv.first), ": a key must be a plain name, got '",
               yaml_text(kv.first), "'");
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
