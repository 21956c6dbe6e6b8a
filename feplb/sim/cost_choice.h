// The GEMM cost model a simulation or a planner uses, chosen by name: what the CLI's
// `--cost-model` and the Python module's `cost_model=` take.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "feplb/core/cost_model.h"
#include "feplb/core/expert_shape.h"
#include "feplb/core/knobs.h"

namespace feplb {

struct CostChoice {
  std::unique_ptr<GemmCostModel> model;  // null: roofline (simulate builds it from the knobs)
  std::string label;                     // how reports name the model
};

// `choice`: "auto" (or "") = the measured H200 table `data_dir`/cost/h200-glm5.json when it exists
// and is for `shape`, else the roofline from the knobs; "roofline"; or a feplb-gemm-table-v1 file,
// which must be for `shape` (InputError naming `field` otherwise).
CostChoice choose_cost_model(const std::string& choice, const ExpertShape& shape,
                             const Knobs& knobs, const std::string& data_dir,
                             std::string_view field);

}  // namespace feplb
