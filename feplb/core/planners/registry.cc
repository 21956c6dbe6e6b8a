// The planners by name, and what every Planner does around its policy: the schedule of each plan,
// the default limits and data movement.
#include <functional>
#include <utility>

#include "feplb/core/copy_links.h"
#include "feplb/core/error.h"
#include "feplb/core/planners/planner.h"
#include "feplb/core/planners/policies.h"

namespace feplb {
namespace {

using Factory = std::function<std::unique_ptr<Planner>(const PlannerContext&)>;

const std::vector<std::pair<std::string, Factory>>& registry() {
  static const std::vector<std::pair<std::string, Factory>> kRegistry = {
      {"static", make_static_planner}, {"feplb-paper", make_feplb_paper_planner},
      {"feplb", make_feplb_planner},   {"fastermoe", make_fastermoe_planner},
      {"oracle", make_oracle_planner}, {"eplb", make_eplb_planner},
      {"llep", make_llep_planner},     {"moonep", make_moonep_planner},
  };
  return kRegistry;
}

}  // namespace

Planner::Planner(const PlannerContext& ctx)
    : ctx_(ctx), schedule_(std::make_unique<ScheduleWriter>()) {}
Planner::~Planner() = default;

void Planner::plan(const RoutingStep& routing, Plan& out) {
  make_plan(routing, out);
  schedule_->write(out, ctx_.topo, ctx_.knobs, schedule_cost());
}

void Planner::write_schedule(Plan& out) {
  schedule_->write(out, ctx_.topo, ctx_.knobs, schedule_cost());
}

bool Planner::prime(int64_t layer, Plan& scratch) {
  if (!prime_plan(layer, scratch)) return false;
  schedule_->write(scratch, ctx_.topo, ctx_.knobs, schedule_cost());
  return true;
}

PlanLimits Planner::limits() const {
  PlanLimits l;
  l.intra_domain_only = true;
  l.max_guest_experts = ctx_.knobs.max_num_dyn;
  l.rows_via_homes = true;
  return l;
}

DataMovement Planner::data_movement() const {
  return {"DeepEP", ctx_.knobs.deepep_sms, "copy engine", 0, true};
}

const std::vector<std::string>& planner_names() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> names;
    for (const auto& [name, factory] : registry()) names.push_back(name);
    return names;
  }();
  return kNames;
}

std::unique_ptr<Planner> make_planner(std::string_view name, const PlannerContext& ctx) {
  FEPLB_REQUIRE_INPUT(
      ctx.cost != nullptr,
      "make_planner: the PlannerContext has no GEMM cost model; set ctx.cost, e.g. "
      "const feplb::RooflineCostModel cost(ctx.shape, ctx.knobs); ctx.cost = &cost;");
  for (const auto& [known, factory] : registry()) {
    if (known == name) return factory(ctx);
  }
  throw InputError(
      fmt::format("policy: unknown '{}' (known: {})", name, fmt::join(planner_names(), ", ")));
}

void home_loads(const Topology& topo, const RoutingStep& routing, std::vector<int64_t>& loads) {
  loads.assign(static_cast<size_t>(topo.num_ranks()), 0);
  for (int e = 0; e < topo.num_experts(); ++e) loads[topo.home(e)] += routing.expert_counts[e];
}

void placement_dynamic_set(const PlannerContext& ctx, int gpu, std::vector<int>& out) {
  out.clear();
  const auto local = ctx.topo.local_experts(gpu);
  if (ctx.dynamic.empty()) {
    const auto n =
        static_cast<size_t>(std::min<int64_t>(ctx.knobs.dyn, ctx.topo.experts_per_rank()));
    out.assign(local.begin(), local.begin() + static_cast<std::ptrdiff_t>(n));
    return;
  }
  for (int e : local) {
    if (ctx.dynamic[e]) out.push_back(e);
  }
}

}  // namespace feplb
