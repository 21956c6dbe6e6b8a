// feplb knobs: every tunable with its default, range, unit and meaning, and with --gpus every GPU
// class (the sources of docs/knobs.md).
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

void print_gpu_classes(bool markdown) {
  if (markdown) {
    std::printf(
        "| `--gpu` | device | copy GB/s in a domain | between domains | GEMM peak TFLOP/s | HBM "
        "GB/s | SMs | GEMM tables | provenance | where the numbers come from |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n");
  }
  for (const GpuClass& g : gpu_class_list()) {
    const std::string table = g.table_device.empty()
                                  ? "-"
                                  : fmt::format("data/cost/*.json measured on {}", g.table_device);
    if (markdown) {
      std::fputs(fmt::format("| `{}` | {} | {:g} | {:g} | {:g} | {:g} | {} | {} | {} | {} |\n",
                             g.name, g.device, g.copy_gbps, g.internode_gbps, g.gemm_peak_tflops,
                             g.hbm_gbps, g.num_sms, table, g.provenance(), g.source)
                     .c_str(),
                 stdout);
    } else {
      std::fputs(fmt::format("{:<6} {} ({}): copy engine {:g} GB/s in a domain, {:g} between "
                             "domains; {:g} TFLOP/s, {:g} GB/s HBM, {} SMs; GEMM tables {}\n       "
                             "{}\n",
                             g.name, g.device, g.provenance(), g.copy_gbps, g.internode_gbps,
                             g.gemm_peak_tflops, g.hbm_gbps, g.num_sms, table, g.source)
                     .c_str(),
                 stdout);
    }
  }
}

}  // namespace

void add_knobs_command(CLI::App& app) {
  auto markdown = std::make_shared<bool>(false);
  auto gpus = std::make_shared<bool>(false);
  CLI::App* cmd =
      app.add_subcommand("knobs",
                         "List every knob with its default and range (flags of simulate, "
                         "report, place, run)");
  cmd->add_flag("--markdown", *markdown, "print a Markdown table");
  cmd->add_flag("--gpus", *gpus, "list the GPU classes (--gpu of simulate and report) instead");
  cmd->callback([markdown, gpus] {
    if (*gpus) {
      print_gpu_classes(*markdown);
      return;
    }
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
