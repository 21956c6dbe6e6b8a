#include "feplb/core/fork_join.h"

#if defined(__linux__)
#include <sched.h>
#endif

#include <algorithm>
#include <chrono>
#include <map>

#include "feplb/core/error.h"

namespace feplb {

int ForkJoin::usable_cores() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

std::shared_ptr<ForkJoin> ForkJoin::shared(int threads) {
  static std::mutex mutex;
  static std::map<int, std::weak_ptr<ForkJoin>> sets;
  const std::lock_guard<std::mutex> lock(mutex);
  std::shared_ptr<ForkJoin> set = sets[threads].lock();
  if (!set) {
    set = std::make_shared<ForkJoin>(threads);
    sets[threads] = set;
  }
  return set;
}

ForkJoin::ForkJoin(int threads) : threads_(threads) {
  FEPLB_REQUIRE_INPUT(threads >= 1, "ForkJoin: {} threads (at least 1)", threads);
  workers_.reserve(static_cast<size_t>(threads - 1));
  for (int t = 1; t < threads; ++t) workers_.emplace_back([this, t] { loop(t); });
}

ForkJoin::~ForkJoin() {
  await_idle();
  stop_.store(true, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (std::thread& w : workers_) w.join();
}

void ForkJoin::await_idle() const {
  while (pending_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
}

void ForkJoin::publish(int count, Erased fn, void* context) {
  await_idle();  // every thread has read the last job (a wake() is acknowledged too)
  count_ = count;
  fn_ = fn;
  context_ = context;
  pending_.store(threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
}

void ForkJoin::wake() {
  const std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
  if (!lock.owns_lock() || threads_ == 1 || pending_.load(std::memory_order_acquire) != 0)
    return;  // a job runs, or they are awake already
  publish(0, nullptr, nullptr);
}

void ForkJoin::run_share(int thread) {
  for (int t = thread; t < count_; t += threads_) {
    try {
      fn_(context_, t, thread);
    } catch (...) {
      const std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }
}

void ForkJoin::run_erased(int count, Erased fn, void* context) {
  if (threads_ == 1 || count <= 1) {
    for (int t = 0; t < count; ++t) fn(context, t, 0);
    return;
  }
  error_ = nullptr;
  publish(count, fn, context);
  run_share(0);
  await_idle();
  if (error_) std::rethrow_exception(error_);
}

void ForkJoin::loop(int thread) {
  using Clock = std::chrono::steady_clock;
  uint64_t seen = 0;
  for (;;) {
    // Poll for the next job for kSpinUs after the last one, then sleep until it comes.
    const auto until = Clock::now() + std::chrono::microseconds(kSpinUs);
    uint64_t now = generation_.load(std::memory_order_acquire);
    while (now == seen && Clock::now() < until) {
      std::this_thread::yield();
      now = generation_.load(std::memory_order_acquire);
    }
    while (now == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      now = generation_.load(std::memory_order_acquire);
    }
    seen = now;
    if (stop_.load(std::memory_order_relaxed)) return;
    run_share(thread);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace feplb
