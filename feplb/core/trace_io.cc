#include "feplb/core/trace_io.h"

#include <limits>
#include <set>
#include <utility>

#include "feplb/core/error.h"
#include "feplb/core/file_io.h"
#include "feplb/core/internal/json_input.h"

namespace feplb {
namespace {

using json_input::int_in;
using json_input::json;
using json_input::member;
using json_input::type_of;

// Limits that keep a malformed or hostile file from asking for absurd memory.
constexpr int64_t kMaxRanks = 1 << 14;
constexpr int64_t kMaxExperts = 1 << 16;
constexpr int64_t kMaxTokensPerRank = int64_t{1} << 32;

std::optional<ExpertShape> parse_shape(const json& v) {
  FEPLB_REQUIRE_INPUT(v.is_object(), "expert_shape: expected an object, got {}", type_of(v));
  ExpertShape s;
  s.hidden = int_in(member(v, "hidden", "expert_shape."), "expert_shape.hidden", 1, 1 << 20);
  s.ffn = int_in(member(v, "ffn", "expert_shape."), "expert_shape.ffn", 1, 1 << 20);
  if (auto it = v.find("dtype"); it != v.end()) {
    FEPLB_REQUIRE_INPUT(it->is_string(), "expert_shape.dtype: expected a string, got {}",
                        type_of(*it));
    s.dtype = parse_dtype(it->get<std::string>(), "expert_shape.dtype");
  }
  return s;
}

RoutingStep parse_step(const json& v, size_t index, const Trace& t) {
  const std::string where = fmt::format("steps[{}]", index);
  FEPLB_REQUIRE_INPUT(v.is_object(), "{}: expected an object, got {}", where, type_of(v));
  const int64_t step = int_in(member(v, "step", where + "."), where + ".step", 0,
                              std::numeric_limits<int32_t>::max());
  const int64_t layer = int_in(member(v, "layer", where + "."), where + ".layer", 0,
                               std::numeric_limits<int32_t>::max());
  const json& counts = member(v, "counts", where + ".");
  FEPLB_REQUIRE_INPUT(counts.is_array(), "{}.counts: expected an array, got {}", where,
                      type_of(counts));
  FEPLB_REQUIRE_INPUT(counts.size() == static_cast<size_t>(t.num_ranks),
                      "{}.counts: has {} rows, expected num_ranks = {}", where, counts.size(),
                      t.num_ranks);
  // Every row's shape is checked before the [num_ranks, num_experts] matrix is allocated: the
  // header alone may ask for gigabytes, which only a file that big may make us allocate.
  for (int src = 0; src < t.num_ranks; ++src) {
    const json& row = counts[static_cast<size_t>(src)];
    FEPLB_REQUIRE_INPUT(row.is_array(), "{}.counts[{}]: expected an array, got {}", where, src,
                        type_of(row));
    FEPLB_REQUIRE_INPUT(row.size() == static_cast<size_t>(t.num_experts),
                        "{}.counts[{}]: has {} entries, expected num_experts = {}", where, src,
                        row.size(), t.num_experts);
  }
  RoutingStep s(step, layer, t.num_ranks, t.num_experts);
  const int64_t row_sum = t.rows_per_rank();
  for (int src = 0; src < t.num_ranks; ++src) {
    const json& row = counts[static_cast<size_t>(src)];
    int64_t sum = 0;
    for (int e = 0; e < t.num_experts; ++e) {
      // Each token picks top_k distinct experts, so no expert gets more than S rows from a rank.
      const int64_t c =
          int_in(row[static_cast<size_t>(e)], fmt::format("{}.counts[{}][{}]", where, src, e), 0,
                 t.tokens_per_rank);
      s.at(src, e) = c;
      sum += c;
    }
    FEPLB_REQUIRE_INPUT(sum == row_sum,
                        "{}.counts[{}]: sums to {}, expected tokens_per_rank * top_k = {}", where,
                        src, sum, row_sum);
  }
  s.sum_experts();
  return s;
}

}  // namespace

Trace parse_trace(std::string_view text) {
  // A trace nests 5 deep (document, steps, step, counts, row); parse_document refuses far deeper.
  const json doc = json_input::parse_document(text);
  FEPLB_REQUIRE_INPUT(doc.is_object(), "expected a JSON object at the top, got {}", type_of(doc));
  const json& format = member(doc, "format", "");
  FEPLB_REQUIRE_INPUT(format.is_string() && format.get<std::string>() == kTraceFormat,
                      "format: expected \"{}\", got {}", kTraceFormat, format.dump());

  Trace t;
  if (auto it = doc.find("model"); it != doc.end()) {
    FEPLB_REQUIRE_INPUT(it->is_string(), "model: expected a string, got {}", type_of(*it));
    t.model = it->get<std::string>();
  }
  t.num_experts =
      static_cast<int>(int_in(member(doc, "num_experts", ""), "num_experts", 1, kMaxExperts));
  t.num_ranks = static_cast<int>(int_in(member(doc, "num_ranks", ""), "num_ranks", 1, kMaxRanks));
  t.top_k = static_cast<int>(int_in(member(doc, "top_k", ""), "top_k", 1, t.num_experts));
  t.tokens_per_rank =
      int_in(member(doc, "tokens_per_rank", ""), "tokens_per_rank", 0, kMaxTokensPerRank);
  FEPLB_REQUIRE_INPUT(t.num_experts % t.num_ranks == 0,
                      "num_experts: {} is not divisible by num_ranks {}", t.num_experts,
                      t.num_ranks);
  if (auto it = doc.find("expert_shape"); it != doc.end()) t.expert_shape = parse_shape(*it);
  if (auto it = doc.find("generator"); it != doc.end()) {
    FEPLB_REQUIRE_INPUT(it->is_object(), "generator: expected an object, got {}", type_of(*it));
    t.generator_json = it->dump();
  }

  const json& steps = member(doc, "steps", "");
  FEPLB_REQUIRE_INPUT(steps.is_array(), "steps: expected an array, got {}", type_of(steps));
  FEPLB_REQUIRE_INPUT(!steps.empty(), "steps: empty; a trace needs at least one step");
  std::set<std::pair<int64_t, int64_t>> seen;
  t.steps.reserve(std::min<size_t>(steps.size(), 4096));
  for (size_t i = 0; i < steps.size(); ++i) {
    RoutingStep s = parse_step(steps[i], i, t);
    FEPLB_REQUIRE_INPUT(seen.emplace(s.step, s.layer).second,
                        "steps[{}]: step {} layer {} appears twice", i, s.step, s.layer);
    t.steps.push_back(std::move(s));
  }
  return t;
}

Trace read_trace(const std::string& path) {
  return parse_file(path, [](const std::string& text) { return parse_trace(text); });
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
  if (!t.generator_json.empty())
    head["generator"] = nlohmann::ordered_json::parse(t.generator_json);
  // The header as one JSON object, then "steps" with one step per line (diff-friendly).
  std::string out = head.dump();
  out.pop_back();  // the closing brace; "steps" is appended as the last member
  out += ",\n\"steps\":[\n";
  for (size_t i = 0; i < t.steps.size(); ++i) {
    const RoutingStep& s = t.steps[i];
    json rows = json::array();
    for (int src = 0; src < s.num_ranks; ++src) {
      auto r = s.row(src);
      rows.push_back(std::vector<int64_t>(r.begin(), r.end()));
    }
    json step = {{"step", s.step}, {"layer", s.layer}, {"counts", std::move(rows)}};
    out += step.dump();
    out += i + 1 < t.steps.size() ? ",\n" : "\n";
  }
  out += "]}\n";
  return out;
}

}  // namespace feplb
