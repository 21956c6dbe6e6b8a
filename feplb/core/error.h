// The checks that raise feplb's exceptions (feplb/core/errors.h), for the library's own sources:
// FEPLB_CHECK for internal invariants (Error with file:line), FEPLB_REQUIRE_INPUT for what the
// caller gave (InputError: the CLI prints it on one line, exit 2). Uses fmt; public headers
// include errors.h instead.
#pragma once

#include <fmt/format.h>

#include <string>

#include "feplb/core/errors.h"

namespace feplb {

[[noreturn]] inline void fail_internal(const char* file, int line, const std::string& what) {
  throw Error(fmt::format("{}:{}: {}", file, line, what));
}

}  // namespace feplb

// Internal invariant: FEPLB_CHECK(x > 0, "x was {}", x).
#define FEPLB_CHECK(cond, ...)                                                                     \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      ::feplb::fail_internal(__FILE__, __LINE__,                                                   \
                             std::string("check failed: " #cond ": ") + fmt::format(__VA_ARGS__)); \
    }                                                                                              \
  } while (0)

// User input: FEPLB_REQUIRE_INPUT(ok, "steps[{}].counts: row {} has {} entries", ...).
#define FEPLB_REQUIRE_INPUT(cond, ...)                                \
  do {                                                                \
    if (!(cond)) throw ::feplb::InputError(fmt::format(__VA_ARGS__)); \
  } while (0)
