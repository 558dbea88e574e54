// metrics.jsonl rows to and from JSON lines (nlohmann-json; NaN is written as null, which reads
// back as NaN), the run's append-only writer and the resume's length checks.
#include "hmla/train/metrics.h"

#include <nlohmann/json.hpp>
#include <sstream>

#include "hmla/core/error.h"
#include "hmla/io/json_strict.h"
#include "hmla/io/safetensors.h"

namespace hmla {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

double number(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : MetricsRow::none;
}

std::string text(const json& j, const char* key, const std::string& fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : fallback;
}

// A list of numbers (null and non-numbers: NaN); n NaNs when the key is missing.
std::vector<double> numbers(const json& j, const char* key, size_t n) {
  std::vector<double> v;
  auto it = j.find(key);
  if (it == j.end() || !it->is_array()) return std::vector<double>(n, MetricsRow::none);
  for (const json& x : *it) v.push_back(x.is_number() ? x.get<double>() : MetricsRow::none);
  return v;
}

std::string mass_key(size_t kind, size_t part) {
  return std::string("attn_mass_") + kAttnMassParts[part] + "_" + kAttnMassKinds[kind];
}

// A count (bytes, syncs, launches) as an integer; null when there is none.
json whole_number(double n) { return std::isfinite(n) && n >= 0 ? json(uint64_t(n)) : json(); }

// The one rule for a row's kind (MetricsRow::Kind).
MetricsRow::Kind kind_of(const json& j) {
  if (j.contains("step")) return MetricsRow::Kind::step;
  if (j.contains("equivalence_max_diff")) return MetricsRow::Kind::equivalence;
  if (j.contains("heldout_lm_loss")) return MetricsRow::Kind::phase_end;
  return MetricsRow::Kind::other;
}

MetricsRow parse_row(const json& j) {
  MetricsRow r;
  r.kind = kind_of(j);
  r.phase = text(j, "phase", "?");
  if (auto it = j.find("step"); it != j.end() && it->is_number_integer()) r.step = it->get<int64_t>();
  r.lm_loss = number(j, "lm_loss"), r.indexer_kl = number(j, "indexer_kl"), r.lr = number(j, "lr");
  r.grad_norm_backbone = number(j, "grad_norm_backbone"), r.grad_norm_indexer = number(j, "grad_norm_indexer");
  r.tokens_per_s = number(j, "tokens_per_s"), r.peak_bytes = number(j, "peak_bytes");
  r.indexer_kl_csa = number(j, "indexer_kl_csa"), r.indexer_kl_hybrid = number(j, "indexer_kl_hybrid");
  r.mtp_loss = number(j, "mtp_loss");
  for (size_t k = 0; k < 3; ++k)
    for (size_t q = 0; q < 3; ++q) r.attn_mass[k][q] = number(j, mass_key(k, q).c_str());
  r.cuda_syncs = number(j, "cuda_syncs"), r.cuda_launches = number(j, "cuda_launches");
  r.h2d_bytes = number(j, "h2d_bytes"), r.d2h_bytes = number(j, "d2h_bytes");
  r.cuda_uploads = number(j, "cuda_uploads");
  r.ep_bytes = number(j, "ep_bytes");
  r.equivalence_max_diff = number(j, "equivalence_max_diff");
  r.equivalence_max_logit = number(j, "equivalence_max_logit");
  r.heldout_lm_loss = number(j, "heldout_lm_loss");
  r.first20_lm_loss = number(j, "first20_lm_loss"), r.last20_lm_loss = number(j, "last20_lm_loss");
  r.first20_indexer_kl = number(j, "first20_indexer_kl"), r.last20_indexer_kl = number(j, "last20_indexer_kl");
  r.seconds = number(j, "seconds");
  r.heldout_unavailable = text(j, "heldout_unavailable", "");
  if (auto it = j.find("moe_layers"); it != j.end() && it->is_array()) {
    for (const json& v : *it) r.moe_layers.push_back(v.is_number_integer() ? v.get<int64_t>() : -1);
    r.moe_imbalance = numbers(j, "moe_imbalance", r.moe_layers.size());
    r.moe_aux_loss = numbers(j, "moe_aux_loss", 0);
  }
  return r;
}

}  // namespace

std::string metrics_line(const MetricsRow& r) {
  switch (r.kind) {
    case MetricsRow::Kind::step: {
      json j{{"phase", r.phase}, {"step", r.step}, {"lm_loss", r.lm_loss}, {"indexer_kl", r.indexer_kl},
             {"lr", r.lr}, {"grad_norm_backbone", r.grad_norm_backbone},
             {"grad_norm_indexer", r.grad_norm_indexer}, {"tokens_per_s", r.tokens_per_s},
             {"peak_bytes", whole_number(r.peak_bytes)}};
      if (std::isfinite(r.indexer_kl_csa)) j["indexer_kl_csa"] = r.indexer_kl_csa;
      if (std::isfinite(r.indexer_kl_hybrid)) j["indexer_kl_hybrid"] = r.indexer_kl_hybrid;
      if (std::isfinite(r.mtp_loss)) j["mtp_loss"] = r.mtp_loss;  // a phase that trains the MTP layers
      for (size_t k = 0; k < 3; ++k)  // a V4 stack's logging step
        for (size_t q = 0; q < 3; ++q)
          if (std::isfinite(r.attn_mass[k][q])) j[mass_key(k, q)] = r.attn_mass[k][q];
      if (std::isfinite(r.cuda_syncs)) {  // a CUDA step's host cost
        j["cuda_syncs"] = whole_number(r.cuda_syncs), j["cuda_launches"] = whole_number(r.cuda_launches);
        j["h2d_bytes"] = whole_number(r.h2d_bytes), j["d2h_bytes"] = whole_number(r.d2h_bytes);
        j["cuda_uploads"] = whole_number(r.cuda_uploads);
      }
      if (std::isfinite(r.ep_bytes)) j["ep_bytes"] = whole_number(r.ep_bytes);  // an expert-parallel step
      if (!r.moe_layers.empty()) {  // a MoE model's step
        j["moe_layers"] = r.moe_layers;
        j["moe_imbalance"] = r.moe_imbalance;
        if (!r.moe_aux_loss.empty()) j["moe_aux_loss"] = r.moe_aux_loss;
      }
      return j.dump();
    }
    case MetricsRow::Kind::equivalence:
      return json{{"phase", r.phase}, {"equivalence_max_diff", r.equivalence_max_diff},
                  {"equivalence_max_logit", r.equivalence_max_logit}}
          .dump();
    case MetricsRow::Kind::phase_end: {
      json j{{"phase", r.phase}, {"heldout_lm_loss", r.heldout_lm_loss}, {"first20_lm_loss", r.first20_lm_loss},
             {"last20_lm_loss", r.last20_lm_loss}, {"first20_indexer_kl", r.first20_indexer_kl},
             {"last20_indexer_kl", r.last20_indexer_kl}, {"seconds", r.seconds}};
      if (!r.heldout_unavailable.empty()) j["heldout_unavailable"] = r.heldout_unavailable;
      return j.dump();
    }
    case MetricsRow::Kind::other:
      break;
  }
  throw Error("metrics_line: a row of kind other has no line");
}

MetricsFile read_metrics(const fs::path& path) {
  MetricsFile f;
  if (!fs::exists(path)) return f;
  std::istringstream in(io::read_file(path.string()));
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    json j;
    try {  // strict (io::parse_json): bounded nesting, no duplicated key
      j = io::parse_json(line, path.string() + ": line " + std::to_string(n));
    } catch (const IoError&) {
      j = nullptr;
    }
    if (!j.is_object() || !j.contains("phase")) {
      if (f.malformed++ == 0) f.first_malformed = n;
      continue;
    }
    f.rows.push_back(parse_row(j));
  }
  return f;
}

void require_well_formed(const MetricsFile& file, const fs::path& path) {
  HMLA_CHECK(file.malformed == 0, IoError, path.string(), ": line ", file.first_malformed,
             " is not a metrics row (a JSON object with a phase)");
}

MetricsLog::MetricsLog(bool root, const fs::path& path, bool append) : root_(root) {
  if (root_) file_.open(path, append ? std::ios::app : std::ios::trunc);
}

void MetricsLog::row(const MetricsRow& r) {
  if (root_) file_ << metrics_line(r) << "\n" << std::flush;
}

int64_t MetricsLog::bytes() { return root_ ? int64_t(file_.tellp()) : int64_t(0); }

void check_metrics_length(const fs::path& path, int64_t bytes) {
  const int64_t size = fs::exists(path) ? int64_t(fs::file_size(path)) : 0;
  HMLA_CHECK(bytes < 0 || size >= bytes, IoError, path.string(), ": ", size, " bytes, shorter than the ", bytes,
             " the checkpoint recorded; it was changed after the run");
}

void truncate_metrics(const fs::path& path, int64_t bytes) {
  check_metrics_length(path, bytes);
  if (bytes >= 0) fs::resize_file(path, uintmax_t(bytes));
}

}  // namespace hmla
