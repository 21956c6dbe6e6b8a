// Small file helpers shared by every reader and writer: whole-file reads with clear errors, and
// writes that never clobber what the user has unless asked (atomic rename from a temporary).
#pragma once

#include <string>
#include <string_view>

#include "feplb/core/error.h"

namespace feplb {

// Whole file as a string; InputError "PATH: cannot read (...)" when it does not exist or fails.
std::string read_file(const std::string& path);

// Reads `path` and returns parse(text); an InputError from parse gets "PATH: " in front.
template <typename Parse>
auto parse_file(const std::string& path, const Parse& parse) -> decltype(parse(std::string())) {
  const std::string text = read_file(path);
  try {
    return parse(text);
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: {}", path, e.what()));
  }
}

// Writes `content` to `path` through PATH.tmp + rename. Unless `overwrite`, an existing file is
// an InputError ("PATH exists; pass --force to overwrite").
void write_file(const std::string& path, std::string_view content, bool overwrite);

}  // namespace feplb
