// GPU presence and properties. Skips with the driver's reason where there is no GPU.
#include "feplb/cuda/device.h"

#include <gtest/gtest.h>

namespace feplb {
namespace {

TEST(Device, ListsHopperClassGpus) {
  std::string why;
  const auto devices = list_devices(&why);
  if (devices.empty()) GTEST_SKIP() << "no GPU: " << why;
  for (const DeviceInfo& d : devices) {
    EXPECT_GT(d.sm_count, 0) << d.name;
    EXPECT_GT(d.total_memory_bytes, 0) << d.name;
    EXPECT_GE(d.async_engine_count, 1) << d.name << ": no copy engine";
    EXPECT_GE(d.cc_major, 9) << d.name << ": feplb targets sm_90 (Hopper) and newer";
  }
}

}  // namespace
}  // namespace feplb
