// FeplbEngine: plans one step in a given mode (FeplbConfig), with all scratch reused, so that a
// chooser can plan the same step in several modes and keep one; the `feplb` policy plans in one.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "feplb/core/plan.h"
#include "feplb/core/planners/feplb/balanced_plan.h"
#include "feplb/core/planners/feplb/config.h"
#include "feplb/core/planners/feplb/level_time.h"
#include "feplb/core/planners/feplb/prefetch.h"
#include "feplb/core/planners/feplb/time_budget.h"
#include "feplb/core/planners/planner.h"

namespace feplb {

// feplb: our planner, the default. What it adds to the paper's greedy (feplb_paper.cc), each in
// its own file of this folder (docs/planners.md explains and measures each):
//  1. The candidates are chosen per micro-batch from the counts (candidates.h), or are the
//     placement's dynamic sets; one-hop takes every local expert.
//  2. It balances to an exact target per NVLink domain, donors taking turns, with bounded slices
//     (spill.h), by rows or by modelled GEMM time (loads.h; within a token budget: time_budget.h,
//     level_time.h).
//  3. Copies are timed (copy_model.h): a copy must land when the mode's copy rule says
//     (copy_rules.h: hidden by default).
//  4. Weights before routing (prefetch.h).
//  5. Rows in one hop (FeplbPath::kOneHop): planned before the dispatch, migrated rows are
//     dispatched to their helpers (no row copies; outputs back by the combine); weight copies
//     start when the GEMMs start.
// Deterministic (same inputs and calls, same bytes); O(E log E + R + migrations x log R) per plan
// by rows, no allocation once warm, never a CUDA type.
class FeplbEngine {
 public:
  // Keeps a copy of `ctx` (its cost model must outlive the engine).
  explicit FeplbEngine(const PlannerContext& ctx);
  FeplbEngine(const FeplbEngine&) = delete;  // its units refer to each other
  FeplbEngine& operator=(const FeplbEngine&) = delete;

  // Plans `routing` in `mode` (validated: FeplbConfig::validate) into `out`, without its schedule
  // (Planner::plan writes that). With prefetch on, the plan lists the layer's predicted copies
  // (prefetch()). Changes no state that a later plan reads: any number of modes may plan the same
  // step, in any order, each giving the bytes it gives alone. No allocation once warm (each mode
  // warm).
  void plan_with(const FeplbConfig& mode, const RoutingStep& routing, Plan& out);
  // Records the (expert, helper) pairs `plan` used (a plan of `layer`) and predicts the layer's
  // next micro-batch from them (prefetch()).
  void record(int64_t layer, const Plan& plan) { history_.record(layer, plan); }
  // The layer's predicted weight copies (kPrefetchWeights, in issue order; empty if none), which
  // plan_with() lists with prefetch on. Valid until the next record().
  std::span<const Copy> prefetch(int64_t layer) const { return history_.predicted(layer); }
  const PlannerContext& context() const { return ctx_; }
  // The GEMM times of its plans' table by row count (the context's cost model's numbers), for the
  // schedule writer (Planner::schedule_cost).
  const GemmCostModel& schedule_cost() const { return tabled_cost_; }
  // Keeps `routing`'s expert counts as its layer's last micro-batch (Planner::prime plans it
  // again; feplb's plans read the counts per expert only). No allocation once the layer has one.
  void remember(const RoutingStep& routing);
  // The layer's last remembered micro-batch: expert_counts only, its per-rank counts empty
  // (null: none yet).
  const RoutingStep* recent(int64_t layer) const;
  // Planner::prime's work: plans `routing` (a remembered micro-batch) in `mode` into `out`, then
  // reads every line of the tables its plans look up by row count (GEMM time, each blend's units:
  // that plan reads only its own counts' lines, the next plan others). Changes no later plan.
  void prime_with(const FeplbConfig& mode, const RoutingStep& routing, Plan& out) {
    plan_with(mode, routing, out);
    touched_ = balanced_.measure().touch();
  }
  // Grows the tables plans in `mode` read to cover experts of up to `rows` rows (Planner::warm).
  void warm(const FeplbConfig& mode, int64_t rows);

 private:
  const PlannerContext ctx_;
  feplb_detail::PrefetchHistory history_;
  feplb_detail::BalancedPlan balanced_;
  feplb_detail::TimeLeveller leveller_;
  feplb_detail::TimeBudget budget_;
  feplb_detail::TabledGemmCost tabled_cost_{balanced_.measure()};
  std::vector<RoutingStep> recent_;  // remember(): one per layer, expert_counts only
  int64_t touched_ = 0;              // prime_with()'s table sum (kept, so the reads are made)
};

}  // namespace feplb
