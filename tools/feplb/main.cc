// feplb: the command-line tool. Exit codes: 0 ok, 2 bad input (one line on stderr), 1 internal.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <new>

#include "cli.h"
#include "feplb/core/error.h"
#ifdef FEPLB_HAVE_CUDA
#include "bench/harness/trace_runner.h"
#endif

int main(int argc, char** argv) {
#ifdef FEPLB_HAVE_CUDA
  feplb::cuda::request_stream_connections();  // before any CUDA call (virtual ranks in `run`)
#endif
  CLI::App app{
      "feplb: per-micro-batch MoE expert-parallel load balancing on the GPU copy engine.\n"
      "Start with `feplb simulate` (bundled trace, no GPU needed)."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "feplb 0.1.0");
  feplb::cli::add_simulate_command(app);
  feplb::cli::add_place_command(app);
  feplb::cli::add_trace_commands(app);
  feplb::cli::add_knobs_command(app);
  feplb::cli::add_devices_command(app);
  feplb::cli::add_run_command(app);
  feplb::cli::add_report_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "feplb: error: %s (see --help)\n", e.what());
    return 2;
  } catch (const feplb::InputError& e) {
    std::fprintf(stderr, "feplb: error: %s\n", e.what());
    return 2;
  } catch (const feplb::Error& e) {
    std::fprintf(stderr, "feplb: internal error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "feplb: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "feplb: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
