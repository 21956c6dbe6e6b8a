#include "feplb/core/planners/feplb/engine.h"

namespace feplb {

FeplbEngine::FeplbEngine(const PlannerContext& ctx)
    : ctx_(ctx), history_(ctx_), balanced_(ctx_), leveller_(ctx_) {}

void FeplbEngine::plan_with(const FeplbConfig& mode, const RoutingStep& routing, Plan& out) {
  const std::span<const Copy> prefetches =
      mode.prefetch == FeplbPrefetch::kOn ? prefetch(routing.layer) : std::span<const Copy>{};
  balanced_.begin_step();  // every plan below is of this step in this mode
  switch (mode.balance) {
    case FeplbBalance::kRows:
      balanced_.plan(mode, 0.0, -1, prefetches, routing, out);
      break;
    case FeplbBalance::kTimeBlend:
      // A second plan aims at the load with the first one's added fixed costs.
      balanced_.plan_aimed(mode, mode.time_weight, -1, prefetches, routing, out);
      break;
    case FeplbBalance::kTimeBudget:
      budget_.plan(mode, prefetches, routing, balanced_, leveller_, out);
      break;
  }
  balanced_.end_step();
}

}  // namespace feplb
