#include "feplb/sim/data_dir.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "feplb/core/error.h"

// Compiled in by feplb/sim/CMakeLists.txt: the source tree's data/, and the installed data folder
// relative to the installed binaries' and libraries' folders.
#ifndef FEPLB_SOURCE_DATA_DIR
#define FEPLB_SOURCE_DATA_DIR ""
#endif
#ifndef FEPLB_BIN_TO_DATA
#define FEPLB_BIN_TO_DATA "../share/feplb/data"
#endif
#ifndef FEPLB_LIB_TO_DATA
#define FEPLB_LIB_TO_DATA "../share/feplb/data"
#endif

namespace feplb {
namespace {

namespace fs = std::filesystem;

// The folder of the file `path` resolves to (symbolic links followed), or "" if it cannot.
fs::path folder_of(const fs::path& path) {
  std::error_code ec;
  const fs::path real = fs::canonical(path, ec);
  return ec ? fs::path() : real.parent_path();
}

// The folder of the shared library (or executable) this function was linked into.
fs::path library_folder() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&library_folder), &info) == 0 || !info.dli_fname)
    return {};
  return folder_of(info.dli_fname);
}

}  // namespace

std::vector<std::string> data_search_path(const char* env_dir,
                                          const std::vector<std::string>& installed) {
  std::vector<std::string> places;
  const auto add = [&](const std::string& p) {
    if (p.empty()) return;
    fs::path n = fs::path(p).lexically_normal();
    if (!n.has_filename() && n.has_relative_path()) n = n.parent_path();  // "dir/" -> "dir"
    const std::string normal = n.string();
    if (std::find(places.begin(), places.end(), normal) == places.end()) places.push_back(normal);
  };
  if (env_dir) add(env_dir);
  for (const std::string& p : installed) add(p);
  add(FEPLB_SOURCE_DATA_DIR);
  return places;
}

std::vector<std::string> data_search_path(const std::vector<std::string>& extra_installed) {
  std::vector<std::string> installed = extra_installed;
  if (const fs::path exe = folder_of("/proc/self/exe"); !exe.empty()) {
    installed.push_back((exe / FEPLB_BIN_TO_DATA).string());
  }
  if (const fs::path lib = library_folder(); !lib.empty())
    installed.push_back((lib / FEPLB_LIB_TO_DATA).string());
  return data_search_path(std::getenv("FEPLB_DATA_DIR"), installed);
}

std::string find_data_dir(std::string_view relative, const std::vector<std::string>& search) {
  std::error_code ec;
  std::string looked;
  for (const std::string& place : search) {
    if (fs::exists(fs::path(place) / relative, ec)) return place;
    looked += (looked.empty() ? "" : ", ") + place;
  }
  throw InputError(fmt::format(
      "bundled data: {} not found in: {} (set FEPLB_DATA_DIR to a folder holding it, e.g. the "
      "repository's data/ or <prefix>/share/feplb/data)",
      relative, looked.empty() ? "(nowhere: no place to look)" : looked));
}

std::string find_data(std::string_view relative, const std::vector<std::string>& search) {
  return (fs::path(find_data_dir(relative, search)) / relative).string();
}

std::string find_data_dir(std::string_view relative) {
  return find_data_dir(relative, data_search_path());
}

std::string find_data(std::string_view relative) { return find_data(relative, data_search_path()); }

}  // namespace feplb
