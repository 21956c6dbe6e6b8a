// Weights before routing (prefetch = 1): PrefetchHistory predicts, per layer, the (expert, helper)
// pairs of the next micro-batch from the plans it recorded; PrefetchedWeights is one plan's.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "feplb/core/copy_links.h"
#include "feplb/core/plan.h"
#include "feplb/core/planners/planner.h"

namespace feplb::feplb_detail {

// After each step, the (expert, helper) pairs its plan used over the layer's last
// prefetch_history micro-batches predict the next micro-batch of the layer (most frequent, then
// most recent, then most rows first), as many as land within prefetch_window_us on the FIFO links
// and fit the guest slots (max_num_dyn). The plan lists them as kPrefetchWeights copies (issued
// before routing), offers an expert first to the helpers that hold its weights, and copies no
// weights there: only the rows must fit the window. A wrong prediction costs bytes, never
// correctness.
class PrefetchHistory {
 public:
  explicit PrefetchHistory(const PlannerContext& ctx) : ctx_(ctx) {}
  // Records the pairs `plan` (of `layer`) used and predicts the layer's next micro-batch.
  void record(int64_t layer, const Plan& plan);
  // The layer's prediction: kPrefetchWeights copies, home -> helper, in issue order (empty if
  // none). Valid until the next record().
  std::span<const Copy> predicted(int64_t layer) const;

 private:
  struct Pair {
    int expert, gpu;
    int64_t step, rows, count;
  };
  struct LayerPrefetch {
    int64_t layer = 0;
    int64_t next = 0;                        // micro-batches recorded
    std::vector<std::vector<Pair>> history;  // ring of the last prefetch_history plans' pairs
    std::vector<Copy> predicted;             // kPrefetchWeights, in issue order
  };
  LayerPrefetch& layer_state(int64_t layer);
  // Ranks the recorded pairs and keeps those whose weights land within the prefetch window on the
  // FIFO links (from -window), at most max_num_dyn per GPU.
  void predict(LayerPrefetch& lp);

  const PlannerContext& ctx_;
  std::vector<LayerPrefetch> layers_;
  std::vector<Pair> merged_;            // predict(): every recorded pair, then one per pair
  std::vector<double> in_ms_, out_ms_;  // predict(): [num_ranks] when the FIFO links are free
  std::vector<int64_t> slots_;          // predict(): [num_ranks] guest slots taken
};

// One plan's prefetched weights, by expert.
class PrefetchedWeights {
 public:
  // Adds `prefetches` (a layer's prediction; empty without prefetch) to `out`, takes their guest
  // slots, indexes them by expert, and queues them on `links` from -window ahead of phase 2.
  void add(const PlannerContext& ctx, std::span<const Copy> prefetches, Plan& out,
           std::vector<int64_t>& guests, CopyLinks& links);
  // The GPUs holding e's prefetched weights.
  std::span<const int> helpers_of(int e) const {
    return {gpu_.data() + begin_[e], gpu_.data() + begin_[e + 1]};
  }
  bool has(int e, int h) const {
    for (int i = begin_[e]; i < begin_[e + 1]; ++i) {
      if (gpu_[i] == h) return true;
    }
    return false;
  }

 private:
  std::vector<int> begin_, gpu_, fill_;  // by expert: [begin_[e], begin_[e + 1]) into gpu_
  std::vector<double> in_ms_, out_ms_;   // [num_ranks] when the links are free after them
};

}  // namespace feplb::feplb_detail
