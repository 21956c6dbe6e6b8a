// static: plain expert parallelism. Every expert is computed on its home GPU; nothing moves.
#include "feplb/core/planners/policies.h"

namespace feplb {
namespace {

class StaticPlanner final : public Planner {
 public:
  using Planner::Planner;
  std::string_view name() const override { return "static"; }
  PlanLimits limits() const override { return {true, 0, true}; }
  DataMovement data_movement() const override {
    return {"DeepEP", ctx_.knobs.deepep_sms, "none", 0, true};
  }
  void make_plan(const RoutingStep& routing, Plan& out) override {
    out.clear(ctx_.topo.num_experts());
    moved_.assign(static_cast<size_t>(ctx_.topo.num_experts()), 0);
    out.add_home_slices(ctx_.topo, routing, moved_);
  }

 private:
  std::vector<int64_t> moved_;
};

}  // namespace

std::unique_ptr<Planner> make_static_planner(const PlannerContext& ctx) {
  return std::make_unique<StaticPlanner>(ctx);
}

}  // namespace feplb
