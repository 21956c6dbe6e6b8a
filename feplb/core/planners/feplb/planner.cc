// The `feplb` policy: a chooser where a mode switch is left to it (chooser.h), else every step in
// the knobs' mode (FeplbConfig::from_knobs) with a
// FeplbEngine; with prefetch, observe() records each step's plan to predict the next.
#include <algorithm>
#include <cstdint>
#include <memory>

#include "feplb/core/error.h"
#include "feplb/core/planners/feplb/chooser.h"
#include "feplb/core/planners/feplb/config.h"
#include "feplb/core/planners/feplb/engine.h"
#include "feplb/core/planners/feplb/refined.h"
#include "feplb/core/planners/policies.h"

namespace feplb {
namespace {

class FeplbPlanner final : public Planner {
 public:
  FeplbPlanner(const PlannerContext& ctx, const FeplbConfig& config)
      : Planner(ctx), config_(config), label_(config.label()), engine_(ctx) {}
  std::string_view name() const override { return "feplb"; }
  // One hop dispatches migrated rows straight to their helpers.
  PlanLimits limits() const override {
    PlanLimits l = Planner::limits();
    l.rows_via_homes = config_.path == FeplbPath::kTwoPhase;
    return l;
  }
  // With prefetch: records the (expert, helper) pairs this step's plan used and predicts the
  // layer's next micro-batch from them (the prediction plan() reads, before routing).
  void observe(const RoutingStep& routing) override {
    engine_.remember(routing);
    if (config_.prefetch == FeplbPrefetch::kOff) return;
    engine_.plan_with(config_, routing, observed_);  // the plan this step got: same counts, same
                                                     // prediction
    engine_.record(routing.layer, observed_);
  }
  std::span<const Copy> prefetch(int64_t layer) const override { return engine_.prefetch(layer); }
  void warm(int64_t max_expert_rows) override { engine_.warm(config_, max_expert_rows); }

 protected:
  void make_plan(const RoutingStep& routing, Plan& out) override {
    engine_.plan_with(config_, routing, out);
    out.mode = label_;
  }
  const GemmCostModel& schedule_cost() const override { return engine_.schedule_cost(); }
  bool prime_plan(int64_t layer, Plan& out) override {
    const RoutingStep* recent = engine_.recent(layer);
    if (recent == nullptr) return false;
    engine_.prime_with(config_, *recent, out);
    return true;
  }

 private:
  const FeplbConfig config_;
  const std::string label_;
  FeplbEngine engine_;
  Plan observed_;
};

}  // namespace

std::unique_ptr<Planner> make_feplb_planner(const PlannerContext& ctx) {
  if (ctx.knobs.one_hop_refine == 1) {
    FEPLB_REQUIRE_INPUT(ctx.knobs.one_hop == 1, "one_hop_refine: 1 needs one_hop = 1, not {}",
                        ctx.knobs.one_hop);
    FEPLB_REQUIRE_INPUT(ctx.cost != nullptr, "one_hop_refine: 1 needs a GEMM cost model");
    PlannerContext one = ctx;
    Knobs& k = one.knobs;
    k.prefetch = 0;  // the refinement prefetches the full plan's weights itself
    if (k.copy_timing < 0) k.copy_timing = 3;  // left: late copies, as the chooser's one-hop modes
    k.time_balance_budget = std::max(k.time_balance_budget, 0.0);
    return std::make_unique<FeplbRefinedOneHop>(one, FeplbConfig::from_knobs(k, true));
  }
  // A switch left at -1 (the default) is the chooser's; with every one set, one mode. Without a
  // GEMM cost model nothing can be costed or timed: the switches left are two-phase, no
  // prefetch, rows, copy time ignored.
  const FeplbAuto left = FeplbAuto::from_knobs(ctx.knobs);
  if (left.any() && ctx.cost != nullptr) return std::make_unique<FeplbChooser>(ctx, left);
  PlannerContext one = ctx;
  Knobs& k = one.knobs;
  for (int64_t* sw : {&k.one_hop, &k.prefetch, &k.copy_timing}) *sw = std::max<int64_t>(*sw, 0);
  k.time_balance_budget = std::max(k.time_balance_budget, 0.0);  // set, or left with a blend set
  return std::make_unique<FeplbPlanner>(one, FeplbConfig::from_knobs(k, one.cost != nullptr));
}

}  // namespace feplb
