// Shared by the libFuzzer targets (scripts/fuzz): a reader may accept its input or refuse it with
// an InputError; a crash, another exception or a broken promise about what it accepted is a
// finding (abort, so libFuzzer saves the input).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>

#include "feplb/core/error.h"

namespace feplb::fuzz {

[[noreturn]] inline void finding(const char* target, const char* what) {
  std::fprintf(stderr, "%s: %s\n", target, what);
  std::abort();
}

// parse(): the reader's result, or nullopt when it refused the input with an InputError.
template <typename Parse>
auto accept_or_refuse(const char* target, const Parse& parse) -> std::optional<decltype(parse())> {
  try {
    return parse();
  } catch (const InputError&) {
    return std::nullopt;  // the one acceptable way to refuse an input
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: unexpected exception: %s\n", target, e.what());
    std::abort();
  } catch (...) {
    finding(target, "unexpected non-std exception");
  }
}

// Whatever a reader accepted, writing it back and reading it again must succeed: here even an
// InputError is a finding.
template <typename Fn>
void must_not_throw(const char* target, const Fn& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: round trip of an accepted input threw: %s\n", target, e.what());
    std::abort();
  }
}

}  // namespace feplb::fuzz
