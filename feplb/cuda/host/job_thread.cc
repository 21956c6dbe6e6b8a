#include "feplb/cuda/host/job_thread.h"

#include <pthread.h>
#include <time.h>

#include <chrono>

#include "feplb/core/error.h"

namespace feplb::cuda {

JobThread::JobThread(double spin_us, int capacity)
    : queue_(static_cast<size_t>(capacity)), spin_us_(spin_us) {
  thread_ = std::thread([this] { loop(); });
}

JobThread::~JobThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

// Queues fn(ctx) under `lock` (room checked by the caller) and releases the lock.
void JobThread::push(Fn fn, void* ctx, std::unique_lock<std::mutex>& lock) {
  const int capacity = static_cast<int>(queue_.size());
  queue_[static_cast<size_t>((head_ + count_) % capacity)] = {fn, ctx};
  ++count_;
  ++posted_;
  const bool wake = sleeping_;
  lock.unlock();
  if (wake) wake_.notify_one();
}

void JobThread::post(Fn fn, void* ctx) {
  std::unique_lock<std::mutex> lock(mu_);
  if (count_ == static_cast<int>(queue_.size()))
    throw Error(fmt::format("job thread: {} jobs already queued", queue_.size()));
  push(fn, ctx, lock);
}

void JobThread::wait_room() const {
  std::unique_lock<std::mutex> lock(mu_);
  progress_.wait(lock, [this] { return count_ < static_cast<int>(queue_.size()); });
}

void JobThread::drain() const {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = posted_;
  progress_.wait(lock, [&] { return done_ >= target; });
}

uint64_t JobThread::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

double JobThread::cpu_seconds() const {
  clockid_t clock{};
  timespec ts{};
  if (pthread_getcpuclockid(const_cast<std::thread&>(thread_).native_handle(), &clock) != 0 ||
      clock_gettime(clock, &ts) != 0) {
    throw Error("scheduler thread: cannot read its CPU clock");
  }
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

void JobThread::loop() {
  using Clock = std::chrono::steady_clock;
  auto last_job = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (count_ > 0) {
      const auto job = queue_[static_cast<size_t>(head_)];
      head_ = (head_ + 1) % static_cast<int>(queue_.size());
      --count_;
      lock.unlock();
      job.first(job.second);
      lock.lock();
      ++done_;
      progress_.notify_all();
      last_job = Clock::now();
      continue;
    }
    if (stop_) return;
    // Nothing queued: poll for a while (the next job usually follows at once), then sleep.
    if (std::chrono::duration<double, std::micro>(Clock::now() - last_job).count() < spin_us_) {
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
      continue;
    }
    sleeping_ = true;
    wake_.wait(lock, [this] { return count_ > 0 || stop_; });
    sleeping_ = false;
    last_job = Clock::now();
  }
}

}  // namespace feplb::cuda
