// CopyLinks: when phase-2 copies run, as the planners and the metrics model them. Every GPU has an
// egress and an ingress link; a copy holds the sender's egress and the receiver's ingress for its
// whole time (one copy-engine copy fills a link: 380 GB/s of the H200's NVLink), and no link runs
// two copies at once. Copies are placed in plan order, each at the earliest of:
//  - the sender's idle gap: when a copy had to wait for its busy receiver, the egress idled
//    meanwhile; a later copy runs in that gap (the largest still open) if its receiver is free
//    when the gap begins and it fits there. So a donor whose first receiver is still busy sends to
//    a free one meanwhile instead of queueing every later copy behind it;
//  - the receiver's idle gap: when a copy had to wait for its busy sender, the ingress idled
//    meanwhile; a later copy from another sender runs in that gap (the largest still open) from
//    when its sender is free, if it fits there. So a second donor's copy goes before a hot donor's
//    late one instead of after it;
//  - otherwise when both links are free after their last copies.
// A sender issues its copies in order of start (the GPU layer does); receivers order nothing.
// Times in ms.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "feplb/core/cost_model.h"
#include "feplb/core/knobs.h"
#include "feplb/core/plan.h"
#include "feplb/core/topology.h"

namespace feplb {

class CopyLinks {
 public:
  // Every link free from `start_ms`, no gaps. Allocates only when num_gpus grows.
  void reset(int num_gpus, double start_ms) {
    in_.assign(static_cast<size_t>(num_gpus), Link{start_ms, start_ms, start_ms});
    out_.assign(static_cast<size_t>(num_gpus), Link{start_ms, start_ms, start_ms});
  }
  // Links free no earlier than `ms` (copies queued before: prefetches); gaps before it are gone.
  void start_at(int gpu, double in_ms, double out_ms) {
    in_[static_cast<size_t>(gpu)].free_from(in_ms);
    out_[static_cast<size_t>(gpu)].free_from(out_ms);
  }

  // When a copy of `ms` from src to dst would start.
  double start(int src, int dst, double ms) const {
    const Link& out = out_[static_cast<size_t>(src)];
    const Link& in = in_[static_cast<size_t>(dst)];
    // The sender's gap, if the receiver is free when it begins.
    if (in.free <= out.gap_begin && out.gap_begin + ms <= out.gap_end) return out.gap_begin;
    // The receiver's gap, from when the sender is free.
    const double in_gap_at = std::max(in.gap_begin, out.free);
    if (in_gap_at < in.gap_end && in_gap_at + ms <= in.gap_end) return in_gap_at;
    return std::max(in.free, out.free);
  }
  // Queues that copy; returns when it lands.
  double add(int src, int dst, double ms) { return add_at(src, dst, start(src, dst, ms), ms); }
  // Queues it from `at`, where start() placed it; returns when it lands.
  double add_at(int src, int dst, double at, double ms) {
    const double end = at + ms;
    out_[static_cast<size_t>(src)].hold(at, end);
    in_[static_cast<size_t>(dst)].hold(at, end);
    return end;
  }

  double in_ms(int gpu) const { return in_[static_cast<size_t>(gpu)].free; }
  double out_ms(int gpu) const { return out_[static_cast<size_t>(gpu)].free; }

 private:
  // One direction of a GPU's NVLink: free after its last copy, and its largest idle gap before
  // that (empty: begin = end).
  struct Link {
    double free, gap_begin, gap_end;
    void free_from(double ms) {
      free = std::max(free, ms);
      gap_begin = gap_end = free;
    }
    // Holds the link over [at, end): inside its gap (the larger part left of the gap is kept, the
    // earlier one on a tie), or after its last copy (the idle time before it becomes the gap if it
    // is at least as large).
    void hold(double at, double end) {
      if (at < free) {
        if (at - gap_begin >= gap_end - end) {
          gap_end = at;
        } else {
          gap_begin = end;
        }
        return;
      }
      if (at - free >= gap_end - gap_begin) {
        gap_begin = free;
        gap_end = at;
      }
      free = end;
    }
  };
  std::vector<Link> in_, out_;  // [GPU] ingress, egress
};

// The link time of one copy of `bytes` at `gbps`, its setup included. The planner and the copy
// timer both use it, adding a migration's weights and rows in that order, so that both compute
// the same times bit for bit (a copy exactly filling a gap fits in both or in neither).
inline double link_ms(int64_t bytes, double gbps, double setup_us) {
  return static_cast<double>(bytes) / (gbps * 1e9) * 1e3 + setup_us * 1e-3;
}

// The planner time reserved ahead of a two-phase plan's copies, us: planner_budget_us, or where
// it is -1 (the default) one that grows with what is planned: 20 us, or `per_unit_us` per expert
// and per GPU where that is more.
//  - kReservePerUnitUs, 0.1 us (EP=72 with 288 experts: 36 us; EP=256 with 1,024: 128 us): an
//    explicit mode's plans, and the latency feplb's chooser expects of a one-hop plan: 1.5 to 2
//    times the default planner's median at the sizes docs/planners.md measures;
//  - kDefaultReservePerUnitUs, 0.125 us (45 and 160 us there): feplb's own two-phase plans (the
//    chooser's), whose p99 on a VM with hypervisor stalls passes the first (its median plus one
//    16-23 us stall: 38-41 us at EP=72, 120-134 at EP=256). On rack.md's and modes.md's workloads,
//    every plan charged 20 us, the default moved by -9.5% to +1.7% and met 56 of 56 targets
//    instead of 55 (bench/results/planner-reserve-ab.txt).
inline constexpr double kReservePerUnitUs = 0.1;
inline constexpr double kDefaultReservePerUnitUs = 0.125;
inline double planner_reserve_us(const Knobs& knobs, const Topology& topo,
                                 double per_unit_us = kReservePerUnitUs) {
  if (knobs.planner_budget_us >= 0) return knobs.planner_budget_us;
  return std::max(20.0, per_unit_us * static_cast<double>(topo.num_experts() + topo.num_ranks()));
}

// When the planner assumes a plan's phase-2 copies start (ms from when the GEMMs start): once the
// plan exists, the planner's reserve after the GEMMs start (the counts reached the host before the
// dispatch, as every EP dispatch that sizes its all-to-all-v on the host needs them; the planner
// runs while the dispatch does, so this is an upper bound), or at once for a plan made before the
// dispatch (its latency delays the dispatch instead: StepMetrics::plan_exposed_ms).
// A plan that carries its own reserve (Plan::reserve_us) uses it.
inline double planned_copy_start_ms(const Plan& plan, const Knobs& knobs, const Topology& topo) {
  if (plan.planned_before_dispatch) return 0.0;
  return (plan.reserve_us >= 0 ? plan.reserve_us : planner_reserve_us(knobs, topo)) * 1e-3;
}

// Times every copy of a plan (time(plan, ...)[i] for plan.copies[i]): prefetches first, first in,
// first out on both links from -knobs.prefetch_window_us; then the phase-2 copies in plan order on
// CopyLinks from `start_ms` (or when the prefetches are done), a migration's weights and then its
// rows (two adjacent copies of one expert, sender and receiver) as one copy. The GPU layer issues
// each GPU's copies helper by helper in this order of start. No allocation once its buffers have
// grown to the largest plan seen.
class CopyTimer {
 public:
  std::span<const CopyTime> time(const Plan& plan, const Topology& topo, const Knobs& knobs,
                                 double start_ms);

 private:
  CopyLinks links_;
  std::vector<double> in_ms_, out_ms_;  // [GPU] prefetches: when the links are free
  std::vector<CopyTime> times_;
};

// Writes plan.schedule (schedule.h): every copy timed by a CopyTimer from planned_copy_start_ms,
// each GPU's own work, ready guests and turns with their modelled GEMM times (`cost`) and waits,
// each GPU's helpers in issue order. Every planner's plan() ends with it (Planner::plan), so the
// metrics and the GPU layer read what the planner modelled. O((slices + copies) log) per plan,
// no allocation once its buffers have grown to the largest plan seen.
class ScheduleWriter {
 public:
  void write(Plan& plan, const Topology& topo, const Knobs& knobs, const GemmCostModel& cost);

 private:
  // A (GPU, other GPU) pair: a receiver and an owner (ms: when its last phase-2 copy in lands,
  // gemm: its guests' time), or a sender and a helper (ms: when its first copy starts).
  struct PairTime {
    int gpu, other;
    double ms, gemm_ms;
    bool guests;  // a receiver and an owner: some guest slice waits for these copies
  };
  // Steps 1-3 of every GPU (own_ms, ready_ms, turns) with no sort over the whole plan: the
  // phase-2 copies bucketed by receiver and merged per owner (pair_copies), then the slices in
  // plan order (add_slices: each GPU's and each turn's GEMM times summed in plan order; a guest
  // none of whose copies came from its owner waits for nothing of the owner's, its turn landing
  // at kNever), then each receiver's turns in landing order (order_turns).
  void write_turns(Plan& plan, const Topology& topo, const GemmCostModel& cost,
                   std::span<const CopyTime> times);
  void pair_copies(const Plan& plan, const Topology& topo, std::span<const CopyTime> times);
  void add_slices(Plan& plan, const Topology& topo, const GemmCostModel& cost);
  void order_turns(Schedule& s, int num_ranks);
  // Per GPU, the turns' waits (the timeline without slack).
  static void set_waits(Schedule& s, int num_ranks);
  // Per sender, its helpers by when its first copy to each starts.
  void write_helpers(Plan& plan, int num_ranks, std::span<const CopyTime> times);
  // Stable counting sort of `ids` (indices into a list of items of GPU gpu_of(id)) by GPU:
  // bucket g is by_gpu_[begin_[g] .. begin_[g + 1]).
  template <typename GpuOf>
  void bucket(int num_ranks, size_t num_ids, GpuOf gpu_of, std::vector<int>& begin,
              std::vector<int>& by_gpu);

  CopyTimer timer_;
  std::vector<int64_t> held_;  // gpu * E + expert of every resident replica, sorted
  std::vector<PairTime> pairs_;
  std::vector<int> copy_begin_, copy_by_gpu_;  // phase-2 copies waited for, by receiver/sender
  std::vector<int> copy_ids_;                  // the phase-2 copies waited for
  std::vector<int> pair_begin_;  // [num_ranks + 1] receiver g's pairs: [pair_begin_[g], [g + 1])
  std::vector<int> pair_at_;     // [num_ranks] index into pairs_ of the other GPU's pair (stamped)
  std::vector<int> pair_gpu_;    // [num_ranks] the GPU pair_at_ was set for
  std::vector<PairTime> unowned_;       // (receiver, owner) pairs of guests none of whose copies
                                        // came from their owner
  std::vector<PairTime> turn_scratch_;  // one receiver's turns, being sorted
  // The receivers of each expert's phase-2 copies: a list per expert from into_head_ ([num_experts]
  // index into into_, -1: none), each entry with the next (-1: last).
  struct Into {
    int gpu, next;
  };
  std::vector<Into> into_;
  std::vector<int> into_head_;
};

}  // namespace feplb
