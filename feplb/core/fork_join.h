// ForkJoin: a fixed set of host threads that run the tasks of one short job beside the caller's
// thread and return when all are done, for planning several candidates in one plan's time (feplb's
// chooser, planner_threads). A job of a few tens of microseconds cannot afford a wake-up per task:
// the threads spin (yielding the core between polls) for kSpinUs after each job and after
// wake(), and sleep on a futex (std::atomic::wait) after that. One set per process and size
// (shared()): the GPU layer has a planner per MoE layer, and a rank's layers plan one at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace feplb {

class ForkJoin {
 public:
  // How long a thread polls for the next job before it sleeps: a layer's first micro-batches
  // come one forward layer (about 1-3 ms) apart at the start of a run.
  static constexpr int64_t kSpinUs = 5000;

  // `threads` >= 1 counts the caller's: threads - 1 are started here.
  explicit ForkJoin(int threads);
  ~ForkJoin();
  ForkJoin(const ForkJoin&) = delete;
  ForkJoin& operator=(const ForkJoin&) = delete;

  // The cores this process may run on (its CPU affinity; the hardware's where that is unknown).
  static int usable_cores();
  // The process's set of `threads` (made on first use, kept while anyone holds it).
  static std::shared_ptr<ForkJoin> shared(int threads);

  int threads() const { return threads_; }
  // Runs task(t, thread) for every t in [0, count), task t on thread t % threads() (0: the
  // caller's, which runs its share too), and returns when every task has returned. The first
  // exception a task threw is rethrown here (after all tasks ended). A second caller meanwhile
  // waits for the first's job to end.
  template <class Task>
  void run(int count, Task& task) {
    const std::lock_guard<std::mutex> lock(busy_);
    run_erased(count, erase<Task>(), &task);
  }
  // As run(), or false at once (nothing run) while another caller's job runs.
  template <class Task>
  bool try_run(int count, Task& task) {
    const std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    run_erased(count, erase<Task>(), &task);
    return true;
  }
  // The threads start polling now (for kSpinUs), so that the next run() starts its tasks without
  // a wake-up: call it ahead of a job whose inputs are on the way (nothing while a job runs).
  void wake();

 private:
  using Erased = void (*)(void*, int, int);
  template <class Task>
  static Erased erase() {
    return [](void* f, int t, int th) { (*static_cast<Task*>(f))(t, th); };
  }
  void run_erased(int count, Erased fn, void* context);
  void publish(int count, Erased fn, void* context);
  void loop(int thread);
  void run_share(int thread);
  void await_idle() const;

  const int threads_;
  // The job, written only while no thread reads it (pending_ 0), read after generation_.
  int count_ = 0;
  Erased fn_ = nullptr;
  void* context_ = nullptr;
  std::atomic<uint64_t> generation_{0};  // +1 per job or wake()
  std::atomic<int> pending_{0};          // threads yet to finish the latest job
  std::atomic<bool> stop_{false};
  std::mutex busy_;  // held by the caller of the running job (and wake())
  std::mutex error_mutex_;
  std::exception_ptr error_;  // the first task's exception of the running job
  std::vector<std::thread> workers_;
};

}  // namespace feplb
