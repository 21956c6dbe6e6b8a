// feplb knobs: every tunable with its default, unit and meaning (the source of docs/knobs.md).
#include <fmt/format.h>

#include <cstdio>
#include <memory>

#include "cli.h"

namespace feplb::cli {

void add_knobs_command(CLI::App& app) {
  auto markdown = std::make_shared<bool>(false);
  CLI::App* cmd =
      app.add_subcommand("knobs", "List every knob with its default (flags of simulate)");
  cmd->add_flag("--markdown", *markdown, "print a Markdown table");
  cmd->callback([markdown] {
    Knobs knobs;
    if (*markdown) std::printf("| flag | default | unit | meaning |\n|---|---|---|---|\n");
    for (const KnobInfo& k : list_knobs(knobs)) {
      const std::string def = fmt::format("{}", k.default_value);
      if (*markdown) {
        std::printf("| `%s` | %s | %s | %s |\n", k.flag.c_str(), def.c_str(),
                    std::string(k.unit).c_str(), std::string(k.help).c_str());
      } else {
        std::printf("%-26s %10s %-12s %s\n", k.flag.c_str(), def.c_str(),
                    std::string(k.unit).c_str(), std::string(k.help).c_str());
      }
    }
  });
}

}  // namespace feplb::cli
