// One side of an in-process A/B (ab_main.cc): built once against each build of the core, loaded
// by ab_main into a link namespace of its own (dlmopen), so both builds plan in one process, in
// turn, on the same core and in the same state of the machine.
// plans_us(R, E, skew, D, plans, out): the default planner on cold_driver's workload (R GPUs, E
// experts, lognormal skew, domains of D), `plans` plan() calls cycling over 32 micro-batches, each
// after observe() of the one before; each call's time into out[]. The workload is made on the first
// call for an (R, E) and kept.
#include <chrono>
#include <map>
#include <memory>
#include <vector>

#include "feplb/core/cost_model.h"
#include "feplb/core/knobs.h"
#include "feplb/core/plan.h"
#include "feplb/core/planners/planner.h"
#include "feplb/core/topology.h"
#include "feplb/sim/prior.h"
#include "feplb/sim/workload.h"
using namespace feplb;

namespace {
struct Setup {
  Topology topo;
  ExpertShape shape{.hidden = 6144, .ffn = 2048, .dtype = Dtype::kBf16};
  Knobs knobs;
  std::unique_ptr<RooflineCostModel> cost;
  std::unique_ptr<Planner> planner;
  std::vector<RoutingStep> steps;
  Plan plan;
  size_t next = 4;
};
std::map<std::pair<int, int>, std::unique_ptr<Setup>> setups;
}  // namespace

extern "C" void plans_us(int R, int E, double skew, int D, int plans, double* out) {
  auto& s = setups[{R, E}];
  if (!s) {
    const Prior prior = lognormal_prior(E, skew, 1, 1);
    WorkloadSpec spec;
    spec.num_ranks = R;
    spec.tokens_per_rank = 4096;
    spec.top_k = 8;
    spec.seed = 1;
    s.reset(new Setup{Topology::contiguous(R, D, E)});
    s->cost = std::make_unique<RooflineCostModel>(s->shape, s->knobs);
    s->planner = make_planner("feplb", PlannerContext{s->topo, s->shape, s->knobs, s->cost.get()});
    for (int i = 0; i < 36; ++i)
      s->steps.push_back(generate_step(prior.popularity[0], spec, i, prior.layer_ids[0]));
    for (int i = 0; i < 4; ++i) s->planner->observe(s->steps[i]);
  }
  for (int c = 0; c < plans; ++c) {
    const RoutingStep& step = s->steps[s->next];
    const auto t0 = std::chrono::steady_clock::now();
    s->planner->plan(step, s->plan);
    const auto t1 = std::chrono::steady_clock::now();
    out[c] = std::chrono::duration<double, std::micro>(t1 - t0).count();
    s->planner->observe(step);
    if (++s->next == s->steps.size()) s->next = 4;
  }
}
