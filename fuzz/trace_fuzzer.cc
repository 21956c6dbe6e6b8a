// libFuzzer target for the feplb-trace-v1 reader (scripts/fuzz): parse_trace may only accept a
// consistent trace or throw InputError; what it accepts must write back into an identical trace.
#include <cstdint>
#include <string>
#include <string_view>

#include "feplb/core/trace_io.h"
#include "fuzz_util.h"

namespace {

constexpr const char* kTarget = "trace_fuzzer";
using feplb::fuzz::finding;

// What every accepted trace must satisfy (the reader's promises to the planners).
void check_accepted(const feplb::Trace& t) {
  if (t.steps.empty()) finding(kTarget, "accepted a trace without steps");
  if (t.num_experts < 1 || t.num_ranks < 1 || t.num_experts % t.num_ranks != 0) {
    finding(kTarget, "accepted an impossible num_experts / num_ranks");
  }
  if (t.top_k < 1 || t.top_k > t.num_experts || t.tokens_per_rank < 0) {
    finding(kTarget, "accepted an impossible top_k / tokens_per_rank");
  }
  const size_t cells = static_cast<size_t>(t.num_ranks) * static_cast<size_t>(t.num_experts);
  for (const feplb::RoutingStep& s : t.steps) {
    if (s.num_ranks != t.num_ranks || s.num_experts != t.num_experts || s.counts.size() != cells ||
        s.expert_counts.size() != static_cast<size_t>(t.num_experts)) {
      finding(kTarget, "step shape differs from the header");
    }
    if ((!s.tokens.empty() && s.tokens.size() != static_cast<size_t>(t.num_ranks)) ||
        (!s.dropped.empty() && s.dropped.size() != static_cast<size_t>(t.num_ranks))) {
      finding(kTarget, "tokens/dropped of the wrong length");
    }
    int64_t total = 0;
    for (int src = 0; src < s.num_ranks; ++src) {
      const int64_t tokens = t.tokens_of(s, src);
      if (tokens < 0 || tokens > t.tokens_per_rank) finding(kTarget, "tokens outside [0, S]");
      int64_t sum = 0;
      for (int64_t c : s.row(src)) {
        if (c < 0 || c > tokens) finding(kTarget, "accepted a count outside [0, tokens]");
        sum += c;
      }
      if (sum != t.rows_of(s, src)) finding(kTarget, "a row does not sum to tokens*K - dropped");
      total += sum;
    }
    if (s.total_rows() != total) finding(kTarget, "expert_counts do not add up");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto t = feplb::fuzz::accept_or_refuse(kTarget, [&] { return feplb::parse_trace(text); });
  if (!t) return 0;
  check_accepted(*t);
  feplb::fuzz::must_not_throw(kTarget, [&] {
    const std::string out = feplb::format_trace(*t);
    const feplb::Trace back = feplb::parse_trace(out);
    if (back.steps.size() != t->steps.size() || back.model != t->model ||
        back.generator_json != t->generator_json || back.tokens_per_rank != t->tokens_per_rank ||
        back.top_k != t->top_k || back.expert_shape.has_value() != t->expert_shape.has_value()) {
      finding(kTarget, "format_trace/parse_trace round trip changed the header");
    }
    for (size_t i = 0; i < t->steps.size(); ++i) {
      const feplb::RoutingStep &a = t->steps[i], &b = back.steps[i];
      if (a.step != b.step || a.layer != b.layer || a.counts != b.counts || a.tokens != b.tokens ||
          a.dropped != b.dropped) {
        finding(kTarget, "format_trace/parse_trace round trip changed a step");
      }
    }
    if (feplb::format_trace(back) != out) finding(kTarget, "format_trace is not stable");
  });
  return 0;
}
