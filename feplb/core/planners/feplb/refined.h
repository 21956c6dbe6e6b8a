// One hop from the previous micro-batch, refined (knob one_hop_refine = 1): what shortens a
// one-hop plan on the critical path. The full plan is made from the layer's previous micro-batch
// while that one runs (observe(), off the critical path); of its (expert, helper) pairs those that
// land within the prefetch window go before routing (kPrefetchWeights, PrefetchHistory), the rest
// when the GPUs start, and on this micro-batch's counts the dispatch waits only for the
// refinement: each expert's rows re-split between its home and those helpers, levelling their
// loads. Measured in simulation (docs/metrics.md): it takes the plan off the critical path but
// the previous micro-batch's helpers are the wrong ones; the default does not use it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "feplb/core/plan.h"
#include "feplb/core/planners/feplb/config.h"
#include "feplb/core/planners/feplb/engine.h"
#include "feplb/core/planners/planner.h"

namespace feplb {

// The refinement, by rows, O(E + P log P) for P predicted pairs (and the water-filling's sorts of
// each shared expert's holders), no allocation once warm:
//  - an expert with no predicted helper stays home;
//  - the others, busiest first, are water-filled over their holders (home and helpers): the
//    least loaded holders are filled to a common level that takes all of the expert's rows;
//  - a helper whose share is below min_slice_rows (a GEMM's fixed cost per slice) is dropped, the
//    smallest first, and the rest filled again;
// every prefetched pair is listed in the plan whether or not it gets rows (its bytes are spent);
// a pair not prefetched gets its weights copied only where it gets rows.
// The first micro-batch of a layer, with no prediction yet, gets the full one-hop plan, charged
// as such.
class FeplbRefinedOneHop final : public Planner {
 public:
  // `prediction`: the mode the previous micro-batch is planned in (one hop, no prefetch).
  FeplbRefinedOneHop(const PlannerContext& ctx, const FeplbConfig& prediction);
  std::string_view name() const override { return "feplb"; }
  PlanLimits limits() const override;
  // Plans this micro-batch's counts in full: the next micro-batch's prediction.
  void observe(const RoutingStep& routing) override;
  std::span<const Copy> prefetch(int64_t layer) const override;

 protected:
  void make_plan(const RoutingStep& routing, Plan& out) override;

 private:
  // A predicted (expert, helper) pair; `prefetched`: its weights were copied before routing.
  struct Entry {
    int expert = 0, gpu = 0;
    bool prefetched = false;
  };
  struct Layer {
    int64_t layer = 0;
    std::vector<Entry> pairs;  // the previous micro-batch's plan's pairs
  };
  Layer* find_layer(int64_t layer);
  // Re-splits `routing`'s rows over the predicted holders (`pairs`) into `out` (see above); the
  // `prefetched` pairs' weights were copied before routing, the others' are copied now.
  void refine(std::span<const Entry> pairs, std::span<const Copy> prefetched,
              const RoutingStep& routing, Plan& out);
  // refine()'s steps: the predicted helpers by expert (entries_, helper_begin_; the prefetched
  // copies into `out`); the loads of experts without helpers (load_), the others busiest first
  // (shared_); expert e's `c` rows water-filled over its holders (holders_, share_).
  void index_helpers(std::span<const Entry> pairs, std::span<const Copy> prefetched, Plan& out);
  void load_unshared(const RoutingStep& routing);
  void water_fill(int home, int64_t c);

  const FeplbConfig prediction_;
  const std::string label_;
  FeplbEngine engine_;
  std::vector<Layer> layers_;
  Plan full_;  // observe()'s plan
  // refine()'s scratch: the predicted pairs, by expert (CSR), whether the one expert's helpers
  // hold prefetched weights, the GPUs' loads, the shared experts busiest first, one expert's
  // holders, the rows moved, their shares.
  std::vector<Entry> entries_;
  std::vector<int> helper_begin_, shared_, holders_;
  std::vector<uint8_t> prefetched_at_;  // [num_ranks]
  std::vector<int64_t> load_, moved_, share_;
};

}  // namespace feplb
