#include "feplb/core/trace_io.h"

#include <fmt/format.h>

#include <limits>
#include <optional>
#include <set>
#include <utility>

#include "feplb/core/error.h"
#include "feplb/core/file_input.h"
#include "feplb/core/internal/huge_page_heap.h"
#include "feplb/core/internal/json_stream.h"
#include "feplb/core/limits.h"

namespace feplb {
namespace {

using json_stream::int_in;
using json_stream::json;
using json_stream::Take;
using json_stream::type_of;

std::optional<ExpertShape> parse_shape(const json& v) {
  FEPLB_REQUIRE_INPUT(v.is_object(), "expert_shape: expected an object, got {}", type_of(v));
  ExpertShape s;
  const auto dim = [&](const char* key) {
    const auto it = v.find(key);
    FEPLB_REQUIRE_INPUT(it != v.end(), "expert_shape.{}: missing", key);
    return int_in(*it, fmt::format("expert_shape.{}", key), 1, limits::kMaxExpertDim);
  };
  s.hidden = dim("hidden");
  s.ffn = dim("ffn");
  if (auto it = v.find("dtype"); it != v.end()) {
    FEPLB_REQUIRE_INPUT(it->is_string(), "expert_shape.dtype: expected a string, got {}",
                        type_of(*it));
    s.dtype = parse_dtype(it->get<std::string>(), "expert_shape.dtype");
  }
  return s;
}

// The trace document, streamed: the header's members and each step's small members are captured,
// the counts go straight into the step's [num_ranks, num_experts] matrix. Header members may come
// in any order; a step is shape-checked as soon as num_ranks and num_experts are known and its
// counts as soon as top_k and tokens_per_rank are too (else at the end of the document).
class TraceReader : public json_stream::Reader<TraceReader> {
 public:
  explicit TraceReader(ByteSource& source) : Reader(source), input_(source) {
    if (source.size_hint() >= kHugePagesFrom) heap_.emplace();
  }

  // Levels of streamed containers: the document, "steps", a step, its "counts", a row.
  enum Level : size_t { kDoc = 1, kSteps = 2, kStep = 3, kCounts = 4, kRow = 5 };

  Take take(bool object) {
    switch (depth()) {
      case 0:
        // Anything else is captured (so a syntax error in it is named first), then refused.
        return object ? Take::stream() : Take::whole();
      case kDoc:
        return key_at(0) == "steps" && !object ? Take::stream() : Take::whole();
      case kSteps:
        return object ? Take::stream() : Take::whole();
      case kStep:
        return key_at(kStep - 1) == "counts" && !object ? Take::stream() : Take::whole();
      case kCounts:
        return object ? Take::whole() : Take::stream();
      default:
        return Take::whole();
    }
  }

  void opened(bool /*object*/) {
    switch (depth()) {
      case kSteps:
        saw_steps_ = true;
        break;
      case kStep:
        step_ = Pending{};
        step_.index = index_at(kSteps - 1);
        break;
      case kCounts:
        step_.has_counts = true;
        if (shape_known()) {
          step_.flat.reserve(static_cast<size_t>(t_.num_ranks) * t_.num_experts);
          if (heap_) heap_->grown();
        }
        break;
      case kRow:
        row_start_ = step_.flat.size();
        read_plain_counts();
        break;
      default:
        break;
    }
  }

  void closed(bool /*object*/) {
    switch (depth()) {
      case kRow: {
        const auto row = static_cast<int>(step_.row_len.size());
        const size_t len = step_.flat.size() - row_start_;
        if (shape_known()) check_row_length(step_.index, row, len);
        step_.row_len.push_back(len);
        break;
      }
      case kCounts:
        if (shape_known()) check_row_count(step_.index, step_.row_len.size());
        break;
      case kStep:
        finish_step();
        break;
      default:
        break;
    }
  }

  void value(json&& v) {
    switch (depth()) {
      case 0:
        throw InputError(fmt::format("expected a JSON object at the top, got {}", type_of(v)));
      case kDoc:
        header(key_at(0), v);
        break;
      case kSteps:
        throw InputError(
            fmt::format("steps[{}]: expected an object, got {}", index_at(1), type_of(v)));
      case kStep:
        step_member(key_at(kStep - 1), std::move(v));
        break;
      case kCounts:
        throw InputError(fmt::format("{}: expected an array, got {}", path(), type_of(v)));
      case kRow:
        count(v);
        break;
      default:
        break;
    }
  }

  Trace finish() {
    FEPLB_REQUIRE_INPUT(seen_format_, "format: missing");
    for (const char* key : {"num_experts", "num_ranks", "top_k", "tokens_per_rank"}) {
      FEPLB_REQUIRE_INPUT(seen_.count(key), "{}: missing", key);
    }
    FEPLB_REQUIRE_INPUT(saw_steps_, "steps: missing");
    FEPLB_REQUIRE_INPUT(!t_.steps.empty() || !pending_.empty(),
                        "steps: empty; a trace needs at least one step");
    // Steps that came before the header.
    for (Pending& p : pending_) build_step(p);
    pending_.clear();
    for (size_t i = values_checked_; i < t_.steps.size(); ++i) check_values(i);
    return std::move(t_);
  }

 private:
  // A step as read, before its shape is known: the counts row by row.
  struct Pending {
    size_t index = 0;
    bool has_counts = false, has_step = false, has_layer = false;
    int64_t step = 0, layer = 0;
    std::vector<int64_t> flat;
    std::vector<size_t> row_len;
    json tokens, dropped;  // null when absent
  };

  // Set once their header members have been read (checked per count: kept as flags).
  bool shape_known() const { return shape_known_; }
  bool values_known() const { return values_known_; }

  void header(const std::string& key, const json& v) {
    seen_.insert(key);
    if (key == "format") {
      seen_format_ = true;
      FEPLB_REQUIRE_INPUT(v.is_string() && v.get_ref<const std::string&>() == kTraceFormat,
                          "format: expected \"{}\", got {}", kTraceFormat, v.dump());
    } else if (key == "model") {
      FEPLB_REQUIRE_INPUT(v.is_string(), "model: expected a string, got {}", type_of(v));
      t_.model = v.get<std::string>();
    } else if (key == "num_experts") {
      t_.num_experts = static_cast<int>(int_in(v, "num_experts", 1, limits::kMaxExperts));
    } else if (key == "num_ranks") {
      t_.num_ranks = static_cast<int>(int_in(v, "num_ranks", 1, limits::kMaxRanks));
    } else if (key == "top_k") {
      t_.top_k = static_cast<int>(int_in(v, "top_k", 1, limits::kMaxExperts));
    } else if (key == "tokens_per_rank") {
      t_.tokens_per_rank = int_in(v, "tokens_per_rank", 0, limits::kMaxTokensPerRank);
    } else if (key == "expert_shape") {
      t_.expert_shape = parse_shape(v);
    } else if (key == "generator") {
      FEPLB_REQUIRE_INPUT(v.is_object(), "generator: expected an object, got {}", type_of(v));
      t_.generator_json = v.dump();
    } else if (key == "steps") {
      throw InputError(fmt::format("steps: expected an array, got {}", type_of(v)));
    } else {
      seen_.erase(key);  // unknown members are ignored
      return;
    }
    shape_known_ = seen_.count("num_experts") && seen_.count("num_ranks");
    values_known_ = shape_known_ && seen_.count("top_k") && seen_.count("tokens_per_rank");
    if (shape_known() && !shape_checked_) check_shape();
    if (values_known() && !values_checked_header_) {
      values_checked_header_ = true;
      FEPLB_REQUIRE_INPUT(t_.top_k <= t_.num_experts, "top_k: {} is outside [1, num_experts = {}]",
                          t_.top_k, t_.num_experts);
      for (size_t i = values_checked_; i < t_.steps.size(); ++i) check_values(i);
      values_checked_ = t_.steps.size();
    }
  }

  void check_shape() {
    shape_checked_ = true;
    FEPLB_REQUIRE_INPUT(t_.num_experts % t_.num_ranks == 0,
                        "num_experts: {} is not divisible by num_ranks {}", t_.num_experts,
                        t_.num_ranks);
    const int64_t per_step = int64_t{t_.num_ranks} * t_.num_experts;
    FEPLB_REQUIRE_INPUT(per_step <= limits::kMaxTraceCounts,
                        "num_ranks x num_experts: {} x {} = {} counts per step, above the limit "
                        "of {} counts in a trace",
                        t_.num_ranks, t_.num_experts, per_step, limits::kMaxTraceCounts);
    // Steps read before the shape was known.
    for (Pending& p : pending_) build_step(p);
    pending_.clear();
  }

  void step_member(const std::string& key, json&& v) {
    const std::string where = fmt::format("steps[{}].{}", step_.index, key);
    if (key == "step") {
      step_.step = int_in(v, where, 0, limits::kMaxStepId);
      step_.has_step = true;
    } else if (key == "layer") {
      step_.layer = int_in(v, where, 0, limits::kMaxStepId);
      step_.has_layer = true;
    } else if (key == "counts") {
      throw InputError(fmt::format("{}: expected an array, got {}", where, type_of(v)));
    } else if (key == "tokens") {
      step_.tokens = std::move(v);
    } else if (key == "dropped") {
      step_.dropped = std::move(v);
    }
  }

  // One count, as it streams in: an integer in [0, 2^32]; its bound by the rank's tokens is
  // checked with the step's values.
  void count(const json& v) {
    if (v.is_number_unsigned() || v.is_number_integer()) {
      // Fast path: a plain non-negative integer.
      if (v.is_number_unsigned()) {
        const uint64_t u = v.get<uint64_t>();
        if (u <= static_cast<uint64_t>(limits::kMaxTokensPerRank)) {
          push_count(static_cast<int64_t>(u));
          return;
        }
      }
    }
    push_count(int_in(v, path(), 0, limits::kMaxTokensPerRank));
  }

  // A row's counts read straight from the source's buffer while they are plain integers (the
  // parser's lexer, at about 70 MB/s, would be most of the read time). What is left for the
  // parser starts where a value may: a row's closing bracket or a value this does not take (a
  // negative, a fraction, a string, a number split across two chunks of the source, ...), which
  // the parser then reads and count() refuses or takes as before. So a comma is consumed only
  // with the value before it, and a comma followed by anything but a value is refused here.
  void read_plain_counts() {
    bool want_value = true, after_comma = false;
    while (!input_.at_end()) {
      const std::string_view buf = input_.buffered();
      const char* const begin = buf.data();
      const char* const end = begin + buf.size();
      const char* p = begin;
      bool stop = false;
      while (p < end && !stop) {
        const char c = *p;
        if (ByteSource::is_json_space(c)) {
          ++p;
        } else if (!want_value) {
          if (c != ',') {
            if (c != ']') {
              input_.skip(static_cast<size_t>(p - begin));
              throw InputError(
                  fmt::format("{}: malformed JSON at byte {}: expected ',' or ']' after a count",
                              container_path(), input_.consumed()));
            }
            stop = true;  // the parser closes the row
          } else {
            ++p;
            want_value = after_comma = true;
          }
        } else if (c == ']' && after_comma) {
          input_.skip(static_cast<size_t>(p - begin));
          throw InputError(fmt::format("{}: malformed JSON at byte {}: ']' after a comma",
                                       container_path(), input_.consumed()));
        } else if (const char* q = plain_count(p, end); q != nullptr) {
          p = q;
          want_value = false;
        } else {
          stop = true;  // the parser reads this value
        }
      }
      input_.skip(static_cast<size_t>(p - begin));
      if (stop) return;
    }
  }

  // Takes the count at `p` if it is a plain integer (no sign, no leading zero, within the counts'
  // bound) that ends before `end`; returns the end of its digits, or nullptr (nothing taken).
  const char* plain_count(const char* p, const char* end) {
    constexpr ptrdiff_t kMaxDigits = 10;  // limits::kMaxTokensPerRank = 2^32 has 10
    const char* q = p;
    uint64_t v = 0;
    while (q < end && q - p <= kMaxDigits && static_cast<unsigned char>(*q - '0') < 10) {
      v = v * 10 + static_cast<uint64_t>(*q - '0');
      ++q;
    }
    const ptrdiff_t n = q - p;
    if (n == 0 || n > kMaxDigits || q == end || *q == '.' || *q == 'e' || *q == 'E' ||
        (*p == '0' && n > 1) || v > static_cast<uint64_t>(limits::kMaxTokensPerRank)) {
      return nullptr;
    }
    push_count(static_cast<int64_t>(v));
    value_read_directly();
    return q;
  }

  void push_count(int64_t c) {
    FEPLB_REQUIRE_INPUT(++numbers_ <= limits::kMaxTraceCounts,
                        "{}: more than {} counts, the limit of a trace", path(),
                        limits::kMaxTraceCounts);
    if (shape_known() && step_.flat.size() - row_start_ >= static_cast<size_t>(t_.num_experts)) {
      // Too many entries: keep counting them for the message, store none.
      ++overflow_;
      return;
    }
    step_.flat.push_back(c);
  }

  void check_row_length(size_t step, int row, size_t len) {
    const size_t n = len + overflow_;
    overflow_ = 0;
    FEPLB_REQUIRE_INPUT(n == static_cast<size_t>(t_.num_experts),
                        "steps[{}].counts[{}]: has {} entries, expected num_experts = {}", step,
                        row, n, t_.num_experts);
  }

  void check_row_count(size_t step, size_t rows) {
    FEPLB_REQUIRE_INPUT(rows == static_cast<size_t>(t_.num_ranks),
                        "steps[{}].counts: has {} rows, expected num_ranks = {}", step, rows,
                        t_.num_ranks);
  }

  void finish_step() {
    const std::string where = fmt::format("steps[{}]", step_.index);
    FEPLB_REQUIRE_INPUT(step_.has_step, "{}.step: missing", where);
    FEPLB_REQUIRE_INPUT(step_.has_layer, "{}.layer: missing", where);
    FEPLB_REQUIRE_INPUT(step_.has_counts, "{}.counts: missing", where);
    FEPLB_REQUIRE_INPUT(seen_ids_.emplace(step_.step, step_.layer).second,
                        "{}: step {} layer {} appears twice", where, step_.step, step_.layer);
    if (!shape_known()) {
      step_.flat.shrink_to_fit();
      pending_.push_back(std::move(step_));
      return;
    }
    build_step(step_);
    if (values_known()) {
      check_values(t_.steps.size() - 1);
      values_checked_ = t_.steps.size();
    }
  }

  // Shape-checks a step and appends it to the trace.
  void build_step(Pending& p) {
    for (size_t r = 0; r < p.row_len.size(); ++r) {
      check_row_length(p.index, static_cast<int>(r), p.row_len[r]);
    }
    check_row_count(p.index, p.row_len.size());
    RoutingStep s;
    s.step = p.step;
    s.layer = p.layer;
    s.num_ranks = t_.num_ranks;
    s.num_experts = t_.num_experts;
    s.counts = std::move(p.flat);
    s.tokens = per_rank(p.tokens, p.index, "tokens");
    s.dropped = per_rank(p.dropped, p.index, "dropped");
    s.sum_experts();  // while the counts are in the cache
    t_.steps.push_back(std::move(s));
    step_index_.push_back(p.index);
  }

  // A step's optional "tokens" or "dropped": num_ranks non-negative integers (empty if absent).
  std::vector<int64_t> per_rank(const json& v, size_t index, const char* key) {
    if (v.is_null()) return {};
    const std::string where = fmt::format("steps[{}].{}", index, key);
    FEPLB_REQUIRE_INPUT(v.is_array(), "{}: expected an array, got {}", where, type_of(v));
    FEPLB_REQUIRE_INPUT(v.size() == static_cast<size_t>(t_.num_ranks),
                        "{}: has {} entries, expected num_ranks = {}", where, v.size(),
                        t_.num_ranks);
    std::vector<int64_t> out;
    out.reserve(v.size());
    for (size_t r = 0; r < v.size(); ++r) {
      out.push_back(int_in(v[r], fmt::format("{}[{}]", where, r), 0, limits::kMaxTokensPerRank));
    }
    return out;
  }

  // The values of step i: tokens within tokens_per_rank, counts within the rank's tokens, each
  // row summing to tokens * top_k - dropped.
  void check_values(size_t i) {
    const RoutingStep& s = t_.steps[i];
    const size_t index = step_index_[i];
    for (int src = 0; src < t_.num_ranks; ++src) {
      const int64_t tokens = t_.tokens_of(s, src);
      FEPLB_REQUIRE_INPUT(tokens <= t_.tokens_per_rank,
                          "steps[{}].tokens[{}]: {} is above tokens_per_rank = {}", index, src,
                          tokens, t_.tokens_per_rank);
      const int64_t dropped = t_.dropped_of(s, src);
      FEPLB_REQUIRE_INPUT(dropped <= tokens * t_.top_k,
                          "steps[{}].dropped[{}]: {} is above tokens * top_k = {}", index, src,
                          dropped, tokens * t_.top_k);
      int64_t sum = 0;
      for (int e = 0; e < t_.num_experts; ++e) {
        // Each token picks top_k distinct experts, so no expert gets more than its tokens.
        const int64_t c = s.at(src, e);
        FEPLB_REQUIRE_INPUT(c <= tokens, "steps[{}].counts[{}][{}]: {} is above {} = {}", index,
                            src, e, c, s.tokens.empty() ? "tokens_per_rank" : "the rank's tokens",
                            tokens);
        sum += c;
      }
      if (s.tokens.empty() && s.dropped.empty()) {
        FEPLB_REQUIRE_INPUT(sum == tokens * t_.top_k,
                            "steps[{}].counts[{}]: sums to {}, expected tokens_per_rank * top_k = "
                            "{}",
                            index, src, sum, tokens * t_.top_k);
      } else {
        FEPLB_REQUIRE_INPUT(sum == tokens * t_.top_k - dropped,
                            "steps[{}].counts[{}]: sums to {}, expected tokens[{}] * top_k - "
                            "dropped[{}] = {} * {} - {} = {}",
                            index, src, sum, src, src, tokens, t_.top_k, dropped,
                            tokens * t_.top_k - dropped);
      }
    }
  }

  Trace t_;
  std::set<std::string> seen_;  // header members seen
  bool seen_format_ = false, saw_steps_ = false, shape_checked_ = false;
  bool shape_known_ = false, values_known_ = false;
  bool values_checked_header_ = false;
  size_t values_checked_ = 0;  // t_.steps[0, values_checked_) have had check_values
  std::set<std::pair<int64_t, int64_t>> seen_ids_;
  std::vector<Pending> pending_;  // steps read before the shape was known
  Pending step_;                  // the step being read
  size_t row_start_ = 0, overflow_ = 0;
  int64_t numbers_ = 0;
  std::vector<size_t> step_index_;  // [t_.steps]: index in the file's "steps"
  ByteSource& input_;               // read_plain_counts reads from it directly
  // Files this large are read into huge pages (internal/huge_page_heap.h).
  static constexpr int64_t kHugePagesFrom = int64_t{64} << 20;
  std::optional<HugePageHeap> heap_;
};

Trace read_from(ByteSource& source) {
  TraceReader reader(source);
  json_stream::parse(source, reader);
  return reader.finish();
}

}  // namespace

Trace parse_trace(std::string_view text) {
  ByteSource source(text, kTraceFormat, limits::kMaxTraceBytes);
  return read_from(source);
}

Trace read_trace(const std::string& path) {
  return parse_input(path, kTraceFormat, limits::kMaxTraceBytes, read_from);
}

std::string format_trace(const Trace& t) {
  nlohmann::ordered_json head = nlohmann::ordered_json::object();
  head["format"] = kTraceFormat;
  head["model"] = t.model;
  head["num_experts"] = t.num_experts;
  head["top_k"] = t.top_k;
  head["num_ranks"] = t.num_ranks;
  head["tokens_per_rank"] = t.tokens_per_rank;
  if (t.expert_shape) {
    head["expert_shape"] = {{"hidden", t.expert_shape->hidden},
                            {"ffn", t.expert_shape->ffn},
                            {"dtype", dtype_name(t.expert_shape->dtype)}};
  }
  if (!t.generator_json.empty()) {
    head["generator"] = nlohmann::ordered_json::parse(t.generator_json);
  }
  // The header as one JSON object, then "steps" with one step per line (diff-friendly); a step's
  // members in alphabetical order.
  std::string out = head.dump();
  out.pop_back();  // the closing brace; "steps" is appended as the last member
  out += ",\n\"steps\":[\n";
  auto inserter = std::back_inserter(out);
  for (size_t i = 0; i < t.steps.size(); ++i) {
    const RoutingStep& s = t.steps[i];
    out += "{\"counts\":[";
    for (int src = 0; src < s.num_ranks; ++src) {
      fmt::format_to(inserter, "{}[{}]", src ? "," : "", fmt::join(s.row(src), ","));
    }
    out += ']';
    if (!s.dropped.empty())
      fmt::format_to(inserter, ",\"dropped\":[{}]", fmt::join(s.dropped, ","));
    fmt::format_to(inserter, ",\"layer\":{},\"step\":{}", s.layer, s.step);
    if (!s.tokens.empty()) fmt::format_to(inserter, ",\"tokens\":[{}]", fmt::join(s.tokens, ","));
    out += i + 1 < t.steps.size() ? "},\n" : "}\n";
  }
  out += "]}\n";
  return out;
}

}  // namespace feplb
