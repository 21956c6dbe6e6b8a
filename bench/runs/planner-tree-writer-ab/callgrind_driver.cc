// Counts the instructions of the default feplb planner's plan() calls with callgrind: the planner
// benchmark's workload for R ranks, E experts, lognormal max/mean SKEW (or the OLMoE prior) in
// NVLink domains of D GPUs; 4 micro-batches observed, 32 planned once untimed, then three times
// between CALLGRIND_START/STOP_INSTRUMENTATION. Built and run by run.sh.
//   callgrind_driver R E SKEW D [olmoe]
#include <valgrind/callgrind.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "feplb/core/cost_model.h"
#include "feplb/core/knobs.h"
#include "feplb/core/plan.h"
#include "feplb/core/planners/planner.h"
#include "feplb/core/topology.h"
#include "feplb/sim/prior.h"
#include "feplb/sim/workload.h"

int main(int argc, char** argv) {
  using namespace feplb;
  if (argc < 5) {
    std::fprintf(stderr, "usage: callgrind_driver R E SKEW D [olmoe]\n");
    return 2;
  }
  const int R = std::atoi(argv[1]), E = std::atoi(argv[2]), D = std::atoi(argv[4]);
  const double skew = std::atof(argv[3]);
  const bool olmoe = argc > 5 && std::string(argv[5]) == "olmoe";
  const Prior prior =
      olmoe ? expand_prior(read_prior(FEPLB_DATA_DIR "/priors/olmoe-1b-7b__olmoe-repo__arxiv.json"),
                           E, 1)
            : lognormal_prior(E, skew, 1, 1);
  WorkloadSpec spec;
  spec.num_ranks = R;
  spec.tokens_per_rank = 4096;
  spec.top_k = 8;
  spec.seed = 1;
  const Topology topo = Topology::contiguous(R, D, E);
  const ExpertShape shape{.hidden = 6144, .ffn = 2048, .dtype = Dtype::kBf16};
  const Knobs knobs;
  const RooflineCostModel cost(shape, knobs);
  auto planner = make_planner("feplb", PlannerContext{topo, shape, knobs, &cost});
  const int L = prior.num_layers();
  for (int mb = 0; mb < 4; ++mb) {
    for (int l = 0; l < L; ++l)
      planner->observe(generate_step(prior.popularity[l], spec, mb, prior.layer_ids[l]));
  }
  std::vector<RoutingStep> steps;
  for (int i = 0; i < 32; ++i)
    steps.push_back(
        generate_step(prior.popularity[i % L], spec, 4 + i / L, prior.layer_ids[i % L]));
  Plan plan;
  for (const RoutingStep& s : steps) planner->plan(s, plan);
  CALLGRIND_START_INSTRUMENTATION;
  for (int rep = 0; rep < 3; ++rep) {
    for (const RoutingStep& s : steps) planner->plan(s, plan);
  }
  CALLGRIND_STOP_INSTRUMENTATION;
  std::printf("%s\n", plan.mode.c_str());
  return 0;
}
