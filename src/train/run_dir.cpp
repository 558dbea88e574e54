// Claiming a run directory (include/hmla/train/run_dir.h). Everything is checked read-only
// first; the directory is created, locked, announced and marked only when the run begins to
// write, and the checks are repeated under the lock, because the lock (not the first look) is
// what makes the directory this run's.
#include "hmla/train/run_dir.h"

#include <omp.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <vector>

#include "hmla/core/error.h"
#include "hmla/io/safetensors.h"
#include "hmla/core/cuda.h"
#include "hmla/ops/cpu_blas.h"

namespace hmla {

namespace fs = std::filesystem;

namespace {

// "<phase index>-<phase name>-step<k>": a phase name plus two 64-bit integers and the dashes.
constexpr size_t kMaxCheckpointName = io::kMaxNameLength + 48;

// A run's own files at the top of its directory (besides checkpoints/ and the lock).
constexpr const char* kRunFiles[] = {kRunMarker,    "programme.json",    "metrics.jsonl", "summary.json",
                                     "config.json", "model.safetensors", "report.html"};
// Those a run that never reached a checkpoint may lose when it starts again.
constexpr const char* kRestartable[] = {kRunMarker, "programme.json", "metrics.jsonl"};

bool is_temporary(const std::string& name) {  // save_checkpoint's ".<name>.tmp"
  return name.size() > 5 && name[0] == '.' && name.ends_with(".tmp");
}

fs::file_type type_of(const fs::path& p) {
  std::error_code ec;
  return fs::symlink_status(p, ec).type();
}

struct DirView {
  bool exists = false;
  bool marked = false;      // holds kRunMarker
  bool has_latest = false;  // holds checkpoints/latest (also what marks a run from before the marker)
  std::vector<std::string> entries;  // sorted, without the lock file
};

DirView inspect(const fs::path& out) {
  DirView v;
  std::error_code ec;
  const fs::file_status st = fs::status(out, ec);  // a symlinked run directory is fine
  if (st.type() == fs::file_type::not_found) return v;
  HMLA_CHECK(!ec, IoError, "--out ", out.string(), ": cannot inspect it (", ec.message(), ")");
  HMLA_CHECK(fs::is_directory(st), ConfigError, "--out ", out.string(),
             " exists and is not a directory (nothing was changed)");
  v.exists = true;
  fs::directory_iterator it(out, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec))
    if (it->path().filename() != kRunLock) v.entries.push_back(it->path().filename().string());
  HMLA_CHECK(!ec, IoError, "--out ", out.string(), ": cannot list it (", ec.message(), ")");
  std::sort(v.entries.begin(), v.entries.end());
  v.marked = type_of(out / kRunMarker) == fs::file_type::regular;
  v.has_latest = type_of(out / "checkpoints" / "latest") != fs::file_type::not_found;
  return v;
}

std::string listing(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < 4; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > 4) s += ", ... (" + std::to_string(names.size()) + " entries)";
  return s;
}

// What a restart would overwrite although it is worth keeping: final weights, a summary, checkpoints.
std::vector<std::string> outputs_worth_keeping(const DirView& v, const fs::path& out) {
  std::vector<std::string> kept;
  for (const std::string& e : v.entries) {
    if (std::find(std::begin(kRestartable), std::end(kRestartable), e) != std::end(kRestartable)) continue;
    if (e == "checkpoints") {
      std::error_code ec;
      for (fs::directory_iterator it(out / e, ec); !ec && it != fs::directory_iterator(); it.increment(ec))
        if (!is_temporary(it->path().filename().string())) {
          kept.push_back(e);
          break;
        }
    } else if (std::find(std::begin(kRunFiles), std::end(kRunFiles), e) != std::end(kRunFiles)) {
      kept.push_back(e);
    }
  }
  return kept;
}

// The files a run writes are regular files (or absent) and checkpoints/ is a real directory:
// a symlink or FIFO planted there would carry the run's writes outside its directory.
void check_run_files(const fs::path& out) {
  for (const char* f : kRunFiles)
    if (type_of(out / f) != fs::file_type::not_found) io::check_output_file((out / f).string(), "");
  const fs::file_type ck = type_of(out / "checkpoints");
  HMLA_CHECK(ck == fs::file_type::not_found || ck == fs::file_type::directory, IoError, (out / "checkpoints").string(),
             " is not a directory of the run (a symlink or a file); hmla writes checkpoints only inside the run");
  if (type_of(out / "checkpoints" / "latest") != fs::file_type::not_found)
    io::check_output_file((out / "checkpoints" / "latest").string(), "");
}

void check_run_dir(const DirView& v, const fs::path& out, bool resume) {
  const std::string o = out.string();
  if (resume) {
    HMLA_CHECK(v.exists && !v.entries.empty(), ConfigError, "--resume: ", o, v.exists ? " is empty" : " does not exist",
               ": there is no run to resume (nothing was changed)");
    HMLA_CHECK(is_run_directory(out), ConfigError, "--resume: ", o, " is not an hmla run (it holds ",
               listing(v.entries), " but no ", kRunMarker, "); nothing to resume (nothing was changed)");
    HMLA_CHECK(v.has_latest, ConfigError, "--resume: the run in ", o,
               " has no checkpoint yet (no checkpoints/latest); start it again without --resume (nothing was changed)");
    latest_checkpoint(out / "checkpoints");
  } else if (!v.entries.empty()) {
    HMLA_CHECK(!v.has_latest, ConfigError, o,
               " already holds a run; continue it with --resume or choose another --out (nothing was changed)");
    HMLA_CHECK(v.marked, ConfigError, "--out ", o, " is neither empty nor an hmla run (it holds ", listing(v.entries),
               "; a run holds ", kRunMarker, "); choose a new or empty directory (nothing was changed)");
    const std::vector<std::string> kept = outputs_worth_keeping(v, out);
    HMLA_CHECK(kept.empty(), ConfigError, o, " holds a run's outputs (", listing(kept),
               ") but no checkpoint to resume from; choose another --out (nothing was changed)");
  }
  if (v.exists) check_run_files(out);
}

fs::path canonical_dir(const fs::path& p) {
  std::error_code ec;
  fs::path c = fs::weakly_canonical(p, ec);
  if (ec) c = fs::absolute(p, ec).lexically_normal();
  if (c.filename().empty()) c = c.parent_path();  // "dir/" names dir
  return c;
}

bool within(const fs::path& p, const fs::path& dir) {
  return std::mismatch(dir.begin(), dir.end(), p.begin(), p.end()).first == dir.end();
}

fs::path parent_or_dot(const fs::path& p) { return p.has_parent_path() ? p.parent_path() : fs::path("."); }

// A run never holds its own inputs: most of all, --out at the init checkpoint's directory would
// overwrite the checkpoint's config.json and model.safetensors with the run's.
void check_inputs_outside(const Programme& pr, const fs::path& out) {
  const fs::path o = canonical_dir(out);
  auto refuse_within = [&](const fs::path& dir, const std::string& key, const std::string& value, const char* why) {
    const fs::path d = canonical_dir(dir);
    HMLA_CHECK(!within(d, o), ConfigError, "--out ", out.string(), d == o ? " is the directory of " : " holds ", key,
               " ", value, ": ", why, "; choose another --out (nothing was changed)");
  };
  const char* only_own = "a run's directory holds only what the run writes";
  if (!pr.init_checkpoint.empty()) {
    const fs::path init(pr.init_checkpoint);
    std::error_code ec;
    refuse_within(fs::is_directory(init, ec) ? init : parent_or_dot(init), "init_checkpoint", pr.init_checkpoint,
                  "the run would overwrite its config.json and model.safetensors");
  }
  refuse_within(parent_or_dot(pr.model_config), "the model config", pr.model_config, only_own);
  refuse_within(pr.data_dir, "the data", pr.data_dir, only_own);
}

// A run killed while saving leaves checkpoints/.<name>.tmp; the lock says no one is writing it.
void remove_stale_temporaries(const fs::path& ckroot) {
  if (type_of(ckroot) != fs::file_type::directory) return;
  std::vector<fs::path> stale;
  std::error_code ec;
  for (fs::directory_iterator it(ckroot, ec); !ec && it != fs::directory_iterator(); it.increment(ec))
    if (is_temporary(it->path().filename().string())) stale.push_back(it->path());
  for (const fs::path& p : stale) fs::remove_all(p, ec);
}

}  // namespace

bool is_run_directory(const fs::path& dir) {
  return type_of(dir / kRunMarker) == fs::file_type::regular ||
         type_of(dir / "checkpoints" / "latest") != fs::file_type::not_found;
}

fs::path latest_checkpoint(const fs::path& ckroot) {
  const fs::path latest = ckroot / "latest";
  const fs::file_type t = type_of(latest);
  HMLA_CHECK(t != fs::file_type::not_found, IoError, latest.string(), ": nothing to resume (no checkpoint yet)");
  HMLA_CHECK(t == fs::file_type::regular && fs::file_size(latest) <= 4096, IoError, latest.string(),
             ": not a small regular file naming a checkpoint (nothing was changed)");
  std::string name = io::read_file(latest.string());
  if (name.ends_with('\n')) name.pop_back();
  io::check_path_name(name, latest.string() + ": the checkpoint name", kMaxCheckpointName);
  HMLA_CHECK(type_of(ckroot / name) == fs::file_type::directory, IoError, latest.string(), " names '", name,
             "', but ", (ckroot / name).string(), " is not a checkpoint directory (nothing was changed)");
  return ckroot / name;
}

RunDir RunDir::claim(const Programme& pr, const std::string& out_dir, bool resume) {
  HMLA_CHECK(!out_dir.empty(), ConfigError, "--out is empty: name the run directory");
  const fs::path out(out_dir);
  io::FileLock::check_free((out / kRunLock).string(), "--out " + out_dir);  // a busy run is the first thing to say
  check_inputs_outside(pr, out);
  check_run_dir(inspect(out), out, resume);
  RunDir d;
  d.out_ = out_dir;
  d.programme_ = pr.path;
  d.resume_ = resume;
  if (resume) {  // the run exists: read its checkpoint under the lock
    d.lock_ = io::FileLock::acquire((out / kRunLock).string(), "--out " + out_dir);
    check_run_dir(inspect(out), out, resume);
  }
  return d;
}

void RunDir::begin(Device device, const text::TokenizerRecord& tokenizer) {
  const fs::path out(out_);
  if (!lock_.held()) {
    std::error_code ec;
    fs::create_directories(out, ec);
    HMLA_CHECK(!ec, IoError, out_, ": cannot create the run directory (", ec.message(), ")");
    lock_ = io::FileLock::acquire((out / kRunLock).string(), "--out " + out_);
    check_run_dir(inspect(out), out, resume_);  // another run may have claimed it since claim()
  }
  lock_.announce(io::process_identity() + " (hmla train " + programme_ + ")");
  if (type_of(out / kRunMarker) != fs::file_type::regular) {  // kept from the run's start
    const CpuBlasInfo blas = cpu_blas_info();
    const nlohmann::ordered_json env{{"hmla_version", HMLA_VERSION_STRING},
                                     {"commit", HMLA_COMMIT_STRING},
                                     {"device", device == Device::cpu ? std::string("cpu")
                                                                      : "cuda: " + cuda_device_name(0)},
                                     {"threads", omp_get_max_threads()},
                                     {"blas", blas.library},
                                     {"blas_core", blas.core},
                                     {"cpu_isa", blas.cpu_isa}};
    const nlohmann::ordered_json j{{"hmla_run", 1},
                                   {"created_by", io::process_identity()},
                                   {"programme", programme_},
                                   {"environment", env},  // where the run started (hmla report)
                                   {"tokenizer", {{"describe", tokenizer.describe},
                                                  {"fingerprint", tokenizer.fingerprint},
                                                  {"vocab_size", tokenizer.vocab_size}}}};
    io::write_file_atomic((out / kRunMarker).string(), j.dump(2) + "\n");
  }
  remove_stale_temporaries(out / "checkpoints");
}

}  // namespace hmla
