// The GEMM cost model a simulation or a planner uses, chosen by name: what the CLI's
// `--cost-model` and the Python module's `cost_model=` take.
#pragma once

#include <string>
#include <string_view>

#include "feplb/core/expert_shape.h"
#include "feplb/core/knobs.h"
#include "feplb/sim/gemm_tables.h"

namespace feplb {

using CostChoice = CostModelChoice;

// `choice`: "auto" (or "") = the measured table in `data_dir`/cost whose shape matches `shape`
// and whose device is the GPU class's (find_gemm_table), else the roofline from the knobs;
// "roofline"; or a feplb-gemm-table-v1 file, which must be for `shape` (InputError naming
// `field` otherwise).
CostChoice choose_cost_model(const std::string& choice, const ExpertShape& shape,
                             const Knobs& knobs, const std::string& data_dir,
                             std::string_view field,
                             const GpuClass& gpu = gpu_class_list().front());

}  // namespace feplb
