// BalancedPlan: one feplb plan whose loads blend rows and GEMM time by a given weight: the loads,
// each domain's exact target, the candidates, the prefetches, and every domain's spill.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "feplb/core/plan.h"
#include "feplb/core/planners/feplb/candidates.h"
#include "feplb/core/planners/feplb/config.h"
#include "feplb/core/planners/feplb/copy_model.h"
#include "feplb/core/planners/feplb/copy_rules.h"
#include "feplb/core/planners/feplb/loads.h"
#include "feplb/core/planners/feplb/prefetch.h"
#include "feplb/core/planners/feplb/spill.h"
#include "feplb/core/planners/planner.h"

namespace feplb::feplb_detail {

class BalancedPlan {
 public:
  // `ctx` must outlive it.
  explicit BalancedPlan(const PlannerContext& ctx);
  BalancedPlan(const BalancedPlan&) = delete;  // its units refer to each other
  BalancedPlan& operator=(const BalancedPlan&) = delete;

  // One plan in `mode` (its path, candidates, copy rule and numbers), its loads blending rows and
  // GEMM time by `time_weight` (0: rows; 1: time). `row_budget` >= 0: no GPU ends more than that
  // many rows above its domain's mean (a donor above it gives rows even beyond its receivers'
  // time room). `prefetches`: the weights copied before routing (empty: none). Overwrites `out`.
  void plan(const FeplbConfig& mode, double time_weight, int64_t row_budget,
            std::span<const Copy> prefetches, const RoutingStep& routing, Plan& out) {
    plan(mode, time_weight, row_budget, prefetches, routing, out, false);
  }
  // plan(), and balancing time, once more aimed at the load with the first plan's added fixed
  // costs: every slice adds its GEMM's fixed cost, so a plan aimed at the domain's load before
  // balancing leaves its donors above it (the receivers filled up first).
  void plan_aimed(const FeplbConfig& mode, double time_weight, int64_t row_budget,
                  std::span<const Copy> prefetches, const RoutingStep& routing, Plan& out);

  // The plans made from now until end_step() are all of one step in one mode (a FeplbEngine's
  // plan_with()): the candidates, which depend on nothing else, are chosen by the first of them
  // only, the others mark the same ones.
  void begin_step() {
    step_ = StepCandidates::kToChoose;
    loads_.begin_step();
  }
  void end_step() {
    step_ = StepCandidates::kOff;
    loads_.end_step();
  }

  // The token straggler (largest rows above the domain's mean) of the last plan made.
  double row_straggler() const { return loads_.row_straggler(ctx_.topo); }
  // The token straggler with every expert at home (overwrites the last plan's loads).
  double unbalanced_row_straggler(const RoutingStep& routing);
  // The GEMM times the last plan was made with.
  const LoadMeasure& measure() const { return loads_.measure; }
  // LoadMeasure::warm.
  void warm(int64_t rows, std::span<const double> time_weights) {
    loads_.measure.warm(rows, time_weights);
  }

 private:
  void plan(const FeplbConfig& mode, double time_weight, int64_t row_budget,
            std::span<const Copy> prefetches, const RoutingStep& routing, Plan& out,
            bool aim_added);
  template <typename Rule>
  void plan_domains(const FeplbConfig& mode, Rule& rule, Plan& out, bool aim_added);
  // The load the plan just made added per domain (added_), for a second plan to aim at its
  // share; false if none.
  bool added_load();

  // Whether plan() chooses the candidates: always (kOff), or once per step (begin_step()).
  enum class StepCandidates { kOff, kToChoose, kChosen };

  const PlannerContext& ctx_;
  StepCandidates step_ = StepCandidates::kOff;
  Loads loads_;
  CopyModel copies_;
  CopyRules rules_;
  CandidateSets candidates_;
  PrefetchedWeights prefetched_;
  Spill spill_;
  std::vector<int64_t> dom_target_;  // [num_domains] ceil(load / GPUs)
  std::vector<int64_t> dom_load_;    // [num_domains] the domain's load before balancing
  std::vector<int64_t> added_;       // [num_domains] the load the last plan's slices added
  std::vector<double> home_ms_;      // [num_ranks] own_ms_at_home() (timed copy rules)
};

}  // namespace feplb::feplb_detail
