#include "feplb/core/gpu_class.h"

#include <fmt/format.h>

#include "feplb/core/error.h"
#include "feplb/core/knobs.h"

namespace feplb {

const std::vector<GpuClass>& gpu_class_list() {
  static const std::vector<GpuClass> list = {
#define FEPLB_GPU_CLASS(id, ...) gpu_classes::id,
#include "feplb/core/gpu_classes.def"
#undef FEPLB_GPU_CLASS
  };
  return list;
}

const GpuClass& find_gpu_class(std::string_view name) {
  std::vector<std::string_view> names;
  for (const GpuClass& g : gpu_class_list()) {
    if (g.name == name) return g;
    names.push_back(g.name);
  }
  throw InputError(
      fmt::format("--gpu: unknown GPU class '{}' (known: {})", name, fmt::join(names, ", ")));
}

void apply_gpu_class(const GpuClass& gpu, Knobs& knobs) {
  knobs.copy_gbps = gpu.copy_gbps;
  knobs.internode_gbps = gpu.internode_gbps;
  knobs.gemm_peak_tflops = gpu.gemm_peak_tflops;
  knobs.hbm_gbps = gpu.hbm_gbps;
  knobs.num_sms = gpu.num_sms;
}

std::string describe_gpu(const GpuClass& gpu, const Knobs& knobs) {
  const auto rate = [](double value, double class_value, const char* flag) {
    return value == class_value
               ? fmt::format("{:g} GB/s", value)
               : fmt::format("{:g} GB/s (set by {}; the class: {:g})", value, flag, class_value);
  };
  return fmt::format(
      "GPU class {} ({}; {}): copy engine {} per GPU per direction inside an NVLink domain, {} "
      "between domains",
      gpu.name, gpu.device, gpu.provenance(), rate(knobs.copy_gbps, gpu.copy_gbps, "--copy-gbps"),
      rate(knobs.internode_gbps, gpu.internode_gbps, "--internode-gbps"));
}

}  // namespace feplb
