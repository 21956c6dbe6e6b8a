// JobThread: a background thread of a rank's runtime (the scheduler: plans and phase-2 copies;
// the call thread: the layer's calls, RuntimeConfig::call_thread), running the jobs posted to it,
// in order. It spins for a short while after each job, since the next layer's job arrives within
// microseconds during a forward or backward pass, then sleeps on a condition variable: an idle
// runtime uses no CPU. Plain host code, CPU-tested.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace feplb::cuda {

class JobThread {
 public:
  using Fn = void (*)(void* ctx);

  // `spin_us`: how long the thread polls for a new job after finishing one before it sleeps;
  // `capacity`: jobs that may wait at once.
  explicit JobThread(double spin_us = 200.0, int capacity = kMaxQueued);
  ~JobThread();  // finishes the queued jobs, then joins
  JobThread(const JobThread&) = delete;
  JobThread& operator=(const JobThread&) = delete;

  // Queues fn(ctx). Never blocks; throws feplb::Error when `capacity` jobs are already waiting
  // (a caller that posts without waiting for its jobs). fn must not throw (jobs keep their own
  // error state).
  void post(Fn fn, void* ctx);
  // Waits while `capacity` jobs wait (never call it from this thread's jobs): a post() right
  // after succeeds unless another thread posted in between.
  void wait_room() const;
  // Waits until every job posted so far has finished (never call it from this thread's jobs).
  void drain() const;
  // Whether the calling thread is this one.
  bool on_this_thread() const { return std::this_thread::get_id() == thread_.get_id(); }
  // Jobs finished so far.
  uint64_t done() const;
  // CPU time this thread has used (seconds), from the thread's own clock.
  double cpu_seconds() const;

  static constexpr int kMaxQueued = 8;  // the default capacity (the scheduler thread's)

 private:
  void loop();
  void push(Fn fn, void* ctx, std::unique_lock<std::mutex>& lock);

  mutable std::mutex mu_;
  std::condition_variable wake_;
  mutable std::condition_variable progress_;  // a job finished (room, drain)
  std::vector<std::pair<Fn, void*>> queue_;
  int head_ = 0, count_ = 0;
  bool stop_ = false;
  bool sleeping_ = false;
  uint64_t posted_ = 0, done_ = 0;
  double spin_us_;
  std::thread thread_;
};

}  // namespace feplb::cuda
