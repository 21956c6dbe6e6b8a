// A planner's plan() calls on the probes' workload (planner_workload.h), one process per setting:
// their wall time (median, p90), optionally with the caches evicted before each call (--evict-mib),
// and their instructions under callgrind (--callgrind: only the measured calls are instrumented);
// with --first-plans N, the first plan() of N fresh planners (no history) instead; with
// --new-layers N, after the usual warm-up the first plans of N layers never seen before (what
// planner_threads plans side by side), the first of them apart (a side thread's tables grow then).
//   feplb_planner_probe --ranks 72 --experts 288 --skew 5 --domain 72 [--plans 96] [--evict-mib 64]
//                       [--knob one_hop=0 --knob time_balance_budget=0.05 ...]
//   valgrind --tool=callgrind --instr-atstart=no build/bin/feplb_planner_probe ... --callgrind
// scripts/planner-ab runs it for two builds.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/cpu/planner_workload.h"
#include "feplb/core/error.h"
#include "feplb/core/stats.h"

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define FEPLB_HAVE_CALLGRIND 1
#else
#define FEPLB_HAVE_CALLGRIND 0
#endif

namespace {
volatile long evicted = 0;  // keeps the eviction writes

// The first plan() of `first_plans` fresh planners (no history), timed.
int time_first_plans(const feplb::bench::ProbeSpec& spec, int first_plans) {
  std::vector<double> us;
  std::string mode;
  for (int i = 0; i < first_plans; ++i) {
    feplb::bench::ProbeWorkload w(spec, /*cold=*/true);
    w.plan_next([&](auto&& f) {
      const auto t0 = std::chrono::steady_clock::now();
      f();
      us.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    });
    mode = w.last_plan().mode;
  }
  fmt::print(
      "{} R={} E={} D={}: first plan of {} fresh planners, median {:.1f} us, p90 {:.1f} "
      "us, mode {}\n",
      spec.planner, spec.ranks, spec.experts, spec.domain, first_plans, feplb::quantile_of(us, 0.5),
      feplb::quantile_of(us, 0.9), mode);
  return 0;
}
// After the warm-up, the first plans of `layers` layers never seen before, timed.
int time_new_layers(const feplb::bench::ProbeSpec& spec, int layers) {
  feplb::bench::ProbeWorkload w(spec);
  for (int i = 0; i < feplb::bench::ProbeWorkload::kSteps; ++i) w.plan_next([](auto&& f) { f(); });
  std::vector<double> us;
  double first = 0;
  int32_t extra = 0;
  for (int i = 0; i < layers; ++i) {
    w.plan_new_layer(1000 + i, [&](auto&& f) {
      const auto t0 = std::chrono::steady_clock::now();
      f();
      const double t =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      if (i == 0)
        first = t;
      else
        us.push_back(t);
    });
    extra = std::max(extra, w.last_plan().extra_plans);
  }
  fmt::print(
      "{} R={} E={} D={}: first plans of {} new layers, the first {:.1f} us, the others median "
      "{:.1f} us, p90 {:.1f} us, plans in series besides {}, last mode {}\n",
      spec.planner, spec.ranks, spec.experts, spec.domain, layers, first,
      us.empty() ? 0.0 : feplb::quantile_of(us, 0.5),
      us.empty() ? 0.0 : feplb::quantile_of(us, 0.9), extra, w.last_plan().mode);
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  using namespace feplb;
  bench::ProbeSpec spec;
  int plans = 96, evict_mib = 0, first_plans = 0, new_layers = 0;
  bool callgrind = false;
  CLI::App app{"feplb_planner_probe: a planner's plan() calls on a synthetic workload, timed"};
  app.add_option("--ranks", spec.ranks, "GPUs")->check(CLI::Range(2, 4096));
  app.add_option("--experts", spec.experts, "experts")->check(CLI::Range(2, 65536));
  app.add_option("--domain", spec.domain, "GPUs per NVLink domain")->check(CLI::Range(1, 4096));
  app.add_option("--skew", spec.skew, "lognormal max/mean expert load")
      ->check(CLI::Range(1.0, 1e3));
  app.add_option("--prior", spec.prior_file, "a prior JSON instead of the lognormal one")
      ->check(CLI::ExistingFile);
  app.add_option("--planner", spec.planner, "policy name");
  std::vector<std::string> knobs;
  app.add_option("--knob", knobs, "NAME=VALUE, repeatable (e.g. one_hop=0: an explicit mode)");
  app.add_option("--plans", plans, "measured plan() calls")->check(CLI::Range(1, 1000000));
  app.add_option("--evict-mib", evict_mib, "MiB written before each call (cold caches)")
      ->check(CLI::Range(0, 65536));
  app.add_option("--first-plans", first_plans, "time the first plan() of this many fresh planners")
      ->check(CLI::Range(1, 100000));
  app.add_option("--new-layers", new_layers,
                 "time the first plans of this many new layers after the warm-up")
      ->check(CLI::Range(2, 100000));
  app.add_flag("--callgrind", callgrind, "instrument the measured calls only (under valgrind)");
  CLI11_PARSE(app, argc, argv);
  if (callgrind && !FEPLB_HAVE_CALLGRIND) {
    std::fprintf(stderr, "feplb_planner_probe: built without valgrind/callgrind.h (--callgrind)\n");
    return 2;
  }
  try {
    FEPLB_REQUIRE_INPUT(spec.ranks % spec.domain == 0 && spec.experts % spec.ranks == 0,
                        "{} GPUs in domains of {} with {} experts: need whole domains and an "
                        "equal number of experts per GPU",
                        spec.ranks, spec.domain, spec.experts);
    for (const std::string& k : knobs) spec.knobs.push_back(parse_knob_override(k));
    if (first_plans > 0) return time_first_plans(spec, first_plans);
    if (new_layers > 0) return time_new_layers(spec, new_layers);
    bench::ProbeWorkload w(spec);
    for (int i = 0; i < bench::ProbeWorkload::kSteps; ++i) w.plan_next([](auto&& f) { f(); });
    std::vector<char> junk(static_cast<size_t>(evict_mib) << 20, 1);
    long sink = 0;
    std::vector<double> us;
    using Clock = std::chrono::steady_clock;
    for (int c = 0; c < plans; ++c) {
      for (size_t j = 0; j < junk.size(); j += 64) sink += ++junk[j];
      w.plan_next([&](auto&& f) {
        const auto t0 = Clock::now();
#if FEPLB_HAVE_CALLGRIND
        if (callgrind) CALLGRIND_START_INSTRUMENTATION;
#endif
        f();
#if FEPLB_HAVE_CALLGRIND
        if (callgrind) CALLGRIND_STOP_INSTRUMENTATION;
#endif
        us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      });
    }
    evicted = sink;
    const std::string workload =
        spec.prior_file.empty() ? fmt::format("skew {}", spec.skew) : spec.prior_file;
    fmt::print("{} R={} E={} D={} {}: {} plans{}, median {:.1f} us, p90 {:.1f} us, last mode {}\n",
               spec.planner, spec.ranks, spec.experts, spec.domain, workload, plans,
               evict_mib ? fmt::format(" ({} MiB written before each)", evict_mib) : "",
               quantile_of(us, 0.5), quantile_of(us, 0.9), w.last_plan().mode);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "feplb_planner_probe: %s\n", e.what());
    return 1;
  }
  return 0;
}
