// Small file helpers shared by every reader and writer: whole-file reads with clear errors, and
// writes that never clobber what the user has unless asked (atomic rename from a temporary).
#pragma once

#include <string>
#include <string_view>

namespace feplb {

// Whole file as a string; InputError "PATH: cannot read (...)" when it does not exist or fails.
std::string read_file(const std::string& path);

// Writes `content` to `path` through PATH.tmp + rename. Unless `overwrite`, an existing file is
// an InputError ("PATH exists; pass --force to overwrite").
void write_file(const std::string& path, std::string_view content, bool overwrite);

}  // namespace feplb
