#include "feplb/cuda/host/job_thread.h"

#include <pthread.h>
#include <time.h>

#include <chrono>

#include "feplb/core/error.h"

namespace feplb::cuda {

JobThread::JobThread(double spin_us) : spin_us_(spin_us) {
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

void JobThread::post(Fn fn, void* ctx) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (count_ == kMaxQueued)
      throw Error(fmt::format("scheduler thread: {} jobs already queued", kMaxQueued));
    queue_[static_cast<size_t>((head_ + count_) % kMaxQueued)] = {fn, ctx};
    ++count_;
    ++posted_;
    wake = sleeping_;
  }
  if (wake) wake_.notify_one();
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
      head_ = (head_ + 1) % kMaxQueued;
      --count_;
      lock.unlock();
      job.first(job.second);
      lock.lock();
      ++done_;
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
