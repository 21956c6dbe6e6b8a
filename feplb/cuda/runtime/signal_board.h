// SignalBoard: the rank's named signals (host/signals.h) over one signal set of its transport.
// It owns the slot layout (no slot arithmetic outside it) and the value sequences (the call
// numbers, each rank's slots-quiet count). The mechanism is the transport's default
// (SignalMechanism::kEvent, CUDA events: the one ordering CUDA documents across streams, GPUs and
// processes); the set is made once per runtime, collectively.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "feplb/cuda/host/signals.h"
#include "feplb/cuda/transport.h"

namespace feplb::cuda {

class SignalBoard {
 public:
  // Collective over the transport's ranks: the set `name` of one slot per family and rank.
  SignalBoard(Transport& transport, const std::string& name);

  // Once prior work on `stream` is done, `to`'s signal `family` from this rank reaches `value`.
  void signal(SignalFamily family, int to, uint32_t value, cudaStream_t stream);
  // Later work on `stream` waits for this rank's signal `family` from `from` to reach `value`.
  void wait(SignalFamily family, int from, uint32_t value, cudaStream_t stream);

  // Value sequences (the same on every rank).
  uint32_t call() const { return layout_.call(); }
  uint32_t next_call() { return layout_.next_call(); }
  uint32_t quiet(int rank) const { return layout_.quiet(rank); }
  uint32_t bump_quiet(int rank) { return layout_.bump_quiet(rank); }

  SignalMechanism mechanism() const { return signals_->mechanism(); }
  const SignalLayout& layout() const { return layout_; }

 private:
  int rank_ = 0;
  SignalLayout layout_;
  std::unique_ptr<Transport::Signals> signals_;
};

}  // namespace feplb::cuda
