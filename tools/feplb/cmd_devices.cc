// feplb devices: the GPUs this build can use, or why there are none.
#include <cstdio>

#include "cli.h"
#include "feplb/core/error.h"
#ifdef FEPLB_HAVE_CUDA
#include "feplb/cuda/device.h"
#endif

namespace feplb::cli {

void add_devices_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("devices", "List the GPUs feplb can use (exit 2 if none)");
  cmd->callback([] {
#ifdef FEPLB_HAVE_CUDA
    std::string why;
    const auto devices = list_devices(&why);
    FEPLB_REQUIRE_INPUT(!devices.empty(), "no GPU available: {}", why);
    for (const DeviceInfo& d : devices) {
      std::printf("GPU %d: %s, sm_%d%d, %d SMs, %d copy engines, %.1f GiB, driver %d, runtime %d\n",
                  d.index, d.name.c_str(), d.cc_major, d.cc_minor, d.sm_count, d.async_engine_count,
                  static_cast<double>(d.total_memory_bytes) / (1 << 30), d.driver_version,
                  d.runtime_version);
    }
#else
    throw InputError(
        "this feplb was built without CUDA (no nvcc at build time); rebuild with nvcc");
#endif
  });
}

}  // namespace feplb::cli
