// The named signal families of the GPU layer and their slot layout: the one place that knows
// which slot of a rank's signal set a family's signal from a given rank lands in, and how the
// values of the "slots quiet" family grow. Plain host code (no CUDA type), CPU-tested; the
// runtime's SignalBoard (feplb/cuda/runtime/signal_board.h) puts it over a transport's signal set.
//
// Every family has one slot per rank of the set, indexed by the rank that signals it:
//   inputs_landed    on a helper, from owner d: d's phase-2 inputs (weights, rows) landed here
//   rows_back        on an owner, from helper h: outputs (forward) or dX (backward) back here
//   grads_back       on an owner, from helper h: the guests' dW in this rank's staging slots
//   slots_quiet      on every rank, from rank h: nothing of h's calls so far reads or writes its
//                    guest weight slots any more (value: the number of calls that used them)
//   prefetch_landed  on a helper, from owner d: weights d prefetched landed here (value: the
//                    prefetch call's number)
// The other families' value is the number of the call (forward, backward or prefetch of any
// layer of the runtime) that raised them.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace feplb::cuda {

enum class SignalFamily : uint8_t {
  kInputsLanded,
  kRowsBack,
  kGradsBack,
  kSlotsQuiet,
  kPrefetchLanded,
};
inline constexpr int kSignalFamilies = 5;

// "inputs_landed", "rows_back", "grads_back", "slots_quiet", "prefetch_landed".
std::string_view signal_family_name(SignalFamily family);

// Slot layout and value sequences of one rank's signal set over `world` ranks. The same on every
// rank (they number calls alike and count slot uses alike).
class SignalLayout {
 public:
  explicit SignalLayout(int world = 1);

  int world() const { return world_; }
  // Slots per rank in the set: one per family and rank.
  int slots() const { return kSignalFamilies * world_; }
  // The slot that `family`'s signal from rank `from` lands in, on the receiving rank.
  int slot(SignalFamily family, int from) const;

  // The runtime's calls so far (the value of their signals): next_call() numbers a new one.
  uint32_t call() const { return call_; }
  uint32_t next_call() { return ++call_; }
  // slots_quiet's value for `rank`: calls so far that used or wrote its guest slots;
  // bump_quiet() counts one more and returns the new value.
  uint32_t quiet(int rank) const { return quiet_[static_cast<size_t>(rank)]; }
  uint32_t bump_quiet(int rank) { return ++quiet_[static_cast<size_t>(rank)]; }

 private:
  int world_ = 1;
  uint32_t call_ = 0;
  std::vector<uint32_t> quiet_;  // [world]
};

}  // namespace feplb::cuda
