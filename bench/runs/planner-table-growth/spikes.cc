// The plans that grow feplb's GEMM-time tables: one explicit mode (two-phase, time budget 0.05,
// hidden copies; prefetch per argv[4], default 1) plans the 136 synthetic micro-batches
// FeplbChooser::measure_mode_times uses (EP=R, E experts, domains of D), each clocked; prints
// those above 100 us. "warm" (argv[5]) grows the tables first (Planner::warm).
//   g++ -O2 -std=c++20 -I. spikes.cc -Lbuild/lib -lfeplb_core -Wl,-rpath,$PWD/build/lib
//   ./a.out 8 128 8 [prefetch] [warm]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "feplb/core/cost_model.h"
#include "feplb/core/planners/feplb/host_time.h"
#include "feplb/core/planners/planner.h"

int main(int argc, char** argv) {
  using namespace feplb;
  if (argc < 4) return 2;
  const int R = std::atoi(argv[1]), E = std::atoi(argv[2]), D = std::atoi(argv[3]);
  const Topology topo = Topology::contiguous(R, D, E);
  const ExpertShape shape{.hidden = 6144, .ffn = 2048, .dtype = Dtype::kBf16};
  Knobs knobs;
  knobs.one_hop = 0;
  knobs.prefetch = argc > 4 ? std::atoi(argv[4]) : 1;
  knobs.time_balance_budget = 0.05;
  knobs.copy_timing = 1;
  const RooflineCostModel cost(shape, knobs);
  auto p = make_planner("feplb", PlannerContext{topo, shape, knobs, &cost});
  const int64_t rows = 8 * 4096;
  if (argc > 5 && std::string(argv[5]) == "warm") {
    std::vector<int64_t> totals;
    int64_t most = 0;
    for (int s = 0; s < 136; ++s) {
      feplb_detail::synthetic_totals(topo, rows, 0x7e57, s, totals);
      most = std::max(most, *std::max_element(totals.begin(), totals.end()));
    }
    p->warm(most);
  }
  RoutingStep step;
  Plan plan;
  double total = 0;
  for (int s = 0; s < 136; ++s) {
    feplb_detail::synthetic_step(topo, rows, 0x7e57, s, step);
    const auto t0 = std::chrono::steady_clock::now();
    p->plan(step, plan);
    const auto t1 = std::chrono::steady_clock::now();
    const double us = std::chrono::duration<double, std::micro>(t1 - t0).count();
    total += us;
    if (us > 100) std::printf("step %d: %.1f us\n", s, us);
    p->observe(step);
  }
  std::printf("136 plans: %.1f ms in all\n", total * 1e-3);
}
