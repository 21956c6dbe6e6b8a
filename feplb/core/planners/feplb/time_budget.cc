#include "feplb/core/planners/feplb/time_budget.h"

#include <cmath>
#include <cstdint>
#include <iterator>

namespace feplb::feplb_detail {
namespace {

// The blends of GEMM time and rows bisected, most time first (all time is tried apart, balanced
// within the budget's row cap).
constexpr double kTimeWeights[] = {0.5, 0.25, 0.1};

}  // namespace

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
  int lo = 0, hi = kBlends;  // hi: the best blend that kept within it so far (kBlends: none)
  bool last_kept = false;    // `out` holds that plan
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    plans.plan(mode, kTimeWeights[mid], -1, prefetches, routing, out);
    last_kept = plans.row_straggler() <= budget;
    if (last_kept) {
      hi = mid;
      kept_ = out;  // copied, not swapped: each buffer keeps its role, so warm plans never allocate
    } else {
      lo = mid + 1;
    }
  }
  // (Aiming the chosen blend again with its slices' added cost, as a fixed blend does, was
  // measured: it moved the GEMM straggler by at most 0.004 ms on balance.md §8's workloads for
  // one more plan per step.)
  blends_gave_rows_ = hi == kBlends;
  if (blends_gave_rows_)
    plans.plan(mode, 0.0, -1, prefetches, routing, out);
  else if (!last_kept)
    out = kept_;
  leveller.level(mode, plans.measure(), row_budget, out);
  return leveller.gemm_straggler_ms(plans.measure(), out);
}

}  // namespace feplb::feplb_detail
