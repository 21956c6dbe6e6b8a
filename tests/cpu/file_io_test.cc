// Reading and writing files (file_input.h, file_output.h): outputs never destroy a user's file
// (no fixed temporary name, symlinks written through, inputs and outputs compared by identity
// before anything is written, nothing half-written left on failure), inputs are regular files of
// bounded size read in chunks.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include "feplb/core/error.h"
#include "feplb/core/file_input.h"
#include "feplb/core/file_output.h"
#include "feplb/core/trace_io.h"

namespace feplb {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("feplb_io_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void put(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
}

std::string get(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The names in `dir` (to see that no temporary file is left behind).
std::vector<std::string> names(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Runs fn, expects an InputError whose one-line message contains every part.
template <typename Fn>
void expect_input_error(const Fn& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no InputError";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const std::string& p : parts) {
      EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    }
  }
}

TEST(WriteFile, CreatesTheFileAndLeavesNothingElse) {
  const fs::path dir = scratch("create");
  write_file((dir / "out.json").string(), "hello\n", false);
  EXPECT_EQ(get(dir / "out.json"), "hello\n");
  EXPECT_EQ(names(dir), std::vector<std::string>{"out.json"});
}

TEST(WriteFile, ExistingFileNeedsOverwrite) {
  const fs::path dir = scratch("exists");
  put(dir / "out.json", "keep");
  expect_input_error([&] { write_file((dir / "out.json").string(), "new", false); },
                     {"out.json", "exists", "--force"});
  EXPECT_EQ(get(dir / "out.json"), "keep");
  write_file((dir / "out.json").string(), "new", true);
  EXPECT_EQ(get(dir / "out.json"), "new");
  EXPECT_EQ(names(dir), std::vector<std::string>{"out.json"});
}

// Regression: outputs went through a fixed PATH.tmp, destroying a user's own file of that name.
TEST(WriteFile, AUsersTmpFileIsNotTouched) {
  const fs::path dir = scratch("usertmp");
  put(dir / "r.json.tmp", "mine");
  write_file((dir / "r.json").string(), "report", false);
  EXPECT_EQ(get(dir / "r.json.tmp"), "mine");
  EXPECT_EQ(get(dir / "r.json"), "report");
}

TEST(WriteFile, KeepsTheModeOfAReplacedFile) {
  const fs::path dir = scratch("mode");
  put(dir / "out.json", "old");
  ASSERT_EQ(::chmod((dir / "out.json").c_str(), 0640), 0);
  write_file((dir / "out.json").string(), "new", true);
  struct stat st {};
  ASSERT_EQ(::stat((dir / "out.json").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
}

// Regression: `--md /dev/stdout --force` replaced the /dev/stdout symlink with a regular file.
TEST(WriteFile, ASymlinkIsWrittenThroughNeverReplaced) {
  const fs::path dir = scratch("symlink");
  fs::create_directories(dir / "real");
  put(dir / "real" / "target.json", "old");
  fs::create_symlink("real/target.json", dir / "link.json");
  expect_input_error([&] { write_file((dir / "link.json").string(), "new", false); }, {"exists"});
  write_file((dir / "link.json").string(), "new", true);
  EXPECT_TRUE(fs::is_symlink(dir / "link.json"));
  EXPECT_EQ(get(dir / "real" / "target.json"), "new");
  EXPECT_EQ(names(dir / "real"), std::vector<std::string>{"target.json"});
  // A dangling symlink: its target is created, the link stays.
  fs::create_symlink("real/new.json", dir / "dangling.json");
  write_file((dir / "dangling.json").string(), "created", false);
  EXPECT_TRUE(fs::is_symlink(dir / "dangling.json"));
  EXPECT_EQ(get(dir / "real" / "new.json"), "created");
}

TEST(WriteFile, SpecialFilesAreStreamed) {
  write_file("/dev/null", "discarded", false);  // no --force needed, nothing replaced
  struct stat st {};
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  ::testing::internal::CaptureStdout();
  write_file("-", "to stdout\n", false);
  EXPECT_EQ(::testing::internal::GetCapturedStdout(), "to stdout\n");
  // /dev/full: the write error is reported, not ignored.
  if (fs::exists("/dev/full")) {
    expect_input_error([] { write_file("/dev/full", std::string(1 << 16, 'x'), false); },
                       {"/dev/full", "write failed"});
  }
}

TEST(WriteFile, DirectoriesAndMissingParentsAreNamed) {
  const fs::path dir = scratch("dirs");
  expect_input_error([&] { write_file(dir.string(), "x", true); }, {"is a directory"});
  expect_input_error([&] { write_file((dir / "no" / "such" / "x.json").string(), "x", true); },
                     {"x.json", "does not exist"});
}

// A full disk (here: a file size limit) fails the write with the reason, removes the temporary
// file and leaves the old content in place.
TEST(WriteFile, AFailedWriteLeavesNothingHalfWritten) {
  const fs::path dir = scratch("full");
  put(dir / "out.json", "old content");
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto* const previous = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  bool threw = false;
  std::string msg;
  try {
    write_file((dir / "out.json").string(), std::string(1 << 20, 'x'), true);
  } catch (const InputError& e) {
    threw = true;
    msg = e.what();
  }
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  std::signal(SIGXFSZ, previous);
  EXPECT_TRUE(threw);
  EXPECT_NE(msg.find("write failed"), std::string::npos) << msg;
  EXPECT_EQ(get(dir / "out.json"), "old content");
  EXPECT_EQ(names(dir), std::vector<std::string>{"out.json"});
}

// --- FileSet: every input and output of a command, checked before anything is written --------

TEST(FileSet, AnOutputThatIsAnInputIsRefusedWhateverItsName) {
  const fs::path dir = scratch("same");
  put(dir / "trace.json", "input");
  fs::create_hard_link(dir / "trace.json", dir / "alias.json");
  fs::create_symlink("trace.json", dir / "sym.json");
  for (const fs::path& out :
       {dir / "trace.json", dir / "." / "trace.json", dir / "alias.json", dir / "sym.json"}) {
    SCOPED_TRACE(out.string());
    FileSet files(true);
    files.input("the input trace", (dir / "trace.json").string());
    files.output("--json", out.string());
    expect_input_error([&] { files.check(); }, {"the input trace", "--json"});
  }
  EXPECT_EQ(get(dir / "trace.json"), "input");
}

TEST(FileSet, TwoOutputsNamingTheSameFileAreRefused) {
  const fs::path dir = scratch("twice");
  // Not yet existing: compared by resolved path.
  {
    FileSet files(true);
    files.output("--md", (dir / "r").string());
    files.output("--json", (dir / "sub" / ".." / "r").string());
    fs::create_directories(dir / "sub");
    expect_input_error([&] { files.check(); }, {"--md and --json name the same file"});
  }
  // Existing: compared by identity.
  put(dir / "r", "x");
  {
    FileSet files(true);
    files.output("--md", (dir / "r").string());
    files.output("--json", (dir / "." / "r").string());
    expect_input_error([&] { files.check(); }, {"same file"});
  }
  EXPECT_EQ(get(dir / "r"), "x");
}

TEST(FileSet, NoOutputInsideAnInputDirectory) {
  const fs::path dir = scratch("indir");
  fs::create_directories(dir / "priors");
  put(dir / "priors" / "p.json", "{}");
  FileSet files(true);
  files.input_dir("the --priors directory", (dir / "priors").string());
  files.output("--md", (dir / "priors" / "report.md").string());
  expect_input_error([&] { files.check(); }, {"report.md", "inside the --priors directory"});
  FileSet ok(true);
  ok.input_dir("the --priors directory", (dir / "priors").string());
  ok.output("--md", (dir / "report.md").string());
  EXPECT_NO_THROW(ok.check());
}

TEST(FileSet, ExistingOutputsNeedForceAndStreamsDoNot) {
  const fs::path dir = scratch("force");
  put(dir / "out.json", "x");
  FileSet files(false);
  files.output("--json", "/dev/null");
  files.output("--md", "-");
  EXPECT_NO_THROW(files.check());
  files.output("--plot", (dir / "out.json").string());
  expect_input_error([&] { files.check(); }, {"out.json", "exists", "--force"});
}

// Standard output carries one output at most (two would be one stream of both), and a command
// learns whether it carries one (its tables then go to standard error).
TEST(FileSet, TwoOutputsOnOneStreamAreRefused) {
  FileSet two(false);
  two.output("--json", "-");
  two.output("--plot", "/dev/stdout");
  expect_input_error([&] { two.check(); },
                     {"--json", "--plot", "standard output", "give one of them a file"});
  FileSet one(false);
  one.output("--json", "-");
  one.output("--md", "/dev/stderr");
  EXPECT_NO_THROW(one.check());
  EXPECT_TRUE(one.writes_stdout());
  FileSet none(false);
  none.output("--json", "/dev/stderr");
  EXPECT_FALSE(none.writes_stdout());
}

// --- FileSet::commit: all of a command's outputs, or none ------------------------------------

// Runs fn under a file size limit of `bytes` (SIGXFSZ ignored: writes past it fail with EFBIG,
// as on a full disk) and returns the InputError's message ("" if none).
template <typename Fn>
std::string error_under_size_limit(rlim_t bytes, const Fn& fn) {
  struct rlimit old {};
  EXPECT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto* const previous = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = bytes;
  EXPECT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string msg;
  try {
    fn();
  } catch (const InputError& e) {
    msg = e.what();
  }
  EXPECT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  std::signal(SIGXFSZ, previous);
  return msg;
}

TEST(FileSetCommit, WritesEveryOutputOrNone) {
  const fs::path dir = scratch("commit");
  put(dir / "old.json", "old");
  const auto run = [&](bool force) {
    FileSet files(force);
    files.output("--md", (dir / "r.md").string());
    files.output("--json", (dir / "old.json").string());
    files.check();
    files.stage((dir / "r.md").string(), "small");
    files.stage((dir / "old.json").string(), std::string(1 << 16, 'x'));
    return files.commit();
  };
  // The second output does not fit: neither is written, the replaced file keeps its content.
  const std::string msg = error_under_size_limit(4096, [&] { run(true); });
  EXPECT_NE(msg.find("old.json: write failed"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nothing was written"), std::string::npos) << msg;
  EXPECT_EQ(names(dir), std::vector<std::string>{"old.json"});
  EXPECT_EQ(get(dir / "old.json"), "old");
  // Room for both: both, in the order staged.
  EXPECT_EQ(run(true),
            (std::vector<std::string>{(dir / "r.md").string(), (dir / "old.json").string()}));
  EXPECT_EQ(get(dir / "r.md"), "small");
  EXPECT_EQ(get(dir / "old.json"), std::string(1 << 16, 'x'));
  EXPECT_EQ(names(dir), (std::vector<std::string>{"old.json", "r.md"}));
}

// A signal (SIGINT, SIGTERM, SIGHUP) that ends the process while it commits leaves no temporary
// file and the outputs all or none: children commit three outputs (one replacing a file) and are
// interrupted at times spread over a commit's duration.
TEST(FileSetCommit, ASignalMeanwhileLeavesNoTemporaryFileAndAllOrNothing) {
  const fs::path dir = scratch("signal");
  const std::string big(8 << 20, 'n');
  const auto child = [&] {
    FileSet files(true);
    for (const char* name : {"a.json", "b.svg", "old.json"})
      files.output(name, (dir / name).string());
    files.check();
    for (const char* name : {"a.json", "b.svg", "old.json"})
      files.stage((dir / name).string(), big);
    files.commit();
  };
  const auto reset = [&] {
    for (const auto& e : fs::directory_iterator(dir)) fs::remove(e.path());
    put(dir / "old.json", "old");
  };
  // How long a commit takes here (a child run to its end).
  reset();
  const auto t0 = std::chrono::steady_clock::now();
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    child();
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const double commit_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  int interrupted = 0;
  const int rounds = 30;
  for (int i = 0; i < rounds; ++i) {
    reset();
    const int sig = i % 3 == 0 ? SIGINT : (i % 3 == 1 ? SIGTERM : SIGHUP);
    pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      child();
      ::_exit(0);
    }
    ::usleep(static_cast<useconds_t>(commit_us * 1.2 * i / rounds));
    ::kill(pid, sig);
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    interrupted += WIFSIGNALED(status);
    const std::vector<std::string> left = names(dir);
    for (const std::string& n : left)
      EXPECT_EQ(n.rfind(".feplb-", 0), std::string::npos) << "round " << i << ": " << n << " left";
    const bool all = left == std::vector<std::string>{"a.json", "b.svg", "old.json"} &&
                     get(dir / "old.json") == big;
    const bool none =
        left == std::vector<std::string>{"old.json"} && get(dir / "old.json") == "old";
    EXPECT_TRUE(all || none) << "round " << i << ": neither every output nor none";
  }
  EXPECT_GT(interrupted, 0) << "no child was interrupted; the test did not test";
}

TEST(FileSetCommit, AFailedSpecialFileLeavesNoRegularOutput) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  const fs::path dir = scratch("commit_full");
  FileSet files(false);
  files.output("--json", (dir / "ok.json").string());
  files.output("--plot", "/dev/full");
  files.check();
  files.stage((dir / "ok.json").string(), "{}");
  files.stage("/dev/full", std::string(1 << 16, 'x'));
  expect_input_error([&] { files.commit(); }, {"/dev/full: write failed", "nothing was written"});
  EXPECT_TRUE(names(dir).empty());
}

TEST(FileSetCommit, AFileThatAppearedMeanwhileIsNotReplaced) {
  const fs::path dir = scratch("commit_race");
  FileSet files(false);
  files.output("--json", (dir / "r.json").string());
  files.check();
  put(dir / "r.json", "theirs");  // after the check, before the write
  files.stage((dir / "r.json").string(), "ours");
  expect_input_error([&] { files.commit(); }, {"r.json: exists", "nothing was written"});
  EXPECT_EQ(get(dir / "r.json"), "theirs");
  EXPECT_EQ(names(dir), std::vector<std::string>{"r.json"});
}

// The temporary file has a short name: a file name of NAME_MAX (255) bytes can be written.
TEST(FileSetCommit, ALongestFileNameIsWritten) {
  const fs::path dir = scratch("long_name");
  const std::string name = std::string(250, 'n') + ".json";
  ASSERT_EQ(name.size(), 255u);
  write_file((dir / name).string(), "x", false);
  EXPECT_EQ(get(dir / name), "x");
  EXPECT_EQ(names(dir), std::vector<std::string>{name});
}

// A FIFO no process reads is refused by check() at once (opening it for writing would block);
// with a reader it is kept open until commit().
TEST(FileSetCommit, AFifoWithoutAReaderIsRefusedNotWaitedFor) {
  const fs::path dir = scratch("fifo_out");
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  FileSet alone(false);
  alone.output("--json", (dir / "fifo").string());
  expect_input_error([&] { alone.check(); }, {"fifo", "no process is reading"});
  const int reader = ::open((dir / "fifo").c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  FileSet files(false);
  files.output("--json", (dir / "fifo").string());
  files.check();
  files.stage((dir / "fifo").string(), "through the pipe");
  files.commit();
  char buf[64] = {};
  EXPECT_EQ(::read(reader, buf, sizeof buf), 16);
  EXPECT_EQ(std::string(buf), "through the pipe");
  ::close(reader);
}

// Truncated at the NUL, these paths would name other files: refused whole.
TEST(FileSetCommit, PathsWithANulAreRefused) {
  const fs::path dir = scratch("nul");
  put(dir / "t.json", "x");
  const std::string with_nul = (dir / "t.json").string() + std::string(1, '\0') + "x";
  expect_input_error([&] { write_file(with_nul, "y", true); }, {"NUL byte"});
  expect_input_error([&] { read_trace(with_nul); }, {"NUL byte"});
  EXPECT_EQ(get(dir / "t.json"), "x");
}

// --- Inputs ----------------------------------------------------------------------------------

TEST(ByteSource, OnlyRegularFilesAreRead) {
  const fs::path dir = scratch("inputs");
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  // A FIFO nobody writes: refused at once, not read (which would block forever).
  expect_input_error([&] { read_trace((dir / "fifo").string()); }, {"fifo", "a FIFO"});
  expect_input_error([] { read_trace("/dev/zero"); }, {"/dev/zero", "character device"});
  expect_input_error([&] { read_trace(dir.string()); }, {"directory"});
  expect_input_error([&] { read_trace((dir / "none.json").string()); }, {"no such file"});
}

TEST(ByteSource, SizeLimitIsCheckedBeforeReading) {
  const fs::path dir = scratch("limit");
  put(dir / "big", std::string(100000, ' '));
  expect_input_error([&] { ByteSource s((dir / "big").string(), "test-format", 1000); },
                     {"100000 bytes", "test-format", "1000"});
  expect_input_error([] { ByteSource s(std::string_view("12345"), "test-format", 4); },
                     {"larger than"});
}

TEST(ByteSource, ReadsInChunksAcrossBoundaries) {
  const fs::path dir = scratch("chunks");
  std::string text;
  for (int i = 0; i < 300000; ++i) text += static_cast<char>('a' + i % 26);
  put(dir / "f", text);
  ByteSource s((dir / "f").string(), "test-format", 1 << 20);
  std::string back;
  for (auto it = s.begin(); it != ByteSource::end(); ++it) back += *it;
  EXPECT_EQ(back, text);
  EXPECT_EQ(s.consumed(), 300000);
}

}  // namespace
}  // namespace feplb
