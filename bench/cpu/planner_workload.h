// The planner probes' workload (feplb_planner_probe, feplb_planner_ab): a planner for R GPUs in
// NVLink domains of D, E experts of GLM-5's shape (H 6144, F 2048, bf16, roofline costs), and 36
// micro-batches of one layer (4,096 tokens per GPU, top-8) from a lognormal prior of max/mean
// SKEW or a prior file. The first 4 are observed (none with `cold`: the next plan is the planner's
// first); plans then cycle over the other 32, each observed after it is planned, as the GPU layer
// uses its planner.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "feplb/core/cost_model.h"
#include "feplb/core/knobs.h"
#include "feplb/core/plan.h"
#include "feplb/core/planners/planner.h"
#include "feplb/core/topology.h"
#include "feplb/sim/prior.h"
#include "feplb/sim/workload.h"

namespace feplb::bench {

struct ProbeSpec {
  int ranks = 8, experts = 128, domain = 8;
  double skew = 5;  // lognormal max/mean (unused with a prior file)
  std::string
      prior_file;  // a prior JSON (its first layer, expanded to `experts`); empty: lognormal
  std::string planner = "feplb";
  std::vector<KnobOverride> knobs;  // --knob NAME=VALUE: e.g. an explicit mode of feplb's
};

class ProbeWorkload {
 public:
  static constexpr int kObserved = 4, kSteps = 36;

  explicit ProbeWorkload(const ProbeSpec& s, bool cold = false)
      : topo_(Topology::contiguous(s.ranks, s.domain, s.experts)), cost_(shape_, knobs_) {
    const Prior prior = s.prior_file.empty() ? lognormal_prior(s.experts, s.skew, 1, 1)
                                             : expand_prior(read_prior(s.prior_file), s.experts, 1);
    WorkloadSpec spec;
    spec.num_ranks = s.ranks;
    spec.tokens_per_rank = 4096;
    spec.top_k = 8;
    spec.seed = 1;
    apply_knobs(knobs_, s.knobs);  // before the planner reads them (the cost model's are set)
    planner_ = make_planner(s.planner, PlannerContext{topo_, shape_, knobs_, &cost_});
    for (int i = 0; i < kSteps; ++i)
      steps_.push_back(generate_step(prior.popularity[0], spec, i, prior.layer_ids[0]));
    if (!cold) {
      for (int i = 0; i < kObserved; ++i) planner_->observe(steps_[static_cast<size_t>(i)]);
    }
  }

  // The next micro-batch's plan() (timed by `around`, called with the call inside), then its
  // observe().
  template <typename Around>
  void plan_next(Around&& around) {
    const RoutingStep& step = steps_[next_];
    around([&] { planner_->plan(step, plan_); });
    planner_->observe(step);
    if (++next_ == steps_.size()) next_ = kObserved;
  }
  // As plan_next(), the micro-batch's counts given to a layer never seen before (`layer`): that
  // layer's first plan.
  template <typename Around>
  void plan_new_layer(int64_t layer, Around&& around) {
    RoutingStep step = steps_[next_];
    step.layer = layer;
    around([&] { planner_->plan(step, plan_); });
    planner_->observe(step);
    if (++next_ == steps_.size()) next_ = kObserved;
  }
  const Plan& last_plan() const { return plan_; }

 private:
  Topology topo_;
  ExpertShape shape_{.hidden = 6144, .ffn = 2048, .dtype = Dtype::kBf16};
  Knobs knobs_;
  RooflineCostModel cost_;
  std::unique_ptr<Planner> planner_;
  std::vector<RoutingStep> steps_;
  Plan plan_;
  size_t next_ = kObserved;
};

}  // namespace feplb::bench
