// ForwardStats and BackwardStats: what a layer's forward and backward measured (host clocks
// always; GPU times with the runtime's `timing`, from its executor's timeline). Part of the
// public API through feplb/cuda/moe_layer.h. Plain structs, no CUDA type.
#pragma once

#include <cstdint>

namespace feplb::cuda {

// Where one call's time on the caller's thread went (microseconds, steady clock). With counts on
// the host the GPU has caught up by the time the plan is ready, so from there on every host
// microsecond of the call is GPU time too. The rest of `call_us` is the argument and plan
// checks. With the runtime's call thread (RuntimeConfig::call_thread) these are that thread's
// times; the caller's thread only checks the arguments and queues the call.
struct HostTimes {
  double call_us = 0;      // the whole call
  double await_us = 0;     // waiting for the scheduler thread (plan ready, copies issued)
  double gemm_us = 0;      // enqueueing the expert GEMMs with their SwiGLU kernels (GEMM steps)
  double kernel_us = 0;    // enqueueing the other kernels (permute, combine, reductions, memsets)
  double exchange_us = 0;  // enqueueing collectives, all-to-all-v and copies
  double sync_us = 0;      // events, signals and waits on the GPU, marks
  double hooks_us = 0;     // the layer's host work between steps (memory, handing the job over)
  double build_us = 0;     // building the call's step programs
  double refine_us = 0;    // handing new GEMM shapes to the background refiner
  int64_t gemms = 0;       // GEMMs enqueued
};

// Host-side measurements of a forward (microseconds, steady clock, taken on the scheduler thread)
// and, with the runtime's `timing`, GPU times (ms, CUDA events).
struct ForwardStats {
  double counts_to_host_us = 0;  // counts D2H issued (caller's thread) -> seen by the scheduler
  double plan_us = 0;            // the planner call alone
  double prime_us = 0;  // priming it while the counts travelled (RuntimeConfig::prime_planner;
                        // 0: not primed: off, the counts were there first, or skipped)
  bool prime_overtaken = false;  // the counts arrived during the prime (the plan started later)
  // The planner time the plan reserved ahead of its phase-2 copies (us: its schedule's copy
  // start; 0 for a plan the dispatch waited for, one-hop): plan_us above it, the copies start
  // later than the plan modelled.
  double plan_reserve_us = 0;
  // Counts seen on the host (the scheduler's poll of the event after their D2H copy succeeds) ->
  // plan ready (routing assembled, planned, its step layout built and checked).
  double counts_to_plan_us = 0;
  double plan_to_first_copy_us = 0;    // plan ready -> first phase-2 copy issued (0: no copy)
  double counts_to_first_copy_us = 0;  // counts D2H issued -> first phase-2 copy issued
  // With `timing`: the counts all-gather done on the GPU -> the first phase-2 copy starting on the
  // copy stream (CUDA events on one device; includes the host's planning, as the GPU sees it, and,
  // on the two-phase path, the wait for phase 1). 0: no copy.
  float gpu_counts_to_first_copy_ms = 0;
  int64_t copies = 0;  // phase-2 copy calls this rank issued
  int64_t guest_rows = 0, exported_rows = 0;
  int64_t weight_copies = 0;    // experts' weights this rank copied to helpers in phase 2
  int64_t dispatched_rows = 0;  // guest rows that reached this rank in phase 1 (one hop)
  // Weights before routing, when this forward used a prefetch() (every rank's pairs, the same on
  // every rank): (expert, helper) pairs prefetched, and those the plan computed rows with.
  int64_t prefetched_pairs = 0, prefetch_hits = 0;
  // The forward's timeline: dispatch_ms + static_ms + wait_ms + guest_ms + return_ms + combine_ms
  // = forward_ms.
  float forward_ms = 0;  // the whole forward
  float dispatch_ms =
      0;                // start -> phase 1 landed (permute, counts all-gather, plan, all-to-all-v)
  float static_ms = 0;  // -> own experts' GEMMs done
  // -> guest experts' GEMMs done, split into the idle time waiting for their phase-2 inputs
  // (exposed copy time: before the first donor's guests and between donors, as each donor's
  // guests run once its copies landed) and the rest.
  float wait_ms = 0;
  float guest_ms = 0;
  float return_ms = 0;   // -> this rank's exported rows' outputs back from their helpers
  float combine_ms = 0;  // -> reverse all-to-all-v and weighted combine done
  HostTimes host;        // the caller's thread
};

struct BackwardStats {
  int64_t copies = 0;  // phase-2 copy calls this rank issued (inputs and results)
  int64_t weight_recopies =
      0;  // guest weights this rank copied again (slot refilled since forward)
  int64_t guest_rows = 0;
  // The backward's timeline, as the forward's (results_wait_ms is its return_ms).
  float backward_ms = 0;
  float dispatch_ms = 0;
  float static_ms = 0;
  float wait_ms = 0;
  float guest_ms = 0;
  float results_wait_ms = 0;  // idle waiting for the helpers' dX after the guests
  float combine_ms = 0;
  HostTimes host;  // the caller's thread
};

}  // namespace feplb::cuda
