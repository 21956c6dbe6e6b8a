// GPU classes: the per-GPU numbers of one kind of GPU that the simulator's link model and GEMM
// cost model use (copy-engine rate inside an NVLink domain and between domains, GEMM ceilings, the
// device of its measured GEMM tables), declared once in gpu_classes.def. The first (h200,
// measured) is the matching knobs' defaults; the others are from specifications and say so.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "feplb/core/knobs.h"

namespace feplb {

struct GpuClass {
  std::string_view name;          // the --gpu value, e.g. "b200"
  std::string_view device;        // e.g. "NVIDIA B200, HGX at 1000 W"
  bool measured = false;          // false: every number from the vendor's specifications
  double copy_gbps = 0;           // copy engine, per GPU per direction, inside an NVLink domain
  double internode_gbps = 0;      // per GPU per direction between NVLink domains (the network)
  double gemm_peak_tflops = 0;    // bf16 dense GEMM ceiling of the roofline
  double hbm_gbps = 0;            // HBM ceiling of the roofline
  int64_t num_sms = 0;            // for the roofline's wave quantisation
  std::string_view table_device;  // "device" of its measured GEMM tables in data/cost/ ("": none)
  std::string_view source;        // where each number comes from

  // "measured" or "from specifications, not measured".
  std::string_view provenance() const {
    return measured ? "measured" : "from specifications, not measured";
  }
};

namespace gpu_classes {
#define FEPLB_GPU_CLASS(id, device, measured, copy, internode, peak, hbm, sms, tables, source) \
  inline constexpr GpuClass id{#id,  device, measured, copy,   internode,                      \
                               peak, hbm,    sms,      tables, source};
#include "feplb/core/gpu_classes.def"
#undef FEPLB_GPU_CLASS
}  // namespace gpu_classes

// Every GPU class, in declaration order (the first is the default).
const std::vector<GpuClass>& gpu_class_list();
// The class named `name`; InputError "--gpu: unknown GPU class ..." listing the known ones.
const GpuClass& find_gpu_class(std::string_view name);
// Sets the knobs a GPU class determines: copy_gbps, internode_gbps, gemm_peak_tflops, hbm_gbps,
// num_sms. Other knobs are left as they are.
void apply_gpu_class(const GpuClass& gpu, Knobs& knobs);
// One line for report headers: the class, whether it is measured, and the link rates in force
// (a knob that differs from the class's value is marked as set by its flag).
std::string describe_gpu(const GpuClass& gpu, const Knobs& knobs);

}  // namespace feplb
