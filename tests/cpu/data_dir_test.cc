// Where the bundled data is found (feplb/sim/data_dir.h): $FEPLB_DATA_DIR, then the installed
// copies, then the source tree's data/; an error listing every place when none has the file.
#include "feplb/sim/data_dir.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "feplb/core/errors.h"

namespace feplb {
namespace {

namespace fs = std::filesystem;

// A fresh folder under the system's temporary directory, removed at the end.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "feplb_data_XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data()) ? fs::path(tmpl) : throw std::runtime_error("mkdtemp failed");
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  std::string str() const { return path_.string(); }
  // Creates `relative` (with its folders) holding `text`.
  void put(const std::string& relative, const std::string& text = "x") const {
    fs::create_directories((path_ / relative).parent_path());
    std::ofstream(path_ / relative) << text;
  }

 private:
  fs::path path_;
};

TEST(DataDir, SearchOrderIsEnvironmentThenInstalledThenSourceTree) {
  const TempDir env, installed;
  const auto places = data_search_path(env.str().c_str(), {installed.str()});
  ASSERT_EQ(places.size(), 3u);
  EXPECT_EQ(places[0], env.str());
  EXPECT_EQ(places[1], installed.str());
  EXPECT_EQ(fs::path(places[2]).filename(), "data");  // the source tree's, compiled in
  EXPECT_TRUE(fs::exists(fs::path(places[2]) / "traces" / "default.json")) << places[2];

  // No FEPLB_DATA_DIR (unset or empty): the installed copies come first.
  EXPECT_EQ(data_search_path(nullptr, {installed.str()}).front(), installed.str());
  EXPECT_EQ(data_search_path("", {installed.str()}).front(), installed.str());
  // Duplicates (after normalising the path) are looked at once.
  EXPECT_EQ(data_search_path(env.str().c_str(), {env.str() + "/./", installed.str()}).size(), 3u);
}

TEST(DataDir, TheFirstPlaceHoldingTheFileWins) {
  const TempDir env, installed;
  const std::string rel = "traces/mine.json";
  const std::vector<std::string> search = data_search_path(env.str().c_str(), {installed.str()});
  env.put(rel, "env");
  installed.put(rel, "installed");
  EXPECT_EQ(find_data_dir(rel, search), env.str());
  EXPECT_EQ(find_data(rel, search), (env.path() / rel).string());
  fs::remove(env.path() / rel);  // not in the environment's folder: the installed copy
  EXPECT_EQ(find_data(rel, search), (installed.path() / rel).string());
  // Folders count too (the CLI looks for "cost" and "priors").
  EXPECT_EQ(find_data_dir("traces", search), env.str());
  // Neither: the source tree's own files are still found.
  EXPECT_EQ(find_data("traces/default.json", search),
            (fs::path(search[2]) / "traces/default.json").string());
}

TEST(DataDir, NoPlaceHoldingItIsAnInputErrorListingEveryPlace) {
  const TempDir env, installed;
  const std::vector<std::string> search = data_search_path(env.str().c_str(), {installed.str()});
  try {
    find_data("traces/no-such-trace.json", search);
    FAIL() << "no error";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("traces/no-such-trace.json not found in"), std::string::npos) << what;
    for (const std::string& place : search)
      EXPECT_NE(what.find(place), std::string::npos) << place << ": " << what;
    EXPECT_NE(what.find("FEPLB_DATA_DIR"), std::string::npos) << what;
  }
  EXPECT_THROW(find_data("x", {}), InputError);
}

// The process's search path reads FEPLB_DATA_DIR and looks next to this test binary
// (<bin>/../share/feplb/data) before the source tree.
TEST(DataDir, ProcessSearchPathReadsTheEnvironmentAndTheBinaryFolder) {
  const TempDir env;
  const char* old = std::getenv("FEPLB_DATA_DIR");
  const std::string saved = old ? old : "";
  ::setenv("FEPLB_DATA_DIR", env.str().c_str(), 1);
  const auto places = data_search_path({"/extra/installed"});
  if (old) {
    ::setenv("FEPLB_DATA_DIR", saved.c_str(), 1);
  } else {
    ::unsetenv("FEPLB_DATA_DIR");
  }
  ASSERT_GE(places.size(), 4u);
  EXPECT_EQ(places[0], env.str());
  EXPECT_EQ(places[1], "/extra/installed");
  const fs::path exe = fs::canonical("/proc/self/exe").parent_path();
  const std::string beside_binary = (exe / ".." / "share/feplb/data").lexically_normal().string();
  EXPECT_NE(std::find(places.begin(), places.end(), beside_binary), places.end()) << beside_binary;
  EXPECT_EQ(fs::path(places.back()).filename(), "data");
}

}  // namespace
}  // namespace feplb
