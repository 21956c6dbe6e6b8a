// JobThread: the one background thread of a rank's runtime (the scheduler: plans and phase-2
// copies), running the jobs the caller posts, in order. It spins for a short while after each
// job, since the next layer's job arrives within microseconds during a forward or backward pass,
// then sleeps on a condition variable: an idle runtime uses no CPU. Plain host code, CPU-tested.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace feplb::cuda {

class JobThread {
 public:
  using Fn = void (*)(void* ctx);

  // `spin_us`: how long the thread polls for a new job after finishing one before it sleeps.
  explicit JobThread(double spin_us = 200.0);
  ~JobThread();  // finishes the queued jobs, then joins
  JobThread(const JobThread&) = delete;
  JobThread& operator=(const JobThread&) = delete;

  // Queues fn(ctx). Never blocks; throws feplb::Error when kMaxQueued jobs are already waiting
  // (a caller that posts without waiting for its jobs). fn must not throw (jobs keep their own
  // error state).
  void post(Fn fn, void* ctx);
  // Jobs finished so far.
  uint64_t done() const;
  // CPU time this thread has used (seconds), from the thread's own clock.
  double cpu_seconds() const;

  static constexpr int kMaxQueued = 8;

 private:
  void loop();

  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::array<std::pair<Fn, void*>, kMaxQueued> queue_{};
  int head_ = 0, count_ = 0;
  bool stop_ = false;
  bool sleeping_ = false;
  uint64_t posted_ = 0, done_ = 0;
  double spin_us_;
  std::thread thread_;
};

}  // namespace feplb::cuda
