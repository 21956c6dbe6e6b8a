// FeplbChooser: the `feplb` policy when it chooses its own mode (the knobs' default: one_hop,
// prefetch, copy_timing and time_balance_budget at -1). Per layer it keeps a mode, plans each
// micro-batch once in it, and revises it from what the plans of the same counts in other modes
// would have cost (docs/planners.md, "How feplb chooses its mode").
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "feplb/core/copy_links.h"
#include "feplb/core/plan.h"
#include "feplb/core/planners/feplb/config.h"
#include "feplb/core/planners/feplb/engine.h"
#include "feplb/core/planners/planner.h"

namespace feplb {

// Which of feplb's mode switches the knobs leave to the chooser (each at -1).
struct FeplbAuto {
  bool path = false, prefetch = false, balance = false, copy_rule = false;
  bool any() const { return path || prefetch || balance || copy_rule; }
  static FeplbAuto from_knobs(const Knobs& knobs);
};

// A plan's modelled cost for the chooser: the layer time it adds (GEMM straggler + exposed copy
// time from its schedule + the plan's latency where the dispatch waits for it, the reserve) and
// its token straggler within the NVLink domains.
struct PlanCost {
  double layer_ms = 0;
  double token_straggler = 0;
};
// Reads `plan`'s schedule (written) and slices; `plan_latency_ms` is charged when the plan was
// made before the dispatch. No allocation once `gemm_ms` has grown to the GPU count.
PlanCost plan_cost(const Plan& plan, const Topology& topo, double plan_latency_ms,
                   std::vector<double>& gemm_ms, std::vector<int64_t>& rows);

// The candidate modes the chooser keeps and the rule that moves between them:
//  - candidates: from the switches left to it (every combination of their values below, the
//    others as the knobs set them): path two-phase or one-hop; prefetch on or off; balance rows,
//    or time within token_bound by both of the time budget's tries (four plans a step: such a
//    mode reserves twice the planner time ahead of its copies, Plan::reserve_us, where the
//    reserve is left to feplb) or by the capped try alone (half the planner time), where the
//    domain has at most kTimeDomainMax GPUs (beyond, its planner time passes the reserve);
//    copies hidden, or late by the busiest with one hop;
//  - the first mode of a layer (before any history) from what is known then: one-hop where a GPU
//    has at most kOneHopExpertsMax experts (two-phase moves a hot expert's rows after the dispatch,
//    into windows one or two static experts do not leave), else two-phase; prefetch on; time
//    (both tries) where allowed, else rows; copies hidden (two-phase) or late (one-hop);
//  - the first kExploreSteps micro-batches of a layer, off the critical path (observe(), after the
//    copies are issued), its counts are planned and costed (plan_cost) in every candidate, and
//    the layer plans the next one in the candidate with the fewest micro-batches above the token
//    bound (token_bound x the unbalanced token straggler), then the least mean cost;
//  - every micro-batch after, off the critical path, the same
//    counts are planned in the layer's mode and in one other candidate (round robin over the
//    others, those one switch away from the mode first, then two, ...) and both are
//    costed (plan_cost); a candidate whose token straggler is above token_bound x the unbalanced
//    one, where the layer's mode's is not, gains nothing. Once a candidate has been tried
//    kTriesToMove times since the layer's last move and its mean gain passes kMoveMargin of the
//    mode's cost (and 2 us), the layer moves to it. Deterministic: every rank sees the same counts
//    and makes the same moves.
class FeplbChooser final : public Planner {
 public:
  static constexpr int kTimeDomainMax = 16;
  static constexpr int kOneHopExpertsMax = 2;
  static constexpr int kExploreSteps = 3;
  static constexpr int kTriesToMove = 2;
  static constexpr double kMoveMargin = 0.03;

  FeplbChooser(const PlannerContext& ctx, const FeplbAuto& left);
  std::string_view name() const override { return "feplb"; }
  // Its plans are two-phase or one-hop, whichever the layer's mode is.
  PlanLimits limits() const override;
  void observe(const RoutingStep& routing) override;
  std::span<const Copy> prefetch(int64_t layer) const override;
  // Drops the one-hop candidates (where a two-phase one is left): a layer in a one-hop mode
  // moves to its first mode among the rest, and every layer's tries start again.
  void keep_rows_via_homes() override;

  // The candidate modes, in order (the first modes' rule picks among them).
  std::span<const FeplbConfig> candidates() const { return modes_; }
  // The mode layer `layer` plans in now (its first mode before it has been seen).
  const FeplbConfig& mode_of(int64_t layer) const;

 protected:
  void make_plan(const RoutingStep& routing, Plan& out) override;

 private:
  struct Layer {
    int64_t layer = 0;
    int mode = 0;                 // index into modes_
    int next_try = 0;             // the next candidate tried: a position in order_[mode]
    std::vector<double> gain_ms;  // [modes] summed (mode's cost - candidate's) since the last move
    std::vector<int> tries;       // [modes]
    int explored = 0;             // micro-batches costed in every candidate (kExploreSteps)
    std::vector<double> explore_ms;  // [modes] their summed cost
    std::vector<int> explore_over;   // [modes] how many of them passed the token bound
  };
  // observe() while the layer explores: every candidate costed; the layer takes the best so far.
  void explore(Layer& l, const RoutingStep& routing, const PlanCost& now, double bound);
  Layer& layer_state(int64_t layer);
  const Layer* find_layer(int64_t layer) const;
  int first_mode() const;
  // Sets the candidates (modes_), their labels and each one's order of tries.
  void set_modes(std::vector<FeplbConfig> modes);
  PlanCost cost_of(int mode, const RoutingStep& routing, Plan& scratch);

  FeplbEngine engine_;
  std::vector<FeplbConfig> modes_;
  std::vector<std::string> labels_;      // [modes] FeplbConfig::label()
  std::vector<std::vector<int>> order_;  // [mode] the others, nearest first (observe() tries)
  double bound_ = 0;                     // token_bound
  double reserve_ms_ = 0;                // the planner's reserve, charged to one-hop plans
  std::vector<Layer> layers_;
  ScheduleWriter writer_;  // the schedules of the plans observe() costs
  Plan current_, candidate_;
  std::vector<double> gemm_scratch_;
  std::vector<int64_t> rows_scratch_;
  std::vector<int64_t> home_scratch_;
};

}  // namespace feplb
