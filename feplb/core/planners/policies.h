// Factories of the built-in planners (one .cc file each); use make_planner() by name instead.
#pragma once

#include <memory>

#include "feplb/core/planners/planner.h"

namespace feplb {

std::unique_ptr<Planner> make_static_planner(const PlannerContext& ctx);
std::unique_ptr<Planner> make_feplb_paper_planner(const PlannerContext& ctx);
std::unique_ptr<Planner> make_feplb_planner(const PlannerContext& ctx);
std::unique_ptr<Planner> make_fastermoe_planner(const PlannerContext& ctx);
std::unique_ptr<Planner> make_oracle_planner(const PlannerContext& ctx);
std::unique_ptr<Planner> make_eplb_planner(const PlannerContext& ctx);
std::unique_ptr<Planner> make_llep_planner(const PlannerContext& ctx);
std::unique_ptr<Planner> make_moonep_planner(const PlannerContext& ctx);

}  // namespace feplb
