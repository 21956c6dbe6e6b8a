// Reading and writing feplb-trace-v1 files. The reader checks everything (shapes, integer counts,
// row sums) and throws InputError with a one-line message naming the field and step index.
#pragma once

#include <string>
#include <string_view>

#include "feplb/core/routing.h"

namespace feplb {

inline constexpr std::string_view kTraceFormat = "feplb-trace-v1";

// Parses a whole trace document. Throws InputError on any malformed or inconsistent content.
Trace parse_trace(std::string_view text);
// Reads `path` (InputError if missing or unreadable); errors are prefixed with the path.
Trace read_trace(const std::string& path);
// Serialises the trace: one JSON document, one step per line.
std::string format_trace(const Trace& trace);

}  // namespace feplb
