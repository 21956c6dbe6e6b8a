#include "feplb/core/file_input.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "feplb/core/limits.h"

namespace feplb {
namespace {

constexpr size_t kChunkBytes = size_t{64} << 10;

std::string kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

std::string too_large(std::string_view format, int64_t max_bytes) {
  return fmt::format("larger than the {} limit of {} bytes ({:.0f} MiB)", format, max_bytes,
                     static_cast<double>(max_bytes) / (1 << 20));
}

}  // namespace

ByteSource::ByteSource(const std::string& path, std::string_view format, int64_t max_bytes)
    : path_(path),
      format_(format),
      max_bytes_(max_bytes),
      max_token_bytes_(limits::kMaxFreeFormBytes) {
  FEPLB_REQUIRE_INPUT(path.find('\0') == std::string::npos, "a path with a NUL byte");
  if (path == "-") {
    fd_ = STDIN_FILENO;
  } else {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      const int err = errno;
      FEPLB_REQUIRE_INPUT(err != ENOENT, "no such file");
      throw InputError(fmt::format("cannot read ({})", std::strerror(err)));
    }
    // Checked before opening: opening a FIFO nobody writes would block.
    FEPLB_REQUIRE_INPUT(S_ISREG(st.st_mode), "is {}; only regular files are read",
                        kind_of(st.st_mode));
    fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    FEPLB_REQUIRE_INPUT(fd_ >= 0, "cannot open ({})", std::strerror(errno));
    owns_fd_ = true;
    // What was opened is what was checked (the path may have changed in between).
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      throw InputError(fmt::format("is {}; only regular files are read", kind_of(st.st_mode)));
    }
    if (st.st_size > max_bytes_) {
      ::close(fd_);
      throw InputError(fmt::format("{} bytes: {}", st.st_size, too_large(format_, max_bytes_)));
    }
    size_hint_ = st.st_size;
  }
  buf_ = std::make_unique<char[]>(kChunkBytes);
  begin_ = cur_ = end_ = buf_.get();
  refill();
}

ByteSource::ByteSource(std::string_view text, std::string_view format, int64_t max_bytes)
    : format_(format), max_bytes_(max_bytes), max_token_bytes_(limits::kMaxFreeFormBytes) {
  FEPLB_REQUIRE_INPUT(static_cast<int64_t>(text.size()) <= max_bytes, "{} bytes: {}", text.size(),
                      too_large(format_, max_bytes_));
  begin_ = cur_ = text.data();
  end_ = text.data() + text.size();
}

ByteSource::~ByteSource() {
  if (owns_fd_) ::close(fd_);
}

void ByteSource::token_too_long() const {
  throw InputError(
      fmt::format("malformed JSON at byte {}: a {} longer than {} bytes (no field of {} holds one)",
                  consumed(), in_string_ ? "string" : "token", max_token_bytes_, format_));
}

void ByteSource::refill() {
  consumed_before_ += cur_ - begin_;
  begin_ = cur_ = end_ = buf_ ? buf_.get() : end_;
  if (fd_ < 0) return;  // a string: nothing more
  ssize_t n = 0;
  do {
    n = ::read(fd_, buf_.get(), kChunkBytes);
  } while (n < 0 && errno == EINTR);
  FEPLB_REQUIRE_INPUT(n >= 0, "read failed after {} bytes ({})", consumed_before_,
                      std::strerror(errno));
  FEPLB_REQUIRE_INPUT(consumed_before_ + n <= max_bytes_, "{}", too_large(format_, max_bytes_));
  end_ = buf_.get() + n;
}

}  // namespace feplb
