// MicroBatch, the handle a forward returns and its backward consumes: a runtime state slot and
// its generation (the state itself lives in the runtime's pool, runtime/runtime_state.h).
#include <utility>

#include "feplb/core/error.h"
#include "feplb/cuda/moe_layer.h"
#include "feplb/cuda/runtime/runtime_state.h"

namespace feplb::cuda {

MicroBatch::~MicroBatch() { release(); }

MicroBatch::MicroBatch(MicroBatch&& o) noexcept
    : rt_(std::move(o.rt_)),
      slot_(std::exchange(o.slot_, -1)),
      generation_(std::exchange(o.generation_, 0)) {}

MicroBatch& MicroBatch::operator=(MicroBatch&& o) noexcept {
  if (this != &o) {
    release();
    rt_ = std::move(o.rt_);
    slot_ = std::exchange(o.slot_, -1);
    generation_ = std::exchange(o.generation_, 0);
  }
  return *this;
}

void MicroBatch::release() noexcept {
  if (rt_ && slot_ >= 0) rt_->release(slot_, generation_, nullptr);
  rt_.reset();
  slot_ = -1;
  generation_ = 0;
}

bool MicroBatch::valid() const {
  if (!rt_ || slot_ < 0) return false;
  std::lock_guard<std::mutex> lock(rt_->batches.mu);
  const MicroBatchState& h = rt_->batches.states[static_cast<size_t>(slot_)];
  return h.in_use && h.generation == generation_;
}

size_t MicroBatch::checked() const {
  FEPLB_REQUIRE_INPUT(
      valid(), "micro-batch handle is empty (consumed by a backward, dropped, or moved from)");
  return static_cast<size_t>(slot_);
}

// What the forward wrote: with the call thread, once the calls queued so far have run.
const Plan& MicroBatch::plan() const {
  if (rt_) rt_->drain_calls();
  return rt_->batches.states[checked()].plan;
}
const RoutingStep& MicroBatch::routing() const {
  if (rt_) rt_->drain_calls();
  return rt_->batches.states[checked()].routing;
}
const ForwardStats& MicroBatch::stats() const {
  if (rt_) rt_->drain_calls();
  return rt_->batches.states[checked()].stats;
}
size_t MicroBatch::saved_bytes() const {
  if (rt_) rt_->drain_calls();
  const MicroBatchState& h = rt_->batches.states[checked()];
  return h.bytes_tokens + h.bytes_plan;
}
int64_t MicroBatch::num_tokens() const { return rt_->batches.states[checked()].num_tokens; }

}  // namespace feplb::cuda
