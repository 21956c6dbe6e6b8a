// The library's exception types: what a caller catches. Error is a failure inside feplb or in a
// component it drives (CUDA, NCCL, a peer that never answers); InputError is bad input from the
// caller (a malformed file, inconsistent shapes, an impossible configuration, API misuse).
// No dependencies beyond the standard library, so public headers can include it.
#pragma once

#include <stdexcept>

namespace feplb {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class InputError : public Error {
 public:
  using Error::Error;
};

}  // namespace feplb
