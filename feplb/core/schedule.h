// Schedule: when a plan's copies run and the order in which each GPU runs the work they feed, as
// the planner modelled it. Written once, with the plan (ScheduleWriter, copy_links.h: every
// planner's plan() ends with it); read by the metrics (the window, exposed copy time) and by the
// GPU layer (the order it issues each GPU's copies and waits for each owner's). Nothing else
// recomputes it. Times in ms from when the GPUs start their expert GEMMs.
//
// What a GPU runs, in order (the GPU layer's forward and backward, and the metrics' timeline):
//   1. its own work: its experts' rows that stay home and replicas it holds (own_ms);
//   2. once the weights prefetched into it before routing have landed (prefetch_ms): the guests
//      whose inputs need no phase-2 copy (prefetched weights, rows dispatched to it in one hop);
//      their GEMM time is ready_ms;
//   3. turn by turn, each owner whose guests here need phase-2 copies (weights, token rows), once
//      that owner's last such copy into this GPU has landed; owners in the order their copies
//      land (then by index).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace feplb {

// When one of a plan's copies runs, in ms from when the GPUs start their expert GEMMs.
struct CopyTime {
  double start_ms = 0, end_ms = 0;
  bool timed = false;  // false: not waited for inside the window (outputs back, replicas)
  bool operator==(const CopyTime&) const = default;
};

// The guests one GPU runs for one owner once the owner's phase-2 copies into it have landed.
struct OwnerTurn {
  int owner = 0;
  double lands_ms = 0;  // when the owner's last phase-2 copy into this GPU lands
  double gemm_ms = 0;   // modelled GEMM time of those guests
  double wait_ms = 0;   // modelled idle time of the GPU just before them (0: none)
  bool operator==(const OwnerTurn&) const = default;
};

struct Schedule {
  static constexpr double kNever = -std::numeric_limits<double>::infinity();

  // When the plan's phase-2 copies were modelled to start (planned_copy_start_ms).
  double copy_start_ms = 0;
  std::vector<CopyTime> copies;     // [plan.copies]
  std::vector<double> own_ms;       // [num_ranks] step 1's GEMM time
  std::vector<double> prefetch_ms;  // [num_ranks] the last prefetch into it lands (kNever: none)
  std::vector<double> ready_ms;     // [num_ranks] step 2's GEMM time
  std::vector<int> turn_begin;      // [num_ranks + 1] turns of GPU g: [turn_begin[g], [g + 1])
  std::vector<OwnerTurn> turns;
  // Per GPU, the GPUs it sends phase-2 copies to, in the order it issues them: by when its first
  // copy to each starts (then by index).
  std::vector<int> helper_begin;  // [num_ranks + 1]
  std::vector<int> helpers;

  // Every number equal, bit for bit.
  bool operator==(const Schedule&) const = default;
  // Whether it was written for a plan of `num_copies` copies and `num_ranks` GPUs.
  bool written(size_t num_copies, int num_ranks) const {
    return copies.size() == num_copies && turn_begin.size() == static_cast<size_t>(num_ranks) + 1;
  }
  void clear() {
    copies.clear();
    own_ms.clear();
    prefetch_ms.clear();
    ready_ms.clear();
    turn_begin.clear();
    turns.clear();
    helper_begin.clear();
    helpers.clear();
  }
  std::span<const OwnerTurn> turns_of(int gpu) const {
    return {turns.data() + turn_begin[static_cast<size_t>(gpu)],
            turns.data() + turn_begin[static_cast<size_t>(gpu) + 1]};
  }
  std::span<const int> helpers_of(int gpu) const {
    return {helpers.data() + helper_begin[static_cast<size_t>(gpu)],
            helpers.data() + helper_begin[static_cast<size_t>(gpu) + 1]};
  }

  // GPU `gpu`'s modelled GEMM timeline, its phase-2 copies landing `delay_ms` later than written
  // (a plan ready later or earlier than the planner reserved): when it finishes, and its least
  // slack (when it would reach a turn without waiting, minus when the turn's copies land; < 0: it
  // waited; +infinity: no turn).
  struct Timeline {
    double finish_ms = 0;
    double slack_ms = std::numeric_limits<double>::infinity();
  };
  Timeline timeline(int gpu, double delay_ms = 0) const {
    Timeline t;
    t.finish_ms = own_ms[static_cast<size_t>(gpu)];
    const double ready = ready_ms[static_cast<size_t>(gpu)];
    const auto turns_here = turns_of(gpu);
    if (ready > 0 || !turns_here.empty()) {  // guests wait for the prefetches into the GPU
      const double prefetched = prefetch_ms[static_cast<size_t>(gpu)];
      t.slack_ms = std::min(t.slack_ms, t.finish_ms - prefetched);
      t.finish_ms = std::max(t.finish_ms, prefetched) + ready;
    }
    for (const OwnerTurn& turn : turns_here) {
      const double lands = turn.lands_ms + delay_ms;
      t.slack_ms = std::min(t.slack_ms, t.finish_ms - lands);
      t.finish_ms = std::max(t.finish_ms, lands) + turn.gemm_ms;
    }
    return t;
  }
};

}  // namespace feplb
