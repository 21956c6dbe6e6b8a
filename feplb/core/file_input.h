// Reading input files: only regular files (or "-", standard input) are read, in bounded chunks,
// never more than the format's size limit (limits.h). Every error is a one-line InputError.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>

#include "feplb/core/error.h"
#include "feplb/core/text.h"

namespace feplb {

// The bytes of one input, a chunk at a time: a file or standard input (read in 64 KiB chunks), or
// a string already in memory. `format` and `max_bytes` name and bound what may be read.
class ByteSource {
 public:
  // Opens `path` ("-": standard input). InputError unless it is a regular file (a FIFO, device or
  // directory is refused without reading it) of at most `max_bytes`.
  ByteSource(const std::string& path, std::string_view format, int64_t max_bytes);
  // The bytes of `text` (not copied; must outlive the source).
  ByteSource(std::string_view text, std::string_view format, int64_t max_bytes);
  ~ByteSource();
  ByteSource(const ByteSource&) = delete;
  ByteSource& operator=(const ByteSource&) = delete;

  bool at_end() const { return cur_ == end_; }
  char peek() const { return *cur_; }
  void advance() {
    if (++cur_ == end_) refill();
  }
  // The bytes read but not yet consumed (at least one unless at_end()).
  std::string_view buffered() const { return {cur_, static_cast<size_t>(end_ - cur_)}; }
  // Consumes n <= buffered().size() bytes.
  void skip(size_t n) {
    cur_ += n;
    if (cur_ == end_) refill();
  }
  // Consumes whitespace (space, tab, newline, carriage return).
  void skip_whitespace() {
    while (cur_ != end_ && is_json_space(*cur_)) advance();
  }
  // The file's size when it was opened (a regular file), else 0.
  int64_t size_hint() const { return size_hint_; }
  // Bytes consumed so far.
  int64_t consumed() const { return consumed_before_ + (cur_ - begin_); }

  static bool is_json_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

  // Moves past one character of a JSON document, keeping what a JSON lexer buffers bounded by the
  // formats' limits rather than by the file: a run of whitespace outside strings is passed on as
  // its first character, and a string or other token longer than limits::kMaxFreeFormBytes is an
  // InputError.
  void advance_json() {
    const char c = *cur_;
    advance();
    if (in_string_) {
      if (escaped_) {
        escaped_ = false;
      } else if (c == '\\') {
        escaped_ = true;
      } else if (c == '"') {
        in_string_ = false;
        token_bytes_ = 0;
        return;
      }
      if (++token_bytes_ > max_token_bytes_) token_too_long();
      return;
    }
    switch (c) {
      case '"':
        in_string_ = true;
        token_bytes_ = 0;
        return;
      case ' ':
      case '\n':
      case '\r':
      case '\t':
        token_bytes_ = 0;
        skip_whitespace();
        return;
      case ',':
      case ':':
      case '[':
      case ']':
      case '{':
      case '}':
        token_bytes_ = 0;
        return;
      default:
        if (++token_bytes_ > max_token_bytes_) token_too_long();
    }
  }

  // A single-pass iterator for nlohmann::json::sax_parse (through advance_json); `end()` compares
  // equal to any iterator whose source is exhausted.
  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = char;
    using difference_type = std::ptrdiff_t;
    using pointer = const char*;
    using reference = const char&;
    Iterator() = default;
    explicit Iterator(ByteSource* s) : s_(s) {}
    char operator*() const { return s_->peek(); }
    Iterator& operator++() {
      s_->advance_json();
      return *this;
    }
    bool operator==(const Iterator& o) const { return done() == o.done(); }
    bool operator!=(const Iterator& o) const { return done() != o.done(); }

   private:
    bool done() const { return s_ == nullptr || s_->at_end(); }
    ByteSource* s_ = nullptr;
  };
  Iterator begin() { return Iterator(this); }
  static Iterator end() { return Iterator(); }

 private:
  void refill();
  [[noreturn]] void token_too_long() const;

  std::string path_;
  std::string format_;
  int64_t max_bytes_;
  int fd_ = -1;
  bool owns_fd_ = false;
  std::unique_ptr<char[]> buf_;
  const char* begin_ = nullptr;
  const char* cur_ = nullptr;
  const char* end_ = nullptr;
  int64_t consumed_before_ = 0;
  int64_t size_hint_ = 0;
  // advance_json's state: inside a string (after a backslash), bytes of the current token.
  bool in_string_ = false, escaped_ = false;
  int64_t token_bytes_ = 0;
  int64_t max_token_bytes_;
};

// Runs `parse(source)` on `path` opened as a ByteSource; an InputError it throws gets "PATH: " in
// front (unless it already starts with it).
template <typename Parse>
auto parse_input(const std::string& path, std::string_view format, int64_t max_bytes,
                 const Parse& parse) -> decltype(parse(std::declval<ByteSource&>())) {
  try {
    ByteSource source(path, format, max_bytes);
    return parse(source);
  } catch (const InputError& e) {
    const std::string_view what = e.what();
    const std::string shown = path == "-" ? "standard input" : printable(path);
    if (what.rfind(shown + ": ", 0) == 0) throw;
    throw InputError(fmt::format("{}: {}", shown, what));
  }
}

}  // namespace feplb
