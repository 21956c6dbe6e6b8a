// The `feplb` policy: plans every step in the knobs' mode (FeplbConfig::from_knobs) with a
// FeplbEngine; with prefetch, observe() records each step's plan to predict the next.
#include <memory>

#include "feplb/core/planners/feplb/config.h"
#include "feplb/core/planners/feplb/engine.h"
#include "feplb/core/planners/policies.h"

namespace feplb {
namespace {

class FeplbPlanner final : public Planner {
 public:
  FeplbPlanner(const PlannerContext& ctx, const FeplbConfig& config)
      : Planner(ctx), config_(config), engine_(ctx) {}
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
    if (config_.prefetch == FeplbPrefetch::kOff) return;
    engine_.plan_with(config_, routing, observed_);  // the plan this step got: same counts, same
                                                     // prediction
    engine_.record(routing.layer, observed_);
  }
  std::span<const Copy> prefetch(int64_t layer) const override { return engine_.prefetch(layer); }

 protected:
  void make_plan(const RoutingStep& routing, Plan& out) override {
    engine_.plan_with(config_, routing, out);
  }

 private:
  const FeplbConfig config_;
  FeplbEngine engine_;
  Plan observed_;
};

}  // namespace

std::unique_ptr<Planner> make_feplb_planner(const PlannerContext& ctx) {
  return std::make_unique<FeplbPlanner>(ctx,
                                        FeplbConfig::from_knobs(ctx.knobs, ctx.cost != nullptr));
}

}  // namespace feplb
