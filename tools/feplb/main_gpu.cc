// feplb-gpu: the GPU commands of feplb (`run`, `devices`), built only with CUDA. `feplb run` and
// `feplb devices` exec this binary, so that every other command starts without loading CUDA.
// Exit codes: 0 ok, 2 bad input or no GPU (one line on stderr), 1 internal.
#include <CLI/CLI.hpp>

#include "bench/harness/trace_runner.h"
#include "cli.h"

int main(int argc, char** argv) {
  feplb::cuda::request_stream_connections();  // before any CUDA call (virtual ranks in `run`)
  CLI::App app{"feplb-gpu: the GPU commands of feplb (started by `feplb run` and `feplb devices`)",
               "feplb"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "feplb 0.1.0");
  feplb::cli::add_devices_command(app);
  feplb::cli::add_run_command(app);
  return feplb::cli::run_app(app, argc, argv);
}
