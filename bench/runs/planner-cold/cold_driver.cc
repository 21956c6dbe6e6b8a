// Cold-cache plans of the default planner for callgrind (README.md): R E SKEW D TOUCH_MIB.
#include <valgrind/callgrind.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "feplb/core/cost_model.h"
#include "feplb/core/knobs.h"
#include "feplb/core/plan.h"
#include "feplb/core/planners/planner.h"
#include "feplb/core/stats.h"
#include "feplb/core/topology.h"
#include "feplb/sim/prior.h"
#include "feplb/sim/workload.h"
using namespace feplb;
int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: cold_driver R E SKEW D TOUCH_MIB [planner]\n");
    return 2;
  }
  const int R = std::atoi(argv[1]), E = std::atoi(argv[2]), D = std::atoi(argv[4]);
  const size_t evict_mb = std::atoi(argv[5]);
  const Prior prior = lognormal_prior(E, std::atof(argv[3]), 1, 1);
  WorkloadSpec spec;
  spec.num_ranks = R;
  spec.tokens_per_rank = 4096;
  spec.top_k = 8;
  spec.seed = 1;
  const Topology topo = Topology::contiguous(R, D, E);
  const ExpertShape shape{.hidden = 6144, .ffn = 2048, .dtype = Dtype::kBf16};
  const Knobs knobs;
  const RooflineCostModel cost(shape, knobs);
  auto planner =
      make_planner(argc > 6 ? argv[6] : "feplb", PlannerContext{topo, shape, knobs, &cost});
  Plan plan;
  std::vector<RoutingStep> steps;
  for (int i = 0; i < 36; ++i)
    steps.push_back(generate_step(prior.popularity[0], spec, i, prior.layer_ids[0]));
  for (int i = 0; i < 4; ++i) planner->observe(steps[i]);
  std::vector<char> junk(evict_mb << 20, 1);
  long sink = 0;
  std::vector<double> us;
  for (int rep = 0; rep < 2; ++rep)
    for (int i = 4; i < 36; ++i) {
      if (evict_mb) {
        for (size_t j = 0; j < junk.size(); j += 64) {
          junk[j] += 1;
          sink += junk[j];
        }
      }
      auto t0 = std::chrono::steady_clock::now();
      CALLGRIND_START_INSTRUMENTATION;
      planner->plan(steps[i], plan);
      CALLGRIND_STOP_INSTRUMENTATION;
      auto t1 = std::chrono::steady_clock::now();
      us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      planner->observe(steps[i]);
    }
  std::printf("R=%d evict %zu MB: plan median %.1f p90 %.1f us (%s) %ld\n", R, evict_mb,
              quantile_of(us, 0.5), quantile_of(us, 0.9), plan.mode.c_str(), sink & 1);
}
