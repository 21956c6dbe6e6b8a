// Errors: one exception type for the whole library, and the checks that raise it.
// InputError is for what the user gave us (a trace, a flag): the CLI prints it on one line, exit 2.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace feplb {

// A bug or a broken invariant inside feplb (message carries file:line).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad input from the user: malformed file, inconsistent shapes, impossible configuration.
class InputError : public Error {
 public:
  using Error::Error;
};

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
