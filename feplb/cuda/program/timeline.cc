#include "feplb/cuda/program/timeline.h"

namespace feplb::cuda {

Timeline::Timeline() {
  events_.reserve(kMarks);
  for (int i = 0; i < kMarks; ++i) events_.emplace_back(true);
}

void Timeline::mark(Mark mark, cudaStream_t stream, bool gpu) {
  const size_t i = static_cast<size_t>(mark);
  host_[i] = Clock::now();
  if (mark == Mark::kStart) marked_.fill(false);
  if (mark == Mark::kWaited) waits_ = 0;
  if (!gpu) return;
  events_[i].record(stream);
  marked_[i] = true;
}

void Timeline::wait_begin(cudaStream_t stream, bool gpu) {
  if (!gpu) return;
  while (before_.size() <= static_cast<size_t>(waits_)) {
    before_.emplace_back(true);
    after_.emplace_back(true);
  }
  before_[static_cast<size_t>(waits_)].record(stream);
}

void Timeline::wait_end(cudaStream_t stream, bool gpu) {
  if (gpu) after_[static_cast<size_t>(waits_)].record(stream);
  ++waits_;
}

float Timeline::ms(Mark from, Mark to) const {
  return elapsed_ms(events_[static_cast<size_t>(from)], events_[static_cast<size_t>(to)]);
}

float Timeline::waits_ms() const {
  float ms = 0;
  for (int i = 0; i < waits_ && static_cast<size_t>(i) < before_.size(); ++i)
    ms += elapsed_ms(before_[static_cast<size_t>(i)], after_[static_cast<size_t>(i)]);
  return ms;
}

}  // namespace feplb::cuda
