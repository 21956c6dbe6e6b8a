// FeplbConfig: the mode feplb plans a step in (path, prefetch, what it balances, which copies may
// land late, its candidates) and the numbers it uses; built from Knobs and validated once.
#pragma once

#include <cstdint>
#include <string>

#include "feplb/core/knobs.h"

namespace feplb {

// How migrated rows reach their helpers (one_hop).
enum class FeplbPath : uint8_t {
  kTwoPhase,  // 0: the paper's path: rows home in the dispatch, then copied to the helper
  kOneHop,    // 1: planned before the dispatch, rows dispatched straight to the helper
};
// Whether predicted weights are copied before routing (prefetch).
enum class FeplbPrefetch : uint8_t { kOff, kOn };
// What the loads measure (balance_time_weight, time_balance_budget).
enum class FeplbBalance : uint8_t {
  kRows,        // rows
  kTimeBlend,   // rows and modelled GEMM time blended by time_weight (1: time alone)
  kTimeBudget,  // the most time-balanced plan whose token straggler keeps within time_budget
};
// Which of the time budget's tries a kTimeBudget plan makes (time_budget.h): both (the knob's
// mode), one of them (half the planner time; the chooser's candidates beyond 16 GPUs: the blends),
// or both and rows (the chooser's candidates up to 16 GPUs).
enum class FeplbBudgetTries : uint8_t {
  kBoth,    // the blends and time under the row cap, the lower GEMM straggler kept
  kBlends,  // the blends only
  kCapped,  // time under the row cap only (rows where that passes the budget)
  kAll,     // kBoth, and rows levelled within the budget's cap (one plan more)
};
// Which copies a receiver may take, by when they land (copy_timing; copy_rules.h).
enum class FeplbCopyRule : uint8_t {
  kIgnore = 0,              // copy time ignored
  kHidden = 1,              // lands while the receiver has work whose copies landed
  kExposedBeforeDonor = 2,  // or late, if the receiver still finishes before the donor
  kLateByBusiest = 3,       // or late, if the receiver finishes by the busiest non-donor's time
};
// The experts a GPU may give away (feplb_dyn_set; candidates.h).
enum class FeplbCandidates : uint8_t {
  kBusiest,        // 0: its dyn busiest of this micro-batch
  kPlacementSets,  // 1: its experts in the placement's dynamic set
  kEveryLocal,     // every local expert: what one-hop plans take (candidate_set())
};

struct FeplbConfig {
  FeplbPath path = FeplbPath::kTwoPhase;
  FeplbPrefetch prefetch = FeplbPrefetch::kOff;
  FeplbBalance balance = FeplbBalance::kRows;
  double time_weight = 0;  // kTimeBlend: in (0, 1]; otherwise 0
  double time_budget = 0;  // kTimeBudget: in (0, 1], a fraction of the unbalanced token straggler
  FeplbBudgetTries budget_tries = FeplbBudgetTries::kBoth;  // kTimeBudget: which tries
  // The planner time reserved ahead of its plans' phase-2 copies, us (Plan::reserve_us); -1: the
  // knobs' (planner_reserve_us). The chooser's modes that plan a step four times reserve more.
  double reserve_us = -1;
  FeplbCopyRule copy_rule = FeplbCopyRule::kHidden;
  FeplbCandidates candidates = FeplbCandidates::kBusiest;  // two-phase plans' (kEveryLocal: never)
  // The numbers of the balance, as knobs.def describes them.
  int64_t dyn = Knobs{}.dyn;
  double dyn_cover = Knobs{}.dyn_cover;
  double balance_tolerance = Knobs{}.balance_tolerance;
  int64_t min_slice_rows = Knobs{}.min_slice_rows;
  int64_t slice_align_rows = Knobs{}.slice_align_rows;
  int64_t max_helpers_per_expert = Knobs{}.max_helpers_per_expert;
  int64_t max_num_dyn = Knobs{}.max_num_dyn;
  // Not here: the copy model (copy_gbps, copy_setup_us, planner_budget_us,
  // prefetch_window_us) and the prefetch history (prefetch_history) are the planner's knobs, one
  // for every mode: the plan's schedule and the metrics time copies with them.

  // The knobs' mode. Throws InputError naming the flag for a knob out of its range (knobs.def),
  // for balance_time_weight and time_balance_budget both set (the budget tries its own blends),
  // and for copy timing or time balancing without a GEMM cost model. Every switch must be set
  // (>= 0): those left at -1 are the chooser's (chooser.h), which calls this once per candidate.
  static FeplbConfig from_knobs(const Knobs& knobs, bool has_cost_model);
  // The same checks for a config made by hand (a chooser's modes): numbers within knobs.def's
  // ranges, the balance's number set for its kind, and two-phase candidates (kEveryLocal is
  // one-hop's: a two-phase plan starts its static experts before the plan exists).
  void validate(bool has_cost_model) const;

  // The documented rule for one-hop: nothing has to start before a plan made before the dispatch,
  // so every local expert is a candidate, and `candidates` and `dyn_cover` (two-phase rules) do
  // not apply. Two-phase: `candidates`.
  FeplbCandidates candidate_set() const {
    return path == FeplbPath::kOneHop ? FeplbCandidates::kEveryLocal : candidates;
  }
  // The cover the candidate set is widened to (0: none): dyn_cover, two-phase only.
  double candidate_cover() const { return path == FeplbPath::kOneHop ? 0.0 : dyn_cover; }

  // The mode in a few words, e.g. "two-phase, prefetch, time budget 0.05, hidden copies".
  std::string label() const;
  // Every setting on one line, the one-hop rule included where it applies.
  std::string describe() const;

  bool operator==(const FeplbConfig&) const = default;
};

}  // namespace feplb
