// feplb: the command-line tool (CPU only; links no CUDA). `feplb run` and `feplb devices` are
// served by feplb-gpu, built beside it when CUDA is available, which this binary execs.
// Exit codes: 0 ok, 2 bad input (one line on stderr), 1 internal.
#include <malloc.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include "cli.h"
#include "feplb/core/error.h"

namespace {

// The GPU commands: exec feplb-gpu from this binary's directory with the same arguments.
[[noreturn]] void exec_gpu_binary(int argc, char** argv) {
  const std::string self = feplb::cli::self_directory();
  const std::string gpu = self.empty() ? std::string() : self + "/feplb-gpu";
  if (gpu.empty() || ::access(gpu.c_str(), X_OK) != 0) {
    std::fprintf(stderr,
                 "feplb: error: `feplb %s` needs feplb-gpu beside this binary (%s), which this "
                 "build did not make: it was built without CUDA (no nvcc at build time)\n",
                 argv[1], gpu.empty() ? "feplb-gpu" : gpu.c_str());
    std::exit(2);
  }
  std::vector<char*> args(argv, argv + argc);
  args[0] = const_cast<char*>("feplb");
  args.push_back(nullptr);
  std::fflush(stdout);
  ::execv(gpu.c_str(), args.data());
  std::perror(("feplb: error: cannot run " + gpu).c_str());
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  // The heap grows 64 MiB at a time, so that reading a large trace faults in whole transparent huge
  // pages (feplb/core/internal/huge_page_heap.h): on a virtual machine a 4 KiB page fault costs
  // tens of microseconds, half of the read. The process's own choice; the library leaves it alone.
  ::mallopt(M_TOP_PAD, 64 << 20);
  if (argc >= 2 && (std::string(argv[1]) == "run" || std::string(argv[1]) == "devices")) {
    exec_gpu_binary(argc, argv);
  }
  CLI::App app{
      "feplb: per-micro-batch MoE expert-parallel load balancing on the GPU copy engine.\n"
      "Start with `feplb simulate` (bundled trace, no GPU needed)."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "feplb 0.1.0");
  feplb::cli::add_simulate_command(app);
  feplb::cli::add_place_command(app);
  feplb::cli::add_trace_commands(app);
  feplb::cli::add_knobs_command(app);
  feplb::cli::add_planner_time_command(app);
  feplb::cli::add_report_command(app);
  // Listed in --help; never parsed here (exec_gpu_binary above).
  app.add_subcommand("devices", "List the GPUs feplb can use (exit 2 if none; runs feplb-gpu)");
  app.add_subcommand("run",
                     "Run the layer on this GPU over a trace: measured vs predicted (needs a GPU; "
                     "runs feplb-gpu)");
  return feplb::cli::run_app(app, argc, argv);
}
