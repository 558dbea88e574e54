// A run owns only its directory: what RunDir accepts (new, empty, an hmla run being resumed, a
// run that never reached a checkpoint), what it refuses without changing anything (foreign
// files, its own inputs, a held lock, nothing to resume; claiming writes nothing before begin),
// and where checkpoints/latest may lead (only to a checkpoint directory of the run).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "hmla/io/safetensors.h"
#include "hmla/train/run_dir.h"

namespace hmla {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path dir = fs::temp_directory_path() / ("hmla_run_dir_" + std::to_string(::getpid()));
  TempDir() {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TempDir() { fs::remove_all(dir); }
};

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

// Every entry under `root` with its type and content: equal snapshots mean nothing changed.
std::map<std::string, std::string> snapshot(const fs::path& root) {
  std::map<std::string, std::string> m;
  if (!fs::exists(root)) return m;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    const std::string rel = fs::relative(e.path(), root).string();
    if (e.is_symlink()) m[rel] = "link:" + fs::read_symlink(e.path()).string();
    else if (e.is_regular_file()) m[rel] = io::read_file(e.path().string());
    else m[rel] = "dir";
  }
  return m;
}

Programme programme(const fs::path& dir) {
  Programme pr;
  pr.path = (dir / "p.yaml").string();
  pr.model_config = (dir / "inputs" / "config.json").string();
  pr.data_dir = (dir / "inputs" / "data").string();
  return pr;
}

template <class E>
std::string refusal(const Programme& pr, const fs::path& out, bool resume) {
  try {
    RunDir::claim(pr, out.string(), resume).begin();
  } catch (const E& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(RunDir, NewAndEmptyDirectoriesBecomeLockedMarkedRuns) {
  TempDir t;
  const Programme pr = programme(t.dir);
  {
    RunDir d = RunDir::claim(pr, (t.dir / "new" / "run").string(), false);
    EXPECT_FALSE(fs::exists(t.dir / "new"));  // created when the run begins, after all its checks
    d.begin();
    EXPECT_TRUE(fs::is_regular_file(t.dir / "new" / "run" / kRunMarker));
    const std::string msg = refusal<IoError>(pr, t.dir / "new" / "run", false);
    EXPECT_NE(msg.find("in use by pid " + std::to_string(::getpid())), std::string::npos) << msg;
  }
  // The holder is gone (its lock file stays): a run that never reached a checkpoint starts again.
  EXPECT_NO_THROW(RunDir::claim(pr, (t.dir / "new" / "run").string(), false).begin());
  fs::create_directories(t.dir / "empty");
  EXPECT_NO_THROW(RunDir::claim(pr, (t.dir / "empty").string(), false).begin());
}

TEST(RunDir, RefusalsChangeNothing) {
  TempDir t;
  const Programme pr = programme(t.dir);
  write(t.dir / "mine" / "notes.txt", "user data");
  write(t.dir / "ckpt" / "config.json", "{}");
  write(t.dir / "ckpt" / "model.safetensors", "weights");
  write(t.dir / "finished" / kRunMarker, "{}");
  write(t.dir / "finished" / "model.safetensors", "final weights");  // checkpoints deleted by the user
  write(t.dir / "done" / kRunMarker, "{}");
  write(t.dir / "done" / "checkpoints" / "latest", "0-a-end\n");
  fs::create_directories(t.dir / "done" / "checkpoints" / "0-a-end");
  write(t.dir / "afile", "x");
  Programme init = pr;
  init.init_checkpoint = (t.dir / "ckpt" / "model.safetensors").string();
  const auto before = snapshot(t.dir);
  auto says = [&](const Programme& p, const std::string& out, bool resume, const char* needle) {
    const std::string msg = refusal<ConfigError>(p, t.dir / out, resume);
    EXPECT_NE(msg.find(needle), std::string::npos) << out << (resume ? " --resume: " : ": ") << msg;
  };
  says(pr, "mine", false, "neither empty nor an hmla run");
  says(init, "ckpt", false, "is the directory of init_checkpoint");
  says(init, "", false, "holds init_checkpoint");
  says(pr, "finished", false, "no checkpoint to resume from");
  says(pr, "done", false, "--resume");
  says(pr, "afile", false, "not a directory");
  says(pr, "missing", true, "does not exist");
  says(pr, "mine", true, "is not an hmla run");
  says(pr, "finished", true, "no checkpoint yet");
  EXPECT_EQ(snapshot(t.dir), before);
}

TEST(RunDir, LatestStaysInsideTheRun) {
  TempDir t;
  const fs::path ck = t.dir / "run" / "checkpoints";
  fs::create_directories(ck / "0-pre-end");
  fs::create_directories(t.dir / "outside");
  write(ck / "latest", "0-pre-end\n");
  EXPECT_EQ(latest_checkpoint(ck), ck / "0-pre-end");
  for (const std::string bad : {"../../outside", "/tmp", "0-pre-end/..", ".hidden", "", "0-pre-end\n\n", "gone"}) {
    write(ck / "latest", bad);
    EXPECT_THROW(latest_checkpoint(ck), IoError) << bad;
  }
  fs::remove(ck / "latest");
  fs::create_symlink(ck / "0-pre-end", ck / "linked");
  write(ck / "latest", "linked\n");
  EXPECT_THROW(latest_checkpoint(ck), IoError);  // a symlinked checkpoint may lead anywhere
}

TEST(RunDir, ResumesRunsWithAndWithoutTheMarkerAndCleansTemporaries) {
  TempDir t;
  const Programme pr = programme(t.dir);
  const fs::path run = t.dir / "legacy";  // from before hmla-run.json: checkpoints/latest marks it
  write(run / "checkpoints" / "latest", "0-pre-end\n");
  fs::create_directories(run / "checkpoints" / "0-pre-end");
  fs::create_directories(run / "checkpoints" / ".0-pre-step4.tmp");  // a save killed half-way
  {
    RunDir d = RunDir::claim(pr, run.string(), true);  // locked now, but nothing written
    EXPECT_FALSE(fs::exists(run / kRunMarker));
    EXPECT_TRUE(fs::exists(run / "checkpoints" / ".0-pre-step4.tmp"));
    EXPECT_NE(refusal<IoError>(pr, run, true).find("in use by another process"), std::string::npos);
    d.begin();
  }
  EXPECT_TRUE(fs::is_regular_file(run / kRunMarker));
  EXPECT_FALSE(fs::exists(run / "checkpoints" / ".0-pre-step4.tmp"));
  fs::create_symlink(t.dir / "elsewhere", run / "metrics.jsonl");
  const auto before = snapshot(t.dir);
  EXPECT_THROW(RunDir::claim(pr, run.string(), true), IoError);  // its writes would leave the run
  EXPECT_EQ(snapshot(t.dir), before);
}

}  // namespace
}  // namespace hmla
