// `hmla bench tokenizer`: the input's lines encoded on N threads (contiguous runs of lines, equal in
// bytes), best of --reps after a warm-up (the per-thread word caches filled), against tokenizers'
// encode_batch under RAYON_NUM_THREADS=N, which reports the FNV-1a hash of its ids for the check.
#include "tokenizer_bench.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "hmla/core/error.h"
#include "hmla/io/safetensors.h"
#include "hmla/text/tokenizer.h"

namespace hmla::app {

namespace {

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string run_capture(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  HMLA_CHECK(p != nullptr, IoError, "cannot run ", cmd);
  std::string out;
  std::array<char, 4096> buf;
  for (size_t n; (n = fread(buf.data(), 1, buf.size(), p)) > 0;) out.append(buf.data(), n);
  const int rc = pclose(p);
  HMLA_CHECK(rc == 0, IoError, "bench tokenizer: ", cmd, " failed (exit status ", rc, ")");
  return out;
}

uint64_t ids_hash(const std::vector<std::vector<int32_t>>& per_line) {
  uint64_t h = 1469598103934665603ull;
  auto put = [&](int32_t v) {
    for (int k = 0; k < 4; ++k) h = (h ^ ((uint32_t(v) >> (8 * k)) & 0xFF)) * 1099511628211ull;
  };
  for (const auto& ids : per_line) {
    for (int32_t v : ids) put(v);
    put(-1);
  }
  return h;
}

}  // namespace

void run_tokenizer_bench(const TokenizerBenchOptions& o, std::ostream& out) {
  const auto tok = text::load_tokenizer(o.tokenizer, std::nullopt, false);  // it only encodes: no eos needed
  std::error_code ec;
  const std::string file = std::filesystem::is_directory(o.tokenizer, ec)
                               ? (std::filesystem::path(o.tokenizer) / "tokenizer.json").string()
                               : o.tokenizer;
  const std::string text = io::read_file(o.input);
  std::vector<std::string_view> lines;
  for (size_t at = 0;;) {
    const size_t nl = text.find('\n', at);
    lines.push_back(std::string_view(text).substr(at, nl == std::string::npos ? std::string::npos : nl - at));
    if (nl == std::string::npos) break;
    at = nl + 1;
  }
  std::vector<std::vector<int32_t>> ids(lines.size());
  for (int64_t n : o.threads) {
    HMLA_CHECK(n >= 1 && n <= 1024, ConfigError, "--threads: ", n, " is not in [1, 1024]");
    // Contiguous runs of lines, about text.size() / n bytes each.
    std::vector<size_t> cut{0};
    size_t bytes = 0;
    for (size_t i = 0; i < lines.size(); ++i) {
      bytes += lines[i].size() + 1;
      if (bytes * size_t(n) >= text.size() * cut.size() && cut.size() < size_t(n)) cut.push_back(i + 1);
    }
    while (cut.size() <= size_t(n)) cut.push_back(lines.size());
    auto pass = [&] {
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<std::thread> pool;
      for (int64_t t = 0; t < n; ++t)
        pool.emplace_back([&, t] {
          for (size_t i = cut[t]; i < cut[t + 1]; ++i) {
            ids[i].clear();
            tok->encode(lines[i], false, ids[i]);
          }
        });
      for (auto& th : pool) th.join();
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    pass();  // warm-up
    double best = 1e300;
    for (int64_t r = 0; r < o.reps; ++r) best = std::min(best, pass());
    int64_t tokens = 0;
    for (const auto& v : ids) tokens += int64_t(v.size());
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(ids_hash(ids)));
    nlohmann::ordered_json row{{"bench", "tokenizer"}, {"tokenizer", file}, {"input", o.input},
                               {"bytes", text.size()}, {"lines", lines.size()}, {"tokens", tokens}, {"threads", n},
                               {"hmla_mb_s", text.size() / best / 1e6}};
    if (!o.python.empty()) {
      const std::string script = o.script.empty() ? HMLA_SOURCE_DIR "/tests/text/tokenizers_bench.py" : o.script;
      const std::string cmd = "RAYON_NUM_THREADS=" + std::to_string(n) + " " + shell_quote(o.python) + " " +
                              shell_quote(script) + " --tokenizer " + shell_quote(file) + " --input " +
                              shell_quote(o.input) + " --reps " + std::to_string(o.reps);
      nlohmann::json py;
      try {
        py = nlohmann::json::parse(run_capture(cmd));
      } catch (const nlohmann::json::exception& e) {
        HMLA_CHECK(false, IoError, "bench tokenizer: ", script, " printed no JSON: ", e.what());
      }
      HMLA_CHECK(py.value("ids_fnv1a", "") == hex && py.value("tokens", int64_t(-1)) == tokens, Error,
                 "bench tokenizer: hmla's ids differ from tokenizers' on ", o.input, " (", tokens, " tokens, hash ",
                 hex, "; tokenizers ", py.value("tokens", int64_t(-1)), " tokens, hash ", py.value("ids_fnv1a", ""),
                 ")");
      const double theirs = py.at("mb_s").get<double>();
      const double fast = py.value("fast_mb_s", 0.0);  // encode_batch_fast (no offsets), when it has one
      row["tokenizers_mb_s"] = theirs;
      if (fast > 0) row["tokenizers_fast_mb_s"] = fast;
      row["speedup"] = text.size() / best / 1e6 / std::max(theirs, fast);  // against the faster of the two
      row["ids_equal"] = true;
    }
    out << row.dump() << "\n";
  }
}

}  // namespace hmla::app
