// Streaming JSON reading for the file readers (private to feplb_core), on nlohmann's SAX
// interface: a reader sees each value where it is (path() names it for error messages, as in
// "steps[3].counts[2][7]"), streams the large containers itself and receives the small parts
// (headers, provenance) captured as JSON values of bounded size. Duplicate keys, nesting deeper
// than limits::kMaxJsonDepth and syntax errors are refused. Every error is an InputError.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "feplb/core/error.h"
#include "feplb/core/file_input.h"
#include "feplb/core/limits.h"

namespace feplb::json_stream {

// Ordered: captured objects keep the file's key order.
using json = nlohmann::ordered_json;

inline const char* type_of(const json& v) { return v.type_name(); }

// An integer in [lo, hi]; `field` names it in the error.
inline int64_t int_in(const json& v, std::string_view field, int64_t lo, int64_t hi) {
  FEPLB_REQUIRE_INPUT(v.is_number_integer(), "{}: expected an integer, got {}{}", field, type_of(v),
                      v.is_number() ? " " + v.dump() : std::string());
  FEPLB_REQUIRE_INPUT(
      !(v.is_number_unsigned() &&
        v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())),
      "{}: {} is too large", field, v.dump());
  const int64_t x = v.get<int64_t>();
  FEPLB_REQUIRE_INPUT(x >= lo && x <= hi, "{}: {} is outside [{}, {}]", field, x, lo, hi);
  return x;
}

// A finite number; `field` names it in the error.
inline double number(const json& v, std::string_view field) {
  FEPLB_REQUIRE_INPUT(v.is_number(), "{}: expected a number, got {}", field, type_of(v));
  return v.get<double>();
}

// The keys of one object, to refuse duplicates: linear for the usual handful, hashed beyond.
class KeySet {
 public:
  // False when `key` was already there.
  bool insert(const std::string& key) {
    if (!hashed_.empty()) return hashed_.insert(key).second;
    for (const std::string& k : few_) {
      if (k == key) return false;
    }
    if (few_.size() < 16) {
      few_.push_back(key);
    } else {
      hashed_.insert(few_.begin(), few_.end());
      hashed_.insert(key);
    }
    return true;
  }
  void clear() {
    few_.clear();
    hashed_.clear();
  }

 private:
  std::vector<std::string> few_;
  std::unordered_set<std::string> hashed_;
};

// What a reader does with a container that starts where it is not capturing: stream it (its
// contents arrive as events) or capture it whole, up to max_bytes of text, as one JSON value.
struct Take {
  bool capture = false;
  int64_t max_bytes = limits::kMaxFreeFormBytes;
  static Take stream() { return {false, 0}; }
  static Take whole(int64_t max_bytes = limits::kMaxFreeFormBytes) { return {true, max_bytes}; }
};

// The SAX handler. `Derived` provides:
//   Take take(bool object);        a container starts at path(), outside any capture
//   void opened(bool object);      a streamed container started (container_path() names it)
//   void closed(bool object);      a streamed container ends (element_count() is its size)
//   void value(json&& v);          a scalar, or a captured container, at path()
// depth() is the number of streamed containers open (0 before the document's top value).
template <typename Derived>
class Reader {
 public:
  explicit Reader(const ByteSource& source) : source_(source) {}

  // --- nlohmann SAX interface ---
  bool null() { return scalar(json(nullptr)); }
  bool boolean(bool v) { return scalar(json(v)); }
  bool number_integer(json::number_integer_t v) { return scalar(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return scalar(json(v)); }
  bool number_float(json::number_float_t v, const std::string& /*text*/) { return scalar(json(v)); }
  bool string(std::string& v) { return scalar(json(std::move(v))); }
  bool binary(json::binary_t& /*v*/) { throw InputError(where() + "malformed JSON: binary value"); }
  bool start_object(std::size_t /*size*/) { return start(true); }
  bool start_array(std::size_t /*size*/) { return start(false); }
  bool end_object() { return end(); }
  bool end_array() { return end(); }
  bool key(std::string& k) {
    Frame& f = top();
    if (!f.keys.insert(k)) {
      const std::string c = container_path();
      throw InputError(fmt::format("{}{}duplicate key \"{}\"", c, c.empty() ? "" : ": ", k));
    }
    f.key = std::move(k);
    check_capture_size();
    return true;
  }
  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& e) {
    std::string what = e.what();
    if (auto pos = what.find("] "); pos != std::string::npos) what = what.substr(pos + 2);
    // The lexer's line and column miss what it did not see (collapsed whitespace, counts read
    // directly): the byte offset is exact.
    std::string at = ": ";
    if (what.rfind("parse error at line", 0) == 0) {
      if (auto pos = what.find(": "); pos != std::string::npos) {
        at = fmt::format(" at byte {}: ", source_.consumed());
        what = what.substr(pos + 2);
      }
    }
    throw InputError(where() + "malformed JSON" + at + what);
  }

  // Where the current value is: "steps[3].counts[2][7]" ("" for the document itself).
  std::string path() const { return path_of(depth_, true); }
  // The innermost open container: "steps[3].counts[2]".
  std::string container_path() const { return path_of(depth_, false); }
  // Streamed containers open.
  size_t depth() const { return streamed_; }
  // The key of the current value in the container `level` (0: the document's top object).
  const std::string& key_at(size_t level) const { return frames_[level].key; }
  // The index of the current value in the array `level` (the element count once closed).
  size_t index_at(size_t level) const { return frames_[level].index; }
  // Elements of the innermost open container so far (arrays; in closed(): all of them).
  size_t element_count() const { return top().index; }
  const ByteSource& source() const { return source_; }

 protected:
  // A scalar of the innermost (streamed) array that the reader read itself, straight from the
  // source, instead of through value(): moves the array's index past it.
  void value_read_directly() { advance(); }

  // "PATH: " or "" when at the top.
  std::string where() const {
    const std::string p = path();
    return p.empty() ? std::string() : p + ": ";
  }

 private:
  struct Frame {
    bool object = false;
    bool captured = false;
    json* value = nullptr;  // captured: the container being filled
    size_t index = 0;       // arrays: index of the next element
    std::string key;        // objects: key of the current member
    KeySet keys;
  };

  Derived& self() { return static_cast<Derived&>(*this); }
  Frame& top() { return frames_[depth_ - 1]; }
  const Frame& top() const { return frames_[depth_ - 1]; }
  bool capturing() const { return depth_ > 0 && top().captured; }

  std::string path_of(size_t depth, bool with_position) const {
    std::string out;
    for (size_t i = 0; i < depth; ++i) {
      if (i + 1 == depth && !with_position) break;
      const Frame& f = frames_[i];
      if (f.object) {
        if (f.key.empty() && i + 1 == depth) break;
        if (!out.empty()) out += '.';
        out += f.key;
      } else {
        out += fmt::format("[{}]", f.index);
      }
    }
    return out;
  }

  void check_capture_size() const {
    if (depth_ == 0 || !top().captured) return;
    if (source_.consumed() - capture_start_ > capture_limit_) {
      throw InputError(fmt::format("{}: more than {} bytes", capture_path_, capture_limit_));
    }
  }

  // Moves past a value that ended at the current position.
  void advance() {
    if (depth_ > 0 && !top().object) ++top().index;
  }

  // Adds `v` to the captured container on top; returns where it went.
  json* add_captured(json&& v) {
    Frame& f = top();
    if (f.object) {
      // The key is new (KeySet), so append without the ordered map's linear search.
      auto& members =
          static_cast<json::object_t::Container&>(f.value->template get_ref<json::object_t&>());
      members.emplace_back(f.key, std::move(v));
      return &members.back().second;
    }
    f.value->push_back(std::move(v));
    return &f.value->back();
  }

  bool scalar(json&& v) {
    if (capturing()) {
      add_captured(std::move(v));
      check_capture_size();
    } else {
      self().value(std::move(v));
    }
    advance();
    return true;
  }

  Frame& push(bool object, bool captured, json* value) {
    FEPLB_REQUIRE_INPUT(depth_ < static_cast<size_t>(limits::kMaxJsonDepth),
                        "{}malformed JSON: nested deeper than {} levels", where(),
                        limits::kMaxJsonDepth);
    if (frames_.size() == depth_) frames_.emplace_back();
    Frame& f = frames_[depth_++];
    f.object = object;
    f.captured = captured;
    f.value = value;
    f.index = 0;
    f.key.clear();
    f.keys.clear();
    return f;
  }

  bool start(bool object) {
    if (capturing()) {
      json* child = add_captured(object ? json::object() : json::array());
      push(object, true, child);
      check_capture_size();
      return true;
    }
    const Take take = self().take(object);
    if (take.capture) {
      capture_ = object ? json::object() : json::array();
      capture_start_ = source_.consumed();
      capture_limit_ = take.max_bytes;
      capture_path_ = path();
      push(object, true, &capture_);
      return true;
    }
    push(object, false, nullptr);
    ++streamed_;
    self().opened(object);
    return true;
  }

  bool end() {
    const Frame& f = top();
    if (f.captured) {
      const bool root = depth_ == 1 || !frames_[depth_ - 2].captured;
      --depth_;
      if (root) {
        self().value(std::move(capture_));
        capture_ = json();
      }
    } else {
      self().closed(f.object);
      --depth_;
      --streamed_;
    }
    advance();
    return true;
  }

  const ByteSource& source_;
  std::vector<Frame> frames_;  // [0, depth_) open; reused so that a step allocates nothing
  size_t depth_ = 0;
  size_t streamed_ = 0;
  json capture_;
  int64_t capture_start_ = 0, capture_limit_ = 0;
  std::string capture_path_;
};

// Parses all of `source` with `reader` (a Reader<...>); trailing text after the document is an
// error.
template <typename R>
void parse(ByteSource& source, R& reader) {
  json::sax_parse(source.begin(), ByteSource::end(), &reader);
}

}  // namespace feplb::json_stream
