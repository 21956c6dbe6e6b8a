// Where feplb's bundled data is found (the priors, the default trace, the measured GEMM tables of
// data/): the same rule for the CLI, the Python module and any program linking feplb_sim, so an
// installed feplb reads its own copy, not the source tree it was built from.
//
// Search order (data_search_path), first place that has the file or folder wins:
//   1. $FEPLB_DATA_DIR, when set and not empty;
//   2. the installed copy: <prefix>/share/feplb/data, found from the running program
//      (<exe dir>/../share/feplb/data) and from the feplb library itself (<lib dir>/../share/...);
//      the Python package passes its own copy (feplb/data) here instead;
//   3. the source tree's data/ this library was built from (a build tree).
// None has it: an InputError that names the file and lists every place looked at.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace feplb {

// The places in order, without duplicates: `env_dir` (the value of FEPLB_DATA_DIR; null or empty:
// skipped), then `installed`, then the source tree's data/ (compiled in). Pure: reads nothing.
std::vector<std::string> data_search_path(const char* env_dir,
                                          const std::vector<std::string>& installed);

// This process's places: FEPLB_DATA_DIR from the environment, then the installed copy relative to
// the running executable and to the library, then the source tree's data/. Extra installed places
// (the Python package's copy) go before those two.
std::vector<std::string> data_search_path(const std::vector<std::string>& extra_installed = {});

// The first place in `search` holding `relative` (a file or folder, e.g. "traces/default.json",
// "cost"), as that place's path; InputError "bundled data: <relative> not found in: A, B, C
// (set FEPLB_DATA_DIR ...)" otherwise.
std::string find_data_dir(std::string_view relative, const std::vector<std::string>& search);
// `<place>/<relative>` for that place.
std::string find_data(std::string_view relative, const std::vector<std::string>& search);
// The same over this process's data_search_path().
std::string find_data_dir(std::string_view relative);
std::string find_data(std::string_view relative);

}  // namespace feplb
