// What planning side by side costs beyond the plans (feplb/core/fork_join.h, the chooser's
// planner_threads): one job of empty tasks, one per thread, from run() until every task returned,
//  - BM_ForkJoinPolling: its threads polling (jobs back to back, as a layer's first plans come
//    in the first forward pass);
//  - BM_ForkJoinAsleep: its threads asleep (the job after a pause longer than their polling
//    window: the planner's very first plan, or one after a long quiet spell);
//  - BM_ForkJoinWoken: asleep, then woken by wake() 50 us before the job (Planner::prime's
//    call while the counts travel).
// Each `threads` includes the caller's. On a host with fewer cores than threads they time-share.
#include <benchmark/benchmark.h>

#include <chrono>
#include <thread>

#include "feplb/core/fork_join.h"

namespace {

using Clock = std::chrono::steady_clock;

void BM_ForkJoinPolling(benchmark::State& state) {
  feplb::ForkJoin pool(static_cast<int>(state.range(0)));
  int sink = 0;
  auto task = [&](int, int) { benchmark::DoNotOptimize(sink); };
  for (auto _ : state) pool.run(pool.threads(), task);
}
BENCHMARK(BM_ForkJoinPolling)->Arg(2)->Arg(4)->Arg(8)->UseRealTime();

// Times one job after `pause`, wake() `lead` before it where lead > 0.
void after_pause(benchmark::State& state, std::chrono::microseconds lead) {
  feplb::ForkJoin pool(static_cast<int>(state.range(0)));
  int sink = 0;
  auto task = [&](int, int) { benchmark::DoNotOptimize(sink); };
  const auto pause = std::chrono::microseconds(feplb::ForkJoin::kSpinUs + 2000);
  for (auto _ : state) {
    state.PauseTiming();
    std::this_thread::sleep_for(pause);
    if (lead.count() > 0) {
      pool.wake();
      const auto until = Clock::now() + lead;
      while (Clock::now() < until) {
      }
    }
    state.ResumeTiming();
    pool.run(pool.threads(), task);
  }
}

void BM_ForkJoinAsleep(benchmark::State& state) { after_pause(state, {}); }
BENCHMARK(BM_ForkJoinAsleep)->Arg(2)->Arg(4)->Arg(8)->Iterations(200)->UseRealTime();

void BM_ForkJoinWoken(benchmark::State& state) {
  after_pause(state, std::chrono::microseconds(50));
}
BENCHMARK(BM_ForkJoinWoken)->Arg(2)->Arg(4)->Arg(8)->Iterations(200)->UseRealTime();

}  // namespace
