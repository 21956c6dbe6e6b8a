// Measured GEMM tables by expert shape: the simulator's automatic choice of cost model. A folder
// (data/cost/) holds feplb-gemm-table-v1 files, one per measured shape and device; the one whose
// shape matches the experts is used, the roofline otherwise.
#pragma once

#include <memory>
#include <string>

#include "feplb/core/cost_model.h"
#include "feplb/core/expert_shape.h"
#include "feplb/core/gpu_class.h"
#include "feplb/core/knobs.h"

namespace feplb {

struct CostModelChoice {
  std::unique_ptr<GemmCostModel> model;  // null: the roofline (simulate() builds it from the knobs)
  std::string label;                     // what reports say was used
};

// The first file, in name order, of `dir`'s *.json whose shape (hidden, ffn, dtype) matches
// `shape` and whose device is `gpu`'s (GpuClass::table_device); the roofline when none does, when
// `dir` does not exist or when the class has no measured tables. `shown_dir` is how labels name
// the folder (e.g. "data/cost"). A file that is not a valid table is an InputError naming it.
CostModelChoice find_gemm_table(const std::string& dir, const std::string& shown_dir,
                                const ExpertShape& shape, const Knobs& knobs,
                                const GpuClass& gpu = gpu_class_list().front());

// "roofline (720 TFLOP/s, 4000 GB/s HBM, 132 SMs; not measured)"; for a class from specifications
// "...; ceilings from specifications, not measured)".
std::string roofline_label(const Knobs& knobs, const GpuClass& gpu = gpu_class_list().front());

}  // namespace feplb
