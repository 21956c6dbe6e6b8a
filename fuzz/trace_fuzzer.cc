// libFuzzer target for the feplb-trace-v1 reader (run by scripts/fuzz): parse_trace may only accept
// a consistent trace or throw InputError; anything else (crash, other exception) is a finding.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include "feplb/core/error.h"
#include "feplb/core/trace_io.h"

namespace {

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "trace_fuzzer: %s\n", what);
  std::abort();
}

// What every accepted trace must satisfy (the reader's promises to the planners).
void check_accepted(const feplb::Trace& t) {
  if (t.steps.empty()) finding("accepted a trace without steps");
  if (t.num_experts < 1 || t.num_ranks < 1 || t.num_experts % t.num_ranks != 0) {
    finding("accepted an impossible num_experts / num_ranks");
  }
  if (t.top_k < 1 || t.top_k > t.num_experts || t.tokens_per_rank < 0) {
    finding("accepted an impossible top_k / tokens_per_rank");
  }
  const size_t cells = static_cast<size_t>(t.num_ranks) * static_cast<size_t>(t.num_experts);
  for (const feplb::RoutingStep& s : t.steps) {
    if (s.num_ranks != t.num_ranks || s.num_experts != t.num_experts || s.counts.size() != cells ||
        s.expert_counts.size() != static_cast<size_t>(t.num_experts)) {
      finding("step shape differs from the header");
    }
    for (int src = 0; src < s.num_ranks; ++src) {
      int64_t sum = 0;
      for (int64_t c : s.row(src)) {
        if (c < 0 || c > t.tokens_per_rank) finding("accepted a count outside [0, S]");
        sum += c;
      }
      if (sum != t.rows_per_rank()) finding("accepted a row that does not sum to S * K");
    }
    if (s.total_rows() != t.rows_per_rank() * t.num_ranks) finding("expert_counts do not add up");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  feplb::Trace t;
  try {
    t = feplb::parse_trace(text);
  } catch (const feplb::InputError&) {
    return 0;  // the one acceptable way to refuse an input
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trace_fuzzer: unexpected exception: %s\n", e.what());
    std::abort();
  } catch (...) {
    finding("unexpected non-std exception");
  }
  check_accepted(t);
  // Whatever the reader accepts, the writer must write back into an identical trace; here even
  // an InputError is a finding.
  try {
    const std::string out = feplb::format_trace(t);
    const feplb::Trace back = feplb::parse_trace(out);
    if (back.steps.size() != t.steps.size() || back.model != t.model ||
        back.generator_json != t.generator_json || back.tokens_per_rank != t.tokens_per_rank ||
        back.top_k != t.top_k || back.expert_shape.has_value() != t.expert_shape.has_value()) {
      finding("format_trace/parse_trace round trip changed the header");
    }
    for (size_t i = 0; i < t.steps.size(); ++i) {
      if (back.steps[i].step != t.steps[i].step || back.steps[i].layer != t.steps[i].layer ||
          back.steps[i].counts != t.steps[i].counts) {
        finding("format_trace/parse_trace round trip changed a step");
      }
    }
    if (feplb::format_trace(back) != out) finding("format_trace is not stable");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trace_fuzzer: round trip of an accepted trace threw: %s\n", e.what());
    std::abort();
  }
  return 0;
}
