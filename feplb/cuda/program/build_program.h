// Builds the step programs of the GPU layer's calls (program/step_program.h) from a StepLayout
// (which already follows the plan's schedule: exports in the schedule's issue order, guests in
// its turns) and a few host facts. Nothing here re-derives an order: it lists the layout's.
// Plain host code, identical on every rank given the same inputs; the golden CPU tests print it.
#pragma once

#include <cstdint>
#include <span>

#include "feplb/cuda/host/step_layout.h"
#include "feplb/cuda/program/step_program.h"

namespace feplb::cuda {

// What a call's steps depend on besides the layout.
struct CallFacts {
  int rank = 0;
  int world = 1;
  int num_experts = 1;
  int experts_per_rank = 1;
  bool training = true;
  bool overwrite_grads = false;  // backward: GradMode::kOverwrite
  bool sync_before_counts = false;
  bool dispatched = false;       // the dispatched-rows form (forward_/backward_dispatched)
  bool settle = false;           // a prefetch is pending at the call's start: the call settles it
  bool prefetched_here = false;  // forward: the pending prefetch is this layer's (it uses it)
  std::span<const uint8_t> prefetch_into_here;  // [R] owners the pending prefetch copied here
  std::span<const uint8_t> prefetch_targets;    // [R] ranks the pending prefetch copied into
};

// Forward, caller's thread, up to the plan: start after the previous call, settle a pending
// prefetch of another layer, permute and count (or stage the caller's rows per expert), the
// counts all-gather and their copy to the host, then the scheduler's job and the wait for it.
void build_forward_prologue(StepList& out, const CallFacts& facts);
// Forward, caller's thread, once the plan fits: phase 1, own experts, guests, results back,
// reverse all-to-all-v and combine (dispatched rows: the exported rows' results into the
// caller's), the end of the call.
void build_forward_body(StepList& out, const StepLayout& layout, const CallFacts& facts);
// Forward that stops once planned (bad expert ids, a plan that does not fit): the end of a call
// that ran nothing.
void build_forward_stop(StepList& out, const CallFacts& facts);
// Backward (or backward_dispatched), caller's thread, whole.
void build_backward(StepList& out, const StepLayout& layout, const CallFacts& facts);

// One rank (nothing to exchange or balance), rows counted on the GPU: the whole call on the
// caller's thread, a fixed list of steps whatever the routing, and no host wait for the counts.
// Forward: permute and count into the micro-batch, the counts' D2H into the layer's ring (read at
// a later call), every expert's FFN over its rows (kCountedGemm), combine. Backward: the
// gradient's scatter, the FFNs' backward (`overwrite_grads`: dW written), the unweighted combine
// into grad_hidden.
void build_forward_one_rank(StepList& out);
void build_backward_one_rank(StepList& out, bool overwrite_grads);

// The scheduler's phase-2 inputs of a call, helper by helper in the layout's issue order: the
// weights (forward: unless prefetched for it; backward: where `recopy[slice]`), then the copied
// (not one-hop) rows, then the helper's inputs_landed signal. `runs` false: the call copies
// nothing (its plan was refused).
struct InputFacts {
  bool backward = false;
  bool runs = true;
  bool prefetched_here = false;
  bool observe = false;             // forward: the planner planned the step (it observes it)
  std::span<const uint8_t> recopy;  // [plan slices] backward
  Buf rows = Buf::kXHome;           // where the rows are: kXHome, kDyHome or kCallerIn
};
void build_inputs(StepList& out, const StepLayout& layout, const InputFacts& facts, int rank);

// Prefetch: settle an earlier pending prefetch (`facts.settle`, its masks in `facts`), then, if
// anything was predicted, number the call, hold it pending and issue this rank's copies of the
// predicted weights into its helpers' guest slots, helper by helper (each after the helper's
// slots are quiet), each batch ended by prefetch_landed. `copies[i]` = (expert's local index on
// this rank, helper, slot) of this rank's predicted pairs, in prediction order.
struct PrefetchCopy {
  int local_index = 0;
  int helper = 0;
  int slot = 0;
};
// `any_predicted`: the prediction (every rank's pairs, the same on every rank) is not empty; then
// every rank numbers the call and holds the prefetch pending, with copies of its own or none.
void build_prefetch(StepList& out, std::span<const PrefetchCopy> copies, bool any_predicted,
                    const CallFacts& facts);

}  // namespace feplb::cuda
