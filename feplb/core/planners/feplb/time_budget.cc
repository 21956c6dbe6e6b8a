#include "feplb/core/planners/feplb/time_budget.h"

#include <cmath>
#include <cstdint>
#include <iterator>

namespace feplb::feplb_detail {

void TimeBudget::plan(const FeplbConfig& mode, std::span<const Copy> prefetches,
                      const RoutingStep& routing, BalancedPlan& plans, TimeLeveller& leveller,
                      Plan& out) {
  const double budget = mode.time_budget * plans.unbalanced_row_straggler(routing);
  const auto row_budget = static_cast<int64_t>(std::floor(budget));
  // Rows, levelled within the budget's row cap, into `out`: its GEMM straggler (ms).
  const auto rows_levelled = [&] {
    plans.plan(mode, 0.0, -1, prefetches, routing, out);
    leveller.level(mode, plans.measure(), row_budget, out);
    return leveller.gemm_straggler_ms(plans.measure(), out);
  };
  double best_ms = 0;
  if (mode.budget_tries == FeplbBudgetTries::kCapped) {
    // What the capped try falls back to where it passes the budget.
    best_ms = rows_levelled();
  } else {
    best_ms = plan_blends(mode, prefetches, routing, budget, row_budget, plans, leveller, out);
    if (mode.budget_tries == FeplbBudgetTries::kBlends) return;
    if (mode.budget_tries == FeplbBudgetTries::kAll && !blends_gave_rows_) {
      // Rows, levelled (what the blends fall back to where none keeps within the budget; a
      // blend's time weight can also leave a higher GEMM straggler than rows once levelled).
      kept_ = out;
      const double rows_ms = rows_levelled();
      if (rows_ms < best_ms)
        best_ms = rows_ms;
      else
        out = kept_;
    }
  }
  kept_ = out;
  // Time balanced under the row cap (plan_capped): no GPU ends more than the budget's rows above
  // its domain's mean (a donor above it gives rows even beyond its receivers' time room once its
  // own load is within the cap), aimed a second time with the slices' added fixed cost.
  plans.plan_aimed(mode, 1.0, row_budget, prefetches, routing, out);
  if (plans.row_straggler() <= budget) {
    leveller.level(mode, plans.measure(), row_budget, out);
    if (leveller.gemm_straggler_ms(plans.measure(), out) < best_ms) return;
  }
  out = kept_;
}

double TimeBudget::plan_blends(const FeplbConfig& mode, std::span<const Copy> prefetches,
                               const RoutingStep& routing, double budget, int64_t row_budget,
                               BalancedPlan& plans, TimeLeveller& leveller, Plan& out) {
  constexpr int kBlends = static_cast<int>(std::size(kTimeWeights));
  static_assert(kBlends >= 2);
  // Blend `i`'s plan into `out`: whether it keeps within the budget.
  const auto keeps = [&](int i) {
    plans.plan(mode, kTimeWeights[i], -1, prefetches, routing, out);
    return plans.row_straggler() <= budget;
  };
  // The blend with the most time that keeps within the budget, probed the way most steps end:
  // the most time first (kept: it is the answer, one plan), then the least (not kept: none is,
  // rows), then those between from the most time. Where a blend nearer rows keeps within it
  // whenever one nearer time does (nearly every step measured), this is the answer a bisection
  // gives, in fewer plans: 1.8 per step instead of 2.4 for one-hop time at EP=64, where most
  // steps keep with the most time or with none (bench/results/planner-blend-order-ab.txt).
  int chosen = kBlends;  // none kept within it
  if (keeps(0)) {
    chosen = 0;
  } else if (keeps(kBlends - 1)) {
    chosen = kBlends - 1;
    kept_ = out;  // copied, not swapped: each buffer keeps its role, so warm plans never allocate
    for (int i = 1; i < kBlends - 1 && chosen == kBlends - 1; ++i) {
      if (keeps(i)) chosen = i;
    }
    if (chosen == kBlends - 1 && kBlends > 2) out = kept_;
  }
  // (Aiming the chosen blend again with its slices' added cost, as a fixed blend does, was
  // measured: it moved the GEMM straggler by at most 0.004 ms on balance.md §8's workloads for
  // one more plan per step.)
  blends_gave_rows_ = chosen == kBlends;
  if (blends_gave_rows_) plans.plan(mode, 0.0, -1, prefetches, routing, out);
  leveller.level(mode, plans.measure(), row_budget, out);
  return leveller.gemm_straggler_ms(plans.measure(), out);
}

}  // namespace feplb::feplb_detail
