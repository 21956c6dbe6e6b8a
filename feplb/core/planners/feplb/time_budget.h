// TimeBudget: time_balance_budget > 0: the most time-balanced plan whose token straggler keeps
// within the budget, from the blends of time and rows and time under a row cap, each levelled.
#pragma once

#include <cstdint>
#include <span>

#include "feplb/core/plan.h"
#include "feplb/core/planners/feplb/balanced_plan.h"
#include "feplb/core/planners/feplb/config.h"
#include "feplb/core/planners/feplb/level_time.h"

namespace feplb::feplb_detail {

// The most time-balanced plan whose token straggler stays within the budget (a fraction of the
// unbalanced one). Two tries, each levelled within the budget's row cap (TimeLeveller): the
// blends of time and rows, the one with the most time that keeps within it (a blend nearer rows
// leaves fewer rows on the busiest GPU), rows when none does; and time balanced under the row cap
// (plan_capped), kept instead when it keeps within the budget with a lower GEMM straggler.
// Neither wins everywhere: on the many-donor workloads of balance.md, the capped plan is the
// better one with small experts (whose GEMMs' fixed costs make rows and time differ most), a
// blend often the better one with large ones. The blends take one plan where the most time keeps
// within the budget, else three; the capped plan two (aimed twice); no allocation once warm. A
// mode may make one try alone (FeplbBudgetTries): the blends (the chooser's candidates beyond 16
// GPUs), or the capped plan against rows levelled; or all three (its candidates up to 16 GPUs:
// four or five plans).
class TimeBudget {
 public:
  // The blends of GEMM time and rows, most time first (all time is tried apart, balanced within
  // the budget's row cap).
  static constexpr double kTimeWeights[] = {0.5, 0.25, 0.1};

  // A plan in `mode` (FeplbBalance::kTimeBudget) into `out`.
  void plan(const FeplbConfig& mode, std::span<const Copy> prefetches, const RoutingStep& routing,
            BalancedPlan& plans, TimeLeveller& leveller, Plan& out);

 private:
  // The blend with the most time that keeps within `budget` (rows where none does), levelled
  // into `out`; returns its GEMM straggler (ms).
  double plan_blends(const FeplbConfig& mode, std::span<const Copy> prefetches,
                     const RoutingStep& routing, double budget, int64_t row_budget,
                     BalancedPlan& plans, TimeLeveller& leveller, Plan& out);

  Plan kept_;                      // the best plan kept within the budget so far
  bool blends_gave_rows_ = false;  // plan_blends: no blend kept within it (rows instead)
};

}  // namespace feplb::feplb_detail
