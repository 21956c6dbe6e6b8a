// TimeLeveller: levels a plan's modelled GEMM time along its own slices (time_balance_budget's
// last step), and the GEMM straggler the time budget compares plans by.
#pragma once

#include <cstdint>
#include <vector>

#include "feplb/core/copy_links.h"
#include "feplb/core/plan.h"
#include "feplb/core/planners/feplb/config.h"
#include "feplb/core/planners/feplb/loads.h"
#include "feplb/core/planners/planner.h"

namespace feplb::feplb_detail {

// Per domain, the GPU with the largest modelled GEMM time moves rows from one of its slices to
// another slice of the same expert, the move that lowers the domain's largest time most, until
// none does: a guest slice's rows back to the expert's slice at its home, or, rows in one hop, its
// own rows on to the expert's helpers and a guest slice's rows on to the expert's other helpers.
// A guest slice may go whole (its GEMM's fixed cost leaves the GPU, and its weights copy the plan;
// a prefetch stays, issued before routing); otherwise a slice keeps min_slice_rows and moves are
// multiples of slice_align_rows. The receiving GPU stays within `row_budget` rows of the domain's
// mean. No slice is added (no GEMM's fixed cost), and no copy grows: a rows copy only shrinks (it
// lands earlier), rows in one hop travel in the dispatch. A shrunk or dropped copy can still delay
// a later one (the idle gap a busy receiver left in a sender's egress may close before the copy
// that ran in it), so the levelling stays only if no copy lands later than it did.
// O(kMaxLevelMoves x (domain size + a GPU's slices' moves)) per domain, no allocation once warm.
class TimeLeveller {
 public:
  // `ctx` must outlive it.
  explicit TimeLeveller(const PlannerContext& ctx) : ctx_(ctx) {}
  // Levels `out` (made in `mode`) with the GEMM times of `measure`.
  void level(const FeplbConfig& mode, const LoadMeasure& measure, int64_t row_budget, Plan& out);
  // The plan's modelled GEMM straggler: the largest GPU's GEMM time above the mean.
  double gemm_straggler_ms(const LoadMeasure& measure, const Plan& plan);

 private:
  // A move of `rows` from slice `from` to slice `to` (-1: none), leaving the domain's largest time
  // at `top_ms`.
  struct Move {
    double top_ms;
    int from = -1, to = -1;
    int64_t rows = 0;
  };
  // Each GPU's time and rows; each expert's slice at its home; the guest slices (those whose
  // expert has a slice at home) by GPU and by expert.
  void index_slices(const std::vector<Slice>& slices);
  // Levels one domain; `moved`: whether any move was made so far (the plan before is kept then).
  void level_domain(int dom, int64_t row_budget, Plan& out, bool& moved);
  // The best move from GPU M (`top`: the domain's three largest times, M first).
  Move best_move(const std::vector<Slice>& slices, const int (&top)[3], int64_t row_cap) const;
  // Whether moving rows from slice `from` to `to` beats `best`; updates it.
  void consider(const std::vector<Slice>& slices, const int (&top)[3], int64_t row_cap, int from,
                int to, Move& best) const;
  // The moved slices' copies follow them: rows (home -> helper) and outputs (back) shrink, and a
  // slice given up whole takes its weights copy with it (a prefetch stays: it was issued before
  // routing); slices given up are dropped.
  void follow_slices(Plan& out) const;
  // Whether every copy of `after` (the copies of `before`, in order, some shrunk, some gone) lands
  // no later than it did in `before`.
  bool no_copy_lands_later(const Plan& before, const Plan& after);
  double gemm_ms(int64_t rows) const { return measure_->gemm_ms(rows); }

  const PlannerContext& ctx_;
  const FeplbConfig* mode_ = nullptr;             // level()'s
  const LoadMeasure* measure_ = nullptr;          // level()'s
  std::vector<double> level_ms_;                  // [num_ranks] modelled GEMM time
  std::vector<int64_t> level_rows_;               // [num_ranks] rows
  std::vector<int> home_slice_;                   // [num_experts] its slice at home (-1: none)
  std::vector<int> gpu_begin_, gpu_slice_;        // guest slices by GPU: [gpu_begin_[g], [g + 1])
  std::vector<int> expert_begin_, expert_slice_;  // guest slices by expert
  std::vector<int> fill_, expert_fill_;           // index_slices()'s counting sorts
  std::vector<uint8_t> guest_;                    // [slices] index_slices(): a guest slice
  Plan before_;                                   // the plan before levelling
  CopyTimer copy_timer_;
  std::vector<double> before_end_ms_;  // when before_'s copies land
  std::vector<double> straggler_ms_;   // [num_ranks] gemm_straggler_ms()
};

}  // namespace feplb::feplb_detail
