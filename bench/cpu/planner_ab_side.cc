// One side of an in-process A/B of two builds (feplb_planner_ab): this module, built by each build
// against its own libraries, is loaded by feplb_planner_ab into a link namespace of its own
// (dlmopen), so that both builds plan in one process, in turn, on the same core and in the same
// state of the machine.
//   plans_us(R, E, skew, D, plans, out): the default planner on the probes' workload
//   (planner_workload.h), `plans` plan() calls, each call's time in us into out[]. The workload of
//   an (R, E, D) is made on its first call and kept. Returns 0, or 1 after printing an error.
#include <chrono>
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <tuple>

#include "bench/cpu/planner_workload.h"

namespace {
std::map<std::tuple<int, int, int>, std::unique_ptr<feplb::bench::ProbeWorkload>> workloads;
}  // namespace

extern "C" int plans_us(int R, int E, double skew, int D, int plans, double* out) {
  using Clock = std::chrono::steady_clock;
  try {
    auto& w = workloads[{R, E, D}];
    if (!w) {
      feplb::bench::ProbeSpec spec;
      spec.ranks = R;
      spec.experts = E;
      spec.skew = skew;
      spec.domain = D;
      w = std::make_unique<feplb::bench::ProbeWorkload>(spec);
    }
    for (int c = 0; c < plans; ++c) {
      w->plan_next([&](auto&& f) {
        const auto t0 = Clock::now();
        f();
        out[c] = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      });
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "planner A/B side: %s\n", e.what());
    return 1;
  }
}
