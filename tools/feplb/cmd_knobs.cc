// feplb knobs: every tunable with its default, range, unit and meaning (the source of
// docs/knobs.md).
#include <fmt/format.h>

#include <cstdio>
#include <memory>

#include "cli.h"

namespace feplb::cli {
namespace {

std::string number(double v) {
  if (v >= 1e9 && v == static_cast<double>(static_cast<int64_t>(v))) {
    const auto i = static_cast<int64_t>(v);
    for (int p = 30; p < 63; ++p) {
      if (i == (int64_t{1} << p)) return fmt::format("2^{}", p);
      if (i == (int64_t{1} << p) - 1) return fmt::format("2^{}-1", p);
    }
  }
  return fmt::format("{}", v);
}

}  // namespace

void add_knobs_command(CLI::App& app) {
  auto markdown = std::make_shared<bool>(false);
  CLI::App* cmd =
      app.add_subcommand("knobs",
                         "List every knob with its default and range (flags of simulate, "
                         "report, place, run)");
  cmd->add_flag("--markdown", *markdown, "print a Markdown table");
  cmd->callback([markdown] {
    Knobs knobs;
    if (*markdown) {
      std::printf("| flag | default | range | unit | meaning |\n|---|---|---|---|---|\n");
    }
    for (const KnobInfo& k : list_knobs(knobs)) {
      const std::string def = number(k.default_value);
      const std::string range = fmt::format("{}..{}", number(k.minimum), number(k.maximum));
      if (*markdown) {
        std::printf("| `%s` | %s | %s | %s | %s |\n", k.flag.c_str(), def.c_str(), range.c_str(),
                    std::string(k.unit).c_str(), std::string(k.help).c_str());
      } else {
        std::printf("%-26s %10s %-18s %-12s %s\n", k.flag.c_str(), def.c_str(), range.c_str(),
                    std::string(k.unit).c_str(), std::string(k.help).c_str());
      }
    }
  });
}

}  // namespace feplb::cli
