// Timeline: the named marks of one kind of call (forward or backward) of a layer, as the executor
// records them: a host clock reading at every mark, and a CUDA timing event on the mark's stream
// when the runtime times its calls (RuntimeConfig::timing); plus the idle spans of the guests'
// stream in each owner's wait (a timed wait step). The layer's statistics are spans of it.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <chrono>
#include <vector>

#include "feplb/cuda/base/resources.h"
#include "feplb/cuda/program/step_program.h"

namespace feplb::cuda {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;

  Timeline();

  // Marks `mark` now on the host and, with `gpu`, on `stream`. kStart forgets the last call's
  // GPU marks; kWaited starts counting the call's owner waits.
  void mark(Mark mark, cudaStream_t stream, bool gpu);
  // Around one timed wait of the guests' stream (with `gpu`).
  void wait_begin(cudaStream_t stream, bool gpu);
  void wait_end(cudaStream_t stream, bool gpu);

  Clock::time_point host(Mark mark) const { return host_[static_cast<size_t>(mark)]; }
  // Whether the GPU mark was recorded in this call.
  bool gpu_marked(Mark mark) const { return marked_[static_cast<size_t>(mark)]; }
  // Milliseconds between two GPU marks (their events must have completed).
  float ms(Mark from, Mark to) const;
  // The time the guests' stream idled in this call's timed waits.
  float waits_ms() const;

 private:
  std::vector<Event> events_;  // [kMarks]
  std::array<Clock::time_point, kMarks> host_{};
  std::array<bool, kMarks> marked_{};
  std::vector<Event> before_, after_;  // [waits]
  int waits_ = 0;
};

}  // namespace feplb::cuda
