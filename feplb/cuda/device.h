// GPUs visible to this process, described with plain types (no CUDA headers), so the CLI and the
// host-side code can ask without including CUDA.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace feplb {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  int async_engine_count = 0;  // copy engines the runtime exposes
  int64_t total_memory_bytes = 0;
  int driver_version = 0, runtime_version = 0;
};

// Every visible GPU; empty when there is none or no driver. `why` says why when empty.
std::vector<DeviceInfo> list_devices(std::string* why = nullptr);

}  // namespace feplb
