#include "feplb/core/file_output.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>

#include "feplb/core/internal/signal_cleanup.h"
#include "feplb/core/text.h"

namespace feplb {
namespace {

namespace fs = std::filesystem;
using internal::SignalBlock;
using internal::SignalCleanup;

// What an output path names.
struct Target {
  enum Kind { kStream, kSpecial, kRegular, kMissing } kind = kMissing;
  int fd = -1;    // kStream: the descriptor to write to
  dev_t dev = 0;  // kRegular, kSpecial: identity
  ino_t ino = 0;
  std::string resolved;  // kRegular, kMissing: the path with every symlink resolved
};

// "-", /dev/stdout, /dev/stderr, /dev/fd/N and /proc/self/fd/N: the descriptor they name.
std::optional<int> stream_fd(const std::string& path) {
  if (path == "-" || path == "/dev/stdout") return STDOUT_FILENO;
  if (path == "/dev/stderr") return STDERR_FILENO;
  for (const char* prefix : {"/dev/fd/", "/proc/self/fd/"}) {
    const std::string_view p(prefix);
    if (path.size() > p.size() && path.compare(0, p.size(), p) == 0) {
      const std::string digits = path.substr(p.size());
      if (digits.find_first_not_of("0123456789") == std::string::npos && digits.size() < 6) {
        return std::atoi(digits.c_str());
      }
    }
  }
  return std::nullopt;
}

std::string errno_text(int err) { return std::strerror(err); }

// The absolute path of `dir` with its symlinks resolved; InputError naming `path` when it is
// missing.
std::string real_dir(const std::string& path, const fs::path& dir) {
  const fs::path d = dir.empty() ? fs::path(".") : dir;
  char buf[PATH_MAX];
  if (::realpath(d.c_str(), buf) == nullptr) {
    const int err = errno;
    FEPLB_REQUIRE_INPUT(err != ENOENT && err != ENOTDIR, "{}: directory {} does not exist", path,
                        d.string());
    throw InputError(
        fmt::format("{}: cannot access directory {} ({})", path, d.string(), errno_text(err)));
  }
  struct stat st {};
  FEPLB_REQUIRE_INPUT(::stat(buf, &st) == 0 && S_ISDIR(st.st_mode), "{}: {} is not a directory",
                      path, d.string());
  return buf;
}

Target inspect(const std::string& path) {
  Target t;
  if (const auto fd = stream_fd(path)) {
    t.kind = Target::kStream;
    t.fd = *fd;
    return t;
  }
  FEPLB_REQUIRE_INPUT(!path.empty(), "an output path is empty");
  FEPLB_REQUIRE_INPUT(path.find('\0') == std::string::npos, "{}: a path with a NUL byte",
                      printable(path));
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    FEPLB_REQUIRE_INPUT(!S_ISDIR(st.st_mode), "{}: is a directory; name a file", path);
    t.dev = st.st_dev;
    t.ino = st.st_ino;
    if (!S_ISREG(st.st_mode)) {
      t.kind = Target::kSpecial;
      return t;
    }
    t.kind = Target::kRegular;
    char buf[PATH_MAX];
    FEPLB_REQUIRE_INPUT(::realpath(path.c_str(), buf) != nullptr, "{}: cannot resolve ({})", path,
                        errno_text(errno));
    t.resolved = buf;
    return t;
  }
  const int err = errno;
  FEPLB_REQUIRE_INPUT(err == ENOENT, "{}: cannot access ({})", path, errno_text(err));
  // Missing: follow a dangling symlink to where it points, then resolve the directory.
  fs::path p = path;
  for (int hops = 0;; ++hops) {
    struct stat lst {};
    if (::lstat(p.c_str(), &lst) != 0 || !S_ISLNK(lst.st_mode)) break;
    FEPLB_REQUIRE_INPUT(hops < 40, "{}: too many levels of symbolic links", path);
    std::error_code ec;
    const fs::path target = fs::read_symlink(p, ec);
    FEPLB_REQUIRE_INPUT(!ec, "{}: cannot read the symlink ({})", path, ec.message());
    p = target.is_absolute() ? target : p.parent_path() / target;
  }
  FEPLB_REQUIRE_INPUT(p.has_filename() && p.filename() != "." && p.filename() != "..",
                      "{}: not a file name", path);
  t.kind = Target::kMissing;
  t.resolved = (fs::path(real_dir(path, p.parent_path())) / p.filename()).string();
  return t;
}

// Writes all of `data` to `fd`; 0 or the errno of the failure.
int write_all(int fd, std::string_view data) {
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return 0;
}

// 0, or the errno of writing `content` to a stream ("-" is standard output, through stdio).
int write_stream(int fd, std::string_view content) {
  if (fd == STDOUT_FILENO) {
    errno = 0;
    const size_t n = std::fwrite(content.data(), 1, content.size(), stdout);
    if (n == content.size() && std::fflush(stdout) == 0) return 0;
    return errno ? errno : EIO;
  }
  std::fflush(stdout);  // keep the order of what reaches a shared terminal or file
  return write_all(fd, content);
}

// A new empty file with a short unique name (".feplb-XXXXXX": a 255-byte target name still fits
// NAME_MAX) in `dir`, tracked for SignalCleanup (`slot`) from the moment it exists; its
// descriptor, and its path in `tmp`. -1 and errno on failure.
int make_temp(const fs::path& dir, std::string& tmp, int& slot) {
  tmp = (dir / ".feplb-XXXXXX").string();
  const SignalBlock hold;
  const int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
  const int err = errno;
  if (fd >= 0) slot = SignalCleanup::track(SignalCleanup::kUnlink, tmp);
  errno = err;
  return fd;
}

// The mode a new file gets (0666 less the umask).
mode_t new_file_mode() {
  const mode_t mask = ::umask(0);
  ::umask(mask);
  return 0666 & ~mask;
}

// Writes `content` to a temporary file beside `t.resolved` with the mode the target has (or a new
// file gets), flushed to disk; its path (tracked for SignalCleanup in `slot`), or InputError
// naming `path` (nothing left behind).
std::string write_temp(const std::string& path, const Target& t, std::string_view content,
                       int& slot) {
  const fs::path dir = fs::path(t.resolved).parent_path();
  std::string tmp;
  const int fd = make_temp(dir, tmp, slot);
  FEPLB_REQUIRE_INPUT(fd >= 0, "{}: cannot create a file in {} ({})", path, dir.string(),
                      errno_text(errno));
  mode_t mode = new_file_mode();
  struct stat st {};
  if (t.kind == Target::kRegular && ::stat(t.resolved.c_str(), &st) == 0) mode = st.st_mode & 07777;
  int err = write_all(fd, content);
  if (err == 0 && ::fchmod(fd, mode) != 0) err = errno;
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    SignalCleanup::untrack(slot);
    throw InputError(fmt::format("{}: write failed ({})", path, errno_text(err)));
  }
  return tmp;
}

// A regular output on its way into place: its temporary file, and once placed, how to undo it.
struct Placing {
  std::string path, resolved, tmp;
  std::string backup;    // the replaced file, kept aside until every output is in place
  bool placed = false;   // `resolved` now holds the new content
  bool created = false;  // ... and did not exist before
  // SignalCleanup's slots: the temporary file; the undo of placing (the new file, or the backup).
  int tmp_slot = -1, undo_slot = -1;
};

// Moves `p.tmp` to `p.resolved`. A new file by link, which fails if a file appeared there
// meanwhile (EEXIST); with `overwrite`, an existing one by rename, the replaced file kept aside as
// `p.backup` (a hard link) until every output is in place. 0 or the errno. Signals wait until
// the file system and SignalCleanup's records agree again.
int place(Placing& p, bool overwrite) {
  const SignalBlock hold;
  struct stat st {};
  const bool exists = ::stat(p.resolved.c_str(), &st) == 0;
  if (!exists || !overwrite) {
    if (::link(p.tmp.c_str(), p.resolved.c_str()) == 0) {
      p.undo_slot = SignalCleanup::track(SignalCleanup::kUnlink, p.resolved);
      ::unlink(p.tmp.c_str());
      SignalCleanup::untrack(p.tmp_slot);
      p.placed = p.created = true;
      return 0;
    }
    if (errno == EEXIST || exists) return EEXIST;
    // A file system without hard links: rename.
  }
  if (exists) {
    p.backup = p.tmp + "~";
    if (::link(p.resolved.c_str(), p.backup.c_str()) != 0) {
      p.backup.clear();
    } else {  // a signal from here on puts it back
      p.undo_slot = SignalCleanup::track(SignalCleanup::kRestore, p.backup, p.resolved);
    }
  }
  if (::rename(p.tmp.c_str(), p.resolved.c_str()) != 0) {
    const int err = errno;
    if (!p.backup.empty()) ::unlink(p.backup.c_str());
    SignalCleanup::untrack(p.undo_slot);
    p.backup.clear();
    return err;
  }
  SignalCleanup::untrack(p.tmp_slot);
  if (!exists) p.undo_slot = SignalCleanup::track(SignalCleanup::kUnlink, p.resolved);
  p.placed = true;
  p.created = !exists;
  return 0;
}

// Undoes a placed output: the replaced file back, or the new one removed. False if it cannot be.
bool unplace(const Placing& p) {
  if (!p.backup.empty()) return ::rename(p.backup.c_str(), p.resolved.c_str()) == 0;
  if (p.created) return ::unlink(p.resolved.c_str()) == 0;
  return false;
}

// How an output is named in messages.
std::string shown(const std::string& path) { return path == "-" ? "standard output" : path; }

// "; nothing was written", or what was and was not.
std::string written_note(const std::vector<std::string>& written,
                         const std::vector<std::string>& not_written) {
  if (written.empty()) return "; nothing was written";
  return fmt::format("; written: {}; not written: {}", fmt::join(written, ", "),
                     not_written.empty() ? "-" : fmt::format("{}", fmt::join(not_written, ", ")));
}

bool same_file(const Target& a, const Target& b) {
  if (a.kind == Target::kRegular && b.kind == Target::kRegular) {
    return a.dev == b.dev && a.ino == b.ino;
  }
  if (a.kind == Target::kMissing && b.kind == Target::kMissing) return a.resolved == b.resolved;
  return false;
}

// InputError naming `path` unless a new file can be created in the directory of `resolved`.
void require_writable_dir(const std::string& path, const std::string& resolved) {
  const fs::path dir = fs::path(resolved).parent_path();
  std::string probe;
  int slot = -1;
  const int fd = make_temp(dir, probe, slot);
  FEPLB_REQUIRE_INPUT(fd >= 0, "{}: cannot create a file in {} ({}); nothing was written", path,
                      dir.string(), errno_text(errno));
  ::close(fd);
  ::unlink(probe.c_str());
  SignalCleanup::untrack(slot);
}

// A special file opened for writing without blocking; InputError for a FIFO no process reads.
int open_special(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    FEPLB_REQUIRE_INPUT(err != ENXIO,
                        "{}: a FIFO that no process is reading (start its reader first); nothing "
                        "was written",
                        path);
    throw InputError(
        fmt::format("{}: cannot open ({}); nothing was written", path, errno_text(err)));
  }
  // Writes block from now on (a reader exists; a pipe may fill while it reads).
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

}  // namespace

FileSet::~FileSet() {
  for (const Output& o : outputs_) {
    if (o.fd >= 0) ::close(o.fd);
  }
}

void FileSet::input(std::string role, std::string path) {
  if (!path.empty()) inputs_.push_back({std::move(role), std::move(path)});
}

void FileSet::input_dir(std::string role, std::string path) {
  if (!path.empty()) input_dirs_.push_back({std::move(role), std::move(path)});
}

void FileSet::output(std::string flag, std::string path) {
  if (path.empty()) return;
  Output out;
  out.entry = {std::move(flag), std::move(path)};
  outputs_.push_back(std::move(out));
}

bool FileSet::writes_stdout() const {
  for (const Output& out : outputs_) {
    const auto fd = stream_fd(out.entry.path);
    if (fd && *fd == STDOUT_FILENO) return true;
  }
  return false;
}

void FileSet::check() {
  std::vector<Target> targets;
  for (const Output& out : outputs_) targets.push_back(inspect(out.entry.path));
  for (size_t i = 0; i < outputs_.size(); ++i) {
    const Entry& out = outputs_[i].entry;
    const Target& t = targets[i];
    if (t.kind == Target::kStream) {
      for (size_t j = 0; j < i; ++j) {
        FEPLB_REQUIRE_INPUT(targets[j].kind != Target::kStream || targets[j].fd != t.fd,
                            "{} and {} both write to {}: one stream would carry both; give one "
                            "of them a file",
                            outputs_[j].entry.role, out.role,
                            t.fd == STDOUT_FILENO   ? std::string("standard output")
                            : t.fd == STDERR_FILENO ? std::string("standard error")
                                                    : fmt::format("descriptor {}", t.fd));
      }
      continue;
    }
    if (t.kind == Target::kSpecial) continue;
    for (const Entry& in : inputs_) {
      if (in.path == "-") continue;
      struct stat st {};
      if (t.kind == Target::kRegular && ::stat(in.path.c_str(), &st) == 0 && st.st_dev == t.dev &&
          st.st_ino == t.ino) {
        throw InputError(fmt::format("{}: is {} ({}); {} must name another file", out.path, in.role,
                                     in.path, out.role));
      }
    }
    const fs::path parent = fs::path(t.resolved).parent_path();
    for (const Entry& dir : input_dirs_) {
      char buf[PATH_MAX];
      if (::realpath(dir.path.c_str(), buf) != nullptr && parent == fs::path(buf)) {
        throw InputError(fmt::format("{}: is inside {} ({}); {} must be written elsewhere",
                                     out.path, dir.role, dir.path, out.role));
      }
    }
    for (size_t j = 0; j < i; ++j) {
      FEPLB_REQUIRE_INPUT(!same_file(targets[j], t), "{} and {} name the same file ({})",
                          outputs_[j].entry.role, out.role, out.path);
    }
    FEPLB_REQUIRE_INPUT(force_ || t.kind != Target::kRegular,
                        "{}: exists; pass --force to overwrite", out.path);
  }
  // Then what only trying tells: a directory that takes no new file, a FIFO without a reader.
  const SignalCleanup on_signal;  // no probe file left by a signal
  for (size_t i = 0; i < outputs_.size(); ++i) {
    const Target& t = targets[i];
    if (t.kind == Target::kRegular || t.kind == Target::kMissing) {
      require_writable_dir(outputs_[i].entry.path, t.resolved);
    } else if (t.kind == Target::kSpecial && outputs_[i].fd < 0) {
      outputs_[i].fd = open_special(outputs_[i].entry.path);
    }
  }
  checked_ = true;
}

void FileSet::stage(const std::string& path, std::string content) {
  for (Output& o : outputs_) {
    if (o.entry.path != path || o.content) continue;
    o.content = std::move(content);
    o.staged_order = staged_++;
    return;
  }
  FEPLB_CHECK(false, "{} was not named as an output, or was staged twice", path);
}

namespace {

// A failed commit: what it placed undone (the replaced files back, new ones removed), its
// temporary files removed, then InputError: `what`, and which of the staged `paths` were written
// (streams and special files, outputs that could not be undone) and which not.
[[noreturn]] void abandon_commit(const std::string& what, std::vector<Placing>& regular,
                                 std::vector<std::string>& written,
                                 const std::vector<std::string>& paths) {
  std::vector<std::string> not_written;
  for (Placing& p : regular) {
    const bool undone = !p.placed || unplace(p);
    if (undone) {
      if (!p.tmp.empty()) ::unlink(p.tmp.c_str());
      if (!p.backup.empty()) ::unlink(p.backup.c_str());
    }
    SignalCleanup::untrack(p.undo_slot);
    SignalCleanup::untrack(p.tmp_slot);
    if (!undone) written.push_back(shown(p.path));
  }
  for (const std::string& path : paths) {
    if (std::find(written.begin(), written.end(), shown(path)) == written.end()) {
      not_written.push_back(shown(path));
    }
  }
  throw InputError(what + written_note(written, not_written));
}

// A commit that placed every output: every undo dropped at once (a signal meanwhile waits), so a
// signal keeps all of them; then the kept-aside files removed.
void keep_placed(std::vector<Placing>& regular) {
  {
    const SignalBlock hold;
    for (Placing& p : regular) {
      if (!p.backup.empty()) {
        SignalCleanup::set_state(p.undo_slot, SignalCleanup::kUnlink);
      } else {
        SignalCleanup::untrack(p.undo_slot);
      }
    }
  }
  for (Placing& p : regular) {
    if (!p.backup.empty()) ::unlink(p.backup.c_str());
    SignalCleanup::untrack(p.undo_slot);
  }
}

}  // namespace

std::vector<std::string> FileSet::commit() {
  FEPLB_CHECK(checked_, "FileSet::commit before check");
  std::vector<Output*> staged;
  for (Output& o : outputs_) {
    if (o.content) staged.push_back(&o);
  }
  std::sort(staged.begin(), staged.end(),
            [](const Output* a, const Output* b) { return a->staged_order < b->staged_order; });
  const SignalCleanup on_signal;  // a signal meanwhile leaves no temporary file behind
  std::vector<Placing> regular;
  std::vector<std::string> written;  // streams and special files written (cannot be undone)
  std::vector<std::string> paths;    // the staged outputs, in staged order
  for (const Output* o : staged) paths.push_back(o->entry.path);
  const auto fail = [&](const std::string& what) { abandon_commit(what, regular, written, paths); };
  // 1. Every regular file to a temporary file beside it.
  for (const Output* o : staged) {
    const Target t = inspect(o->entry.path);
    if (t.kind == Target::kSpecial && o->fd < 0) {
      fail(fmt::format("{}: became a special file after it was checked", o->entry.path));
    }
    if (t.kind != Target::kRegular && t.kind != Target::kMissing) continue;
    if (t.kind == Target::kRegular && !force_) {
      fail(fmt::format("{}: exists; pass --force to overwrite", o->entry.path));
    }
    Placing p;
    p.path = o->entry.path;
    p.resolved = t.resolved;
    try {
      p.tmp = write_temp(o->entry.path, t, *o->content, p.tmp_slot);
    } catch (const InputError& e) {
      fail(e.what());
    }
    regular.push_back(std::move(p));
  }
  // 2. Streams and special files.
  for (const Output* o : staged) {
    const std::string& path = o->entry.path;
    int err = 0;
    if (o->fd >= 0) {
      err = write_all(o->fd, *o->content);
    } else if (const auto fd = stream_fd(path)) {
      err = write_stream(*fd, *o->content);
    } else {
      continue;
    }
    if (err != 0) fail(fmt::format("{}: write failed ({})", shown(path), errno_text(err)));
    written.push_back(shown(path));
  }
  // 3. The temporary files into place.
  for (Placing& p : regular) {
    const int err = place(p, force_);
    if (err == EEXIST) fail(fmt::format("{}: exists; pass --force to overwrite", p.path));
    if (err != 0) fail(fmt::format("{}: cannot rename into place ({})", p.path, errno_text(err)));
  }
  keep_placed(regular);
  return paths;
}

void write_file(const std::string& path, std::string_view content, bool overwrite) {
  FileSet files(overwrite);
  files.output("", path);
  files.check();
  files.stage(path, std::string(content));
  files.commit();
}

void flush_stdout() {
  errno = 0;
  const bool ok = std::fflush(stdout) == 0 && !std::ferror(stdout);
  FEPLB_REQUIRE_INPUT(ok, "standard output: write failed ({})",
                      errno ? errno_text(errno) : "an earlier write failed");
}

}  // namespace feplb
