// What hmla may read and write: input files (regular files only, refused before any read), output
// paths (regular file or new path only, checked by every writer), the temporaries killed writers
// leave, plain names, and flock-based locks (a held lock refuses with its holder; a stale one does not).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
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

// Runs fn in a child process that SIGALRM ends after `seconds`: true when fn returned true in time
// (a read that blocks on a FIFO would otherwise hang the whole test binary).
bool in_child_within(int seconds, const std::function<bool()>& fn) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(unsigned(seconds));
    bool ok = false;
    try {
      ok = fn();
    } catch (...) {
    }
    ::_exit(ok ? 0 : 1);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

// IoError from read_file naming `needle`, and nothing else.
bool refused(const std::string& path, const std::string& needle) {
  try {
    read_file(path);
  } catch (const IoError& e) {
    return std::string(e.what()).find(needle) != std::string::npos &&
           std::string(e.what()).find("hmla reads only regular files") != std::string::npos;
  }
  return false;
}

TEST(InputPaths, ReadingRefusesWhatIsNotARegularFileBeforeAnyRead) {
  TempDir t;
  ASSERT_EQ(::mkfifo((t / "fifo").c_str(), 0600), 0);
  fs::create_directories(t / "dir");
  write(t / "file", "data");
  fs::create_symlink(t / "file", t / "link");
  fs::create_symlink(t / "fifo", t / "fifo_link");
  // A FIFO without a writer blocked the read forever; /dev/zero never ended; a directory read as "".
  EXPECT_TRUE(in_child_within(10, [&] { return refused(t / "fifo", "is a FIFO"); }));
  EXPECT_TRUE(in_child_within(10, [&] { return refused(t / "fifo_link", "is a FIFO"); }));
  EXPECT_TRUE(in_child_within(10, [&] { return refused("/dev/zero", "is a device node"); }));
  EXPECT_TRUE(in_child_within(10, [&] { return refused(t / "dir", "is a directory"); }));
  const int sock = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", (t / "sock").c_str());
  if (sock >= 0 && ::bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0)
    EXPECT_TRUE(in_child_within(10, [&] { return refused(t / "sock", "is a socket"); }));
  if (sock >= 0) ::close(sock);
  EXPECT_EQ(read_file(t / "link"), "data");  // a symlink to a regular file is that file
  EXPECT_THROW(read_file(t / "missing"), IoError);
  EXPECT_THROW(load_safetensors(t / "fifo"), IoError);  // every reader goes through read_file
}

TEST(InputPaths, ASizeBoundIsCheckedBeforeReading) {
  TempDir t;
  write(t / "f", std::string(1000, 'x'));
  EXPECT_EQ(read_file(t / "f", 1000).size(), 1000u);
  try {
    read_file(t / "f", 999);
    ADD_FAILURE() << "accepted";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("more than the 999 B hmla reads"), std::string::npos) << e.what();
  }
  write(t / "big", std::string(300000, 'y'));  // larger than one read: the loop reads it whole
  EXPECT_EQ(read_file(t / "big"), std::string(300000, 'y'));
  write(t / "empty", "");
  EXPECT_EQ(read_file(t / "empty"), "");
}

// A pid that existed and has ended: a child that exits at once, reaped.
pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

TEST(OutputPaths, TemporariesOfDeadWritersAreRemovedAndNothingElse) {
  TempDir t;
  const std::string dead = std::to_string(dead_pid()), live = std::to_string(::getppid());
  write(t / (".out.tmp." + dead), "a killed writer's half file");
  write(t / (".out.tmp." + live), "a live writer's file");
  write(t / (".other.tmp." + dead), "another target's temporary");
  write(t / (".out.tmp." + dead + "x"), "not a pid");
  write(t / "victim", "keep");
  const std::string dead2 = std::to_string(dead_pid());
  fs::create_symlink(t / "victim", t / (".out.tmp." + dead2));  // not a file a writer made
  // A lock on it: a writer elsewhere (another host sharing the directory) is still writing it.
  const std::string held = t / (".out.tmp." + std::to_string(dead_pid()));
  write(held, "a remote writer's file");
  const int fd = ::open(held.c_str(), O_RDONLY);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  write_file_atomic(t / "out", "data");
  EXPECT_TRUE(fs::exists(held));
  ::close(fd);
  EXPECT_EQ(read_file(t / "out"), "data");
  EXPECT_FALSE(fs::exists(fs::symlink_status(t / (".out.tmp." + dead))));
  EXPECT_TRUE(fs::exists(t / (".out.tmp." + live)));
  EXPECT_TRUE(fs::exists(t / (".other.tmp." + dead)));
  EXPECT_TRUE(fs::exists(t / (".out.tmp." + dead + "x")));
  EXPECT_TRUE(fs::is_symlink(t / (".out.tmp." + dead2)));
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
