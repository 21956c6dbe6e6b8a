#include "feplb/cuda/device.h"

#include "feplb/cuda/base/check.h"

namespace feplb {

std::vector<DeviceInfo> list_devices(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    if (why) *why = err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device";
    return {};
  }
  int driver = 0, runtime = 0;
  FEPLB_CUDA_CHECK(cudaDriverGetVersion(&driver));
  FEPLB_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  std::vector<DeviceInfo> out;
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp p{};
    FEPLB_CUDA_CHECK(cudaGetDeviceProperties(&p, d));
    out.push_back({d, p.name, p.major, p.minor, p.multiProcessorCount, p.asyncEngineCount,
                   static_cast<int64_t>(p.totalGlobalMem), driver, runtime});
  }
  return out;
}

}  // namespace feplb
