#include "feplb/core/routing.h"

#include <numeric>

namespace feplb {

RoutingStep::RoutingStep(int64_t step_idx, int64_t layer_idx, int ranks, int experts)
    : step(step_idx),
      layer(layer_idx),
      num_ranks(ranks),
      num_experts(experts),
      counts(static_cast<size_t>(ranks) * experts, 0),
      expert_counts(static_cast<size_t>(experts), 0) {}

void RoutingStep::sum_experts() {
  expert_counts.assign(static_cast<size_t>(num_experts), 0);
  for (int src = 0; src < num_ranks; ++src) {
    for (int e = 0; e < num_experts; ++e) expert_counts[e] += at(src, e);
  }
}

int64_t RoutingStep::total_rows() const {
  return std::accumulate(expert_counts.begin(), expert_counts.end(), int64_t{0});
}

bool Trace::uniform() const {
  for (const RoutingStep& s : steps) {
    if (!s.dropped.empty() || !s.tokens.empty()) return false;
  }
  return true;
}

}  // namespace feplb
