#include "feplb/core/file_output.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>

namespace feplb {
namespace {

namespace fs = std::filesystem;

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

void write_stream(const std::string& path, int fd, std::string_view content) {
  if (fd == STDOUT_FILENO) {
    const size_t n = std::fwrite(content.data(), 1, content.size(), stdout);
    FEPLB_REQUIRE_INPUT(n == content.size() && std::fflush(stdout) == 0, "{}: write failed ({})",
                        path == "-" ? "standard output" : path, errno_text(errno));
    return;
  }
  std::fflush(stdout);  // keep the order of what reaches a shared terminal or file
  const int err = write_all(fd, content);
  FEPLB_REQUIRE_INPUT(err == 0, "{}: write failed ({})", path, errno_text(err));
}

void write_special(const std::string& path, std::string_view content) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  FEPLB_REQUIRE_INPUT(fd >= 0, "{}: cannot open ({})", path, errno_text(errno));
  const int err = write_all(fd, content);
  const int close_err = ::close(fd) == 0 ? 0 : errno;
  FEPLB_REQUIRE_INPUT(err == 0 && close_err == 0, "{}: write failed ({})", path,
                      errno_text(err ? err : close_err));
}

// Writes a regular file at `resolved` through a temporary file in its directory.
void write_replacing(const std::string& path, const Target& t, std::string_view content,
                     bool overwrite) {
  const fs::path target(t.resolved);
  // (fmt, not "." + string: g++ 12 -O2 warns -Wrestrict on that concatenation, a false positive.)
  std::string tmp =
      (target.parent_path() / fmt::format(".{}.XXXXXX", target.filename().string())).string();
  const int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
  FEPLB_REQUIRE_INPUT(fd >= 0, "{}: cannot create a temporary file in {} ({})", path,
                      target.parent_path().string(), errno_text(errno));
  // The mode a new file would get, or the one the replaced file had.
  mode_t mode = 0;
  struct stat st {};
  if (t.kind == Target::kRegular && ::stat(t.resolved.c_str(), &st) == 0) {
    mode = st.st_mode & 07777;
  } else {
    const mode_t mask = ::umask(0);
    ::umask(mask);
    mode = 0666 & ~mask;
  }
  int err = write_all(fd, content);
  if (err == 0 && ::fchmod(fd, mode) != 0) err = errno;
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    throw InputError(
        fmt::format("{}: write failed ({}); nothing was written", path, errno_text(err)));
  }
  if (!overwrite) {
    // No clobbering even if the file appeared meanwhile: link fails if it exists.
    if (::link(tmp.c_str(), t.resolved.c_str()) == 0) {
      ::unlink(tmp.c_str());
      return;
    }
    err = errno;
    if (err == EEXIST) {
      ::unlink(tmp.c_str());
      throw InputError(fmt::format("{}: exists; pass --force to overwrite", path));
    }
    // A file system without hard links: fall back to rename.
  }
  if (::rename(tmp.c_str(), t.resolved.c_str()) != 0) {
    err = errno;
    ::unlink(tmp.c_str());
    throw InputError(fmt::format("{}: cannot rename into place ({})", path, errno_text(err)));
  }
}

bool same_file(const Target& a, const Target& b) {
  if (a.kind == Target::kRegular && b.kind == Target::kRegular) {
    return a.dev == b.dev && a.ino == b.ino;
  }
  if (a.kind == Target::kMissing && b.kind == Target::kMissing) return a.resolved == b.resolved;
  return false;
}

}  // namespace

void FileSet::input(std::string role, std::string path) {
  if (!path.empty()) inputs_.push_back({std::move(role), std::move(path)});
}

void FileSet::input_dir(std::string role, std::string path) {
  if (!path.empty()) input_dirs_.push_back({std::move(role), std::move(path)});
}

void FileSet::output(std::string flag, std::string path) {
  if (!path.empty()) outputs_.push_back({std::move(flag), std::move(path)});
}

void FileSet::check() const {
  std::vector<Target> targets;
  for (const Entry& out : outputs_) targets.push_back(inspect(out.path));
  for (size_t i = 0; i < outputs_.size(); ++i) {
    const Entry& out = outputs_[i];
    const Target& t = targets[i];
    if (t.kind == Target::kStream || t.kind == Target::kSpecial) continue;
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
                          outputs_[j].role, out.role, out.path);
    }
    FEPLB_REQUIRE_INPUT(force_ || t.kind != Target::kRegular,
                        "{}: exists; pass --force to overwrite", out.path);
  }
}

void write_file(const std::string& path, std::string_view content, bool overwrite) {
  const Target t = inspect(path);
  switch (t.kind) {
    case Target::kStream:
      write_stream(path, t.fd, content);
      return;
    case Target::kSpecial:
      write_special(path, content);
      return;
    case Target::kRegular:
      FEPLB_REQUIRE_INPUT(overwrite, "{}: exists; pass --force to overwrite", path);
      write_replacing(path, t, content, true);
      return;
    case Target::kMissing:
      write_replacing(path, t, content, overwrite);
      return;
  }
}

void flush_stdout() {
  errno = 0;
  const bool ok = std::fflush(stdout) == 0 && !std::ferror(stdout);
  FEPLB_REQUIRE_INPUT(ok, "standard output: write failed ({})",
                      errno ? errno_text(errno) : "an earlier write failed");
}

}  // namespace feplb
