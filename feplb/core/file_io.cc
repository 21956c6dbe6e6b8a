#include "feplb/core/file_io.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "feplb/core/error.h"

namespace feplb {

std::string read_file(const std::string& path) {
  std::error_code ec;
  FEPLB_REQUIRE_INPUT(std::filesystem::exists(path, ec), "{}: no such file", path);
  FEPLB_REQUIRE_INPUT(!std::filesystem::is_directory(path, ec), "{}: is a directory", path);
  std::ifstream in(path, std::ios::binary);
  FEPLB_REQUIRE_INPUT(in.good(), "{}: cannot open ({})", path, std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  FEPLB_REQUIRE_INPUT(!in.bad(), "{}: read failed", path);
  return ss.str();
}

void write_file(const std::string& path, std::string_view content, bool overwrite) {
  namespace fs = std::filesystem;
  std::error_code ec;
  FEPLB_REQUIRE_INPUT(overwrite || !fs::exists(path, ec), "{}: exists; pass --force to overwrite",
                      path);
  const fs::path parent = fs::path(path).parent_path();
  FEPLB_REQUIRE_INPUT(parent.empty() || fs::is_directory(parent, ec),
                      "{}: directory {} does not exist", path, parent.string());
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    FEPLB_REQUIRE_INPUT(out.good(), "{}: cannot write ({})", tmp, std::strerror(errno));
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
    out.flush();
    FEPLB_REQUIRE_INPUT(out.good(), "{}: write failed ({})", tmp, std::strerror(errno));
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw InputError(fmt::format("{}: cannot rename into place ({})", path, ec.message()));
  }
}

}  // namespace feplb
