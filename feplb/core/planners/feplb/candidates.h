// CandidateSets: the experts each GPU may give away in one plan, busiest first: its `dyn`
// busiest of the micro-batch, the placement's dynamic set, or (one-hop) every local expert.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "feplb/core/planners/feplb/config.h"
#include "feplb/core/planners/planner.h"

namespace feplb::feplb_detail {

// The dynamic set is chosen per micro-batch from the counts: the host knows them before it
// launches any GEMM, so it launches the other (static) experts at once and plans meanwhile. Either
// set is a minimum: a GPU whose candidates hold fewer rows than dyn_cover x its rows above its
// domain's mean takes more, its busiest others first, until they do (one local expert always
// starts at once). One-hop plans before the dispatch, so nothing has to start before the plan:
// every local expert is a candidate (FeplbConfig::candidate_set()). No allocation once warm.
class CandidateSets {
 public:
  // Each GPU's candidates for `counts` (rows_at: each GPU's rows with every expert at home), marked
  // in `dynamic` ([num_experts], computed after the plan).
  void choose(const PlannerContext& ctx, const FeplbConfig& mode,
              const std::vector<int64_t>& counts, const std::vector<int64_t>& rows_at,
              std::vector<uint8_t>& dynamic);
  // Marks the candidates chosen last in `dynamic` (as choose() did).
  void mark(std::vector<uint8_t>& dynamic) const {
    for (int i = 0; i < begin_.back(); ++i) dynamic[static_cast<size_t>(candidates_[i])] = 1;
  }
  // GPU g's candidates, busiest first: [begin(g), end(g)) into at().
  int begin(int g) const { return begin_[g]; }
  int end(int g) const { return begin_[g + 1]; }
  int at(int i) const { return candidates_[i]; }

 private:
  // GPU g's candidates into `top` (room for all its local experts; those past the count
  // returned may be written too); returns how many. `per_gpu`: the busiest to take (at least);
  // `wanted`: the rows they should hold (0: no cover).
  int choose_busiest(std::span<const int> local, int per_gpu, double wanted,
                     const std::vector<int64_t>& counts, int* top);
  int choose_placement_set(const PlannerContext& ctx, int g, double wanted,
                           const std::vector<int64_t>& counts, int* top);

  std::vector<int> candidates_, begin_;  // begin_: [num_ranks + 1]
  std::vector<int> order_;               // one GPU's experts being sorted
  std::vector<uint8_t> in_set_;          // [num_experts] in the placement's set (all 0 between)
};

}  // namespace feplb::feplb_detail
