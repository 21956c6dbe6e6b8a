// Small helpers every report of the simulator shares.
#pragma once

#include <filesystem>
#include <string>

namespace feplb {

inline constexpr double kMiB = 1024.0 * 1024.0;

// A file's name without folder and extension: the label of a prior or trace ("olmoe-1b-7b__..."
// for ".../olmoe-1b-7b__....json").
inline std::string file_stem(const std::string& path) {
  return std::filesystem::path(path).stem().string();
}

}  // namespace feplb
