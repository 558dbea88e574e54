// What hmla may write: output paths (regular file or new path only, checked by every writer),
// plain names, and flock-based locks (a held lock refuses with its holder; a stale one does not).
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "hmla/io/paths.h"
#include "hmla/io/safetensors.h"

namespace hmla::io {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path dir = fs::temp_directory_path() / ("hmla_paths_" + std::to_string(::getpid()));
  TempDir() {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TempDir() { fs::remove_all(dir); }
  std::string operator/(const std::string& name) const { return (dir / name).string(); }
};

void write(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const IoError& e) {
    return e.what();
  }
  return "";
}

TEST(OutputPaths, RegularFilesAndNewPathsOnly) {
  TempDir t;
  write(t / "file", "x");
  ASSERT_EQ(::mkfifo((t / "fifo").c_str(), 0600), 0);
  fs::create_symlink(t / "file", t / "link");
  fs::create_symlink(t / "nowhere", t / "dangling");
  fs::create_directories(t / "dir");
  EXPECT_NO_THROW(check_output_file(t / "file", "--out"));
  EXPECT_NO_THROW(check_output_file(t / "new", "--out"));
  EXPECT_NE(message_of([&] { check_output_file(t / "fifo", "--out"); }).find("is a FIFO"), std::string::npos);
  EXPECT_NE(message_of([&] { check_output_file(t / "link", "--out"); }).find("symbolic link"), std::string::npos);
  EXPECT_NE(message_of([&] { check_output_file(t / "dangling", "--out"); }).find("symbolic link"), std::string::npos);
  EXPECT_NE(message_of([&] { check_output_file(t / "dir", "--out"); }).find("is a directory"), std::string::npos);
  EXPECT_NE(message_of([&] { check_output_file("/dev/null", "--out"); }).find("device node"), std::string::npos);
  EXPECT_NE(message_of([&] { check_output_file(t / "no/such/file", "--out"); }).find("does not exist"),
            std::string::npos);
  EXPECT_NE(message_of([&] { check_output_file("", "--out"); }).find("--out is empty"), std::string::npos);
}

TEST(OutputPaths, EveryWriterRefusesWhatIsNotARegularFile) {
  TempDir t;
  write(t / "target", "keep");
  fs::create_symlink(t / "target", t / "link");
  ASSERT_EQ(::mkfifo((t / "fifo").c_str(), 0600), 0);
  EXPECT_THROW(write_file_atomic(t / "link", "new"), IoError);
  EXPECT_THROW(save_safetensors(t / "fifo", {}), IoError);
  EXPECT_TRUE(fs::is_symlink(t / "link"));
  EXPECT_TRUE(fs::is_fifo(t / "fifo"));
  EXPECT_EQ(read_file(t / "target"), "keep");
  EXPECT_EQ(std::distance(fs::directory_iterator(t.dir), fs::directory_iterator()), 3);  // no temporaries left
  write_file_atomic(t / "target", "new");
  EXPECT_EQ(read_file(t / "target"), "new");
}

TEST(OutputPaths, AStaleTemporaryIsReplacedNotFollowed) {
  TempDir t;
  write(t / "victim", "keep");
  fs::create_symlink(t / "victim", t / (".out.tmp." + std::to_string(::getpid())));  // what a hostile user could plant
  write_file_atomic(t / "out", "data");
  EXPECT_EQ(read_file(t / "out"), "data");
  EXPECT_EQ(read_file(t / "victim"), "keep");
}

TEST(PlainNames, OneComponentFromAConservativeCharset) {
  for (const char* ok : {"pre", "dsa_sparse", "phase-2.b", "A1", "x"}) EXPECT_TRUE(is_plain_name(ok)) << ok;
  for (const char* bad : {"", ".", "..", ".hidden", "a/b", "../x", "a..b", "a b", "a\\b", "x\n", "caf\xc3\xa9"})
    EXPECT_FALSE(is_plain_name(bad)) << bad;
  EXPECT_TRUE(is_plain_name(std::string(kMaxNameLength, 'a')));
  EXPECT_FALSE(is_plain_name(std::string(kMaxNameLength + 1, 'a')));
  EXPECT_THROW(check_path_name("../up", "latest"), IoError);
}

TEST(FileLock, HeldLocksRefuseWithTheirHolderAndStaleOnesDoNot) {
  TempDir t;
  const std::string dead = "pid 999999 on host gone since 2000-01-01T00:00:00Z";  // a dead holder's line
  write(t / "lock", dead + "\n");
  {
    FileLock a = FileLock::acquire(t / "lock", "the run");
    EXPECT_TRUE(a.held());
    EXPECT_EQ(read_file(t / "lock"), dead + "\n");  // taking the lock writes nothing
    a.announce("pid 1 on host here");
    // flock belongs to the open file: a second open in this very process conflicts like another process.
    std::string msg = message_of([&] { FileLock::acquire(t / "lock", "the run"); });
    EXPECT_NE(msg.find("the run is in use by pid 1 on host here"), std::string::npos) << msg;
    msg = message_of([&] { FileLock::check_free(t / "lock", "the run"); });
    EXPECT_NE(msg.find("in use by pid 1 on host here"), std::string::npos) << msg;
  }
  EXPECT_NO_THROW(FileLock::check_free(t / "lock", "the run"));
  FileLock b = FileLock::acquire(t / "lock", "the run");  // released with its holder
  b.announce("pid 2");
  EXPECT_EQ(read_file(t / "lock"), "pid 2\n");
  fs::create_symlink(t / "lock", t / "linked");
  EXPECT_THROW(FileLock::acquire(t / "linked", "the run"), IoError);
}

TEST(FileLock, ALineNamingADeadProcessOfThisHostIsNotReportedAsTheHolder) {
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof(host) - 1), 0);
  EXPECT_TRUE(names_live_process(process_identity()));
  EXPECT_FALSE(names_live_process("pid 2147483646 on host " + std::string(host) + " since then"));
  EXPECT_TRUE(names_live_process("pid 2147483646 on host elsewhere.example since then"));  // cannot tell
  EXPECT_TRUE(names_live_process("anything else"));
}

}  // namespace
}  // namespace hmla::io
