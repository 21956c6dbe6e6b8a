#include "feplb/core/planners/feplb/engine.h"

#include <algorithm>
#include <iterator>

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

void FeplbEngine::remember(const RoutingStep& routing) {
  auto it = std::find_if(recent_.begin(), recent_.end(),
                         [&](const RoutingStep& s) { return s.layer == routing.layer; });
  if (it == recent_.end()) {
    recent_.emplace_back();
    it = recent_.end() - 1;
  }
  it->step = routing.step;
  it->layer = routing.layer;
  it->num_ranks = routing.num_ranks;
  it->num_experts = routing.num_experts;
  it->expert_counts.assign(routing.expert_counts.begin(), routing.expert_counts.end());
}

const RoutingStep* FeplbEngine::recent(int64_t layer) const {
  for (const RoutingStep& s : recent_) {
    if (s.layer == layer) return &s;
  }
  return nullptr;
}

void FeplbEngine::warm(const FeplbConfig& mode, int64_t rows) {
  switch (mode.balance) {
    case FeplbBalance::kRows:
      balanced_.warm(rows, {});
      break;
    case FeplbBalance::kTimeBlend:
      balanced_.warm(rows, std::span<const double>(&mode.time_weight, 1));
      break;
    case FeplbBalance::kTimeBudget: {
      // Its tries: the blends, time under the row cap (1), rows (0).
      constexpr auto& blends = feplb_detail::TimeBudget::kTimeWeights;
      double weights[std::size(blends) + 1] = {1.0};
      std::copy(std::begin(blends), std::end(blends), weights + 1);
      balanced_.warm(rows, weights);
      break;
    }
  }
}

}  // namespace feplb
