#include "feplb/core/planners/feplb/balanced_plan.h"

#include <cmath>
#include <numeric>

namespace feplb::feplb_detail {

BalancedPlan::BalancedPlan(const PlannerContext& ctx)
    : ctx_(ctx),
      loads_(ctx.cost),
      copies_(ctx.shape, ctx.knobs),
      spill_(ctx, loads_, copies_, candidates_, prefetched_) {}

void BalancedPlan::plan_aimed(const FeplbConfig& mode, double time_weight, int64_t row_budget,
                              std::span<const Copy> prefetches, const RoutingStep& routing,
                              Plan& out) {
  plan(mode, time_weight, row_budget, prefetches, routing, out, false);
  if (loads_.measure.by_time() && added_load())
    plan(mode, time_weight, row_budget, prefetches, routing, out, true);
}

double BalancedPlan::unbalanced_row_straggler(const RoutingStep& routing) {
  home_loads(ctx_.topo, routing, loads_.rows_at);
  return loads_.row_straggler(ctx_.topo);
}

void BalancedPlan::plan(const FeplbConfig& mode, double time_weight, int64_t row_budget,
                        std::span<const Copy> prefetches, const RoutingStep& routing, Plan& out,
                        bool aim_added) {
  const Topology& topo = ctx_.topo;
  out.clear(topo.num_experts());
  out.planned_before_dispatch = mode.path == FeplbPath::kOneHop;
  out.reserve_us = mode.reserve_us;
  loads_.start(topo, routing, time_weight, row_budget);
  spill_.start(mode);
  if (step_ == StepCandidates::kChosen) {
    candidates_.mark(out.dynamic);
  } else {
    candidates_.choose(ctx_, mode, routing.expert_counts, loads_.rows_at, out.dynamic);
    if (mode.copy_rule != FeplbCopyRule::kIgnore)
      own_ms_at_home(topo, loads_.expert_ms(routing), home_ms_);
    if (step_ == StepCandidates::kToChoose) step_ = StepCandidates::kChosen;
  }
  // Phase-2 copies start once the plan exists: after the counts round trip and the planner
  // (two-phase), or when the GEMMs start (one-hop: planned before the dispatch).
  copies_.start(topo.num_ranks(), planned_copy_start_ms(out, ctx_.knobs, ctx_.topo),
                mode.path == FeplbPath::kTwoPhase);
  prefetched_.add(ctx_, prefetches, out, loads_.guests, copies_.links);
  rules_.with(mode.copy_rule, [&](auto& rule) { plan_domains(mode, rule, out, aim_added); });
  out.add_home_slices(topo, routing, loads_.moved);
}

template <typename Rule>
void BalancedPlan::plan_domains(const FeplbConfig& mode, Rule& rule, Plan& out, bool aim_added) {
  const Topology& topo = ctx_.topo;
  const int R = topo.num_ranks(), D = topo.num_domains(), n = topo.domain_size();
  rule.start(topo, loads_.measure, home_ms_);
  int64_t total = 0;
  for (int64_t l : loads_.load) total += l;
  const int64_t tol =
      static_cast<int64_t>(std::floor(mode.balance_tolerance * static_cast<double>(total) / R));
  // Per domain the exact target (a GPU may end at most tol above it).
  dom_target_.resize(static_cast<size_t>(D));
  dom_load_.resize(static_cast<size_t>(D));
  for (int dom = 0; dom < D; ++dom) {
    const int first = topo.first_gpu_of_domain(dom);
    int64_t dom_total = 0;
    for (int g = first; g < first + n; ++g) dom_total += loads_.load[g];
    dom_load_[dom] = dom_total;
    dom_target_[dom] = (dom_total + (aim_added ? added_[dom] : 0) + n - 1) / n;
  }
  rule.targets_set(topo, loads_, dom_target_, tol);
  for (int dom = 0; dom < D; ++dom) spill_.balance_domain(rule, dom, dom_target_[dom], tol, out);
}

bool BalancedPlan::added_load() {
  const int n = ctx_.topo.domain_size();
  added_.resize(static_cast<size_t>(ctx_.topo.num_domains()));
  bool any = false;
  for (int dom = 0; dom < ctx_.topo.num_domains(); ++dom) {
    const auto first = loads_.load.begin() + ctx_.topo.first_gpu_of_domain(dom);
    added_[dom] =
        std::max<int64_t>(0, std::accumulate(first, first + n, int64_t{0}) - dom_load_[dom]);
    any = any || added_[dom] > 0;
  }
  return any;
}

}  // namespace feplb::feplb_detail
