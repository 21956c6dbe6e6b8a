// ForkJoin (feplb/core/fork_join.h): every task once, on its thread; a task's exception back on
// the caller's; jobs after the threads have gone to sleep; many short jobs in a row (the
// ThreadSanitizer build checks the hand-offs).
#include "feplb/core/fork_join.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

namespace feplb {
namespace {

TEST(ForkJoin, RunsEveryTaskOnceOnItsThread) {
  ForkJoin pool(4);
  ASSERT_EQ(pool.threads(), 4);
  for (int count : {0, 1, 3, 4, 10}) {
    std::vector<int> runs(static_cast<size_t>(count), 0), thread_of(static_cast<size_t>(count), -1);
    std::vector<std::thread::id> ids(static_cast<size_t>(count));
    auto task = [&](int t, int thread) {
      ++runs[static_cast<size_t>(t)];
      thread_of[static_cast<size_t>(t)] = thread;
      ids[static_cast<size_t>(t)] = std::this_thread::get_id();
    };
    pool.run(count, task);
    for (int t = 0; t < count; ++t) {
      EXPECT_EQ(runs[static_cast<size_t>(t)], 1) << "task " << t << " of " << count;
      // One task runs on the caller's thread (0); with more tasks each on thread t % 4.
      if (count > 1) {
        EXPECT_EQ(thread_of[static_cast<size_t>(t)], t % 4);
      }
      const bool on_caller = thread_of[static_cast<size_t>(t)] == 0;
      EXPECT_EQ(ids[static_cast<size_t>(t)] == std::this_thread::get_id(), on_caller);
    }
  }
}

TEST(ForkJoin, OneThreadRunsTheTasksOnTheCaller) {
  ForkJoin pool(1);
  std::vector<int> order;
  auto task = [&](int t, int thread) {
    EXPECT_EQ(thread, 0);
    order.push_back(t);
  };
  pool.run(3, task);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
}

TEST(ForkJoin, ATasksExceptionReachesTheCallerAfterEveryTaskEnded) {
  ForkJoin pool(3);
  std::atomic<int> done{0};
  auto task = [&](int t, int) {
    if (t == 4) throw std::runtime_error("task 4 failed");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    done.fetch_add(1);
  };
  EXPECT_THROW(
      {
        try {
          pool.run(6, task);
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "task 4 failed");
          throw;
        }
      },
      std::runtime_error);
  EXPECT_EQ(done.load(), 5);
  // The pool goes on.
  std::atomic<int> again{0};
  auto count = [&](int, int) { again.fetch_add(1); };
  pool.run(6, count);
  EXPECT_EQ(again.load(), 6);
}

// Past its polling window a thread sleeps; the next job wakes it (and a wake() ahead of it).
TEST(ForkJoin, WakesThreadsThatWentToSleep) {
  ForkJoin pool(3);
  for (int round = 0; round < 3; ++round) {
    std::this_thread::sleep_for(std::chrono::microseconds(ForkJoin::kSpinUs + 5000));
    if (round == 1) pool.wake();
    std::atomic<int> sum{0};
    auto task = [&](int t, int) { sum.fetch_add(t + 1); };
    pool.run(5, task);
    EXPECT_EQ(sum.load(), 15) << "round " << round;
  }
  pool.wake();  // destroyed while its threads are awake from a wake()
}

TEST(ForkJoin, ManyShortJobsInARow) {
  ForkJoin pool(4);
  std::vector<int64_t> slot(4, 0);
  int64_t expected = 0;
  for (int job = 0; job < 2000; ++job) {
    auto task = [&](int t, int) { slot[static_cast<size_t>(t)] += job; };
    pool.run(4, task);
    expected += job;
    if (job % 500 == 0) pool.wake();
  }
  for (int64_t s : slot) EXPECT_EQ(s, expected);
}

}  // namespace
}  // namespace feplb
