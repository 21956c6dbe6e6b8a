// Helpers shared by the CPU tests: small routing steps and planner contexts.
#pragma once

#include <memory>
#include <vector>

#include "feplb/core/copy_links.h"
#include "feplb/core/cost_model.h"
#include "feplb/core/planners/feplb/fixed_mode.h"
#include "feplb/core/planners/planner.h"
#include "feplb/sim/prior.h"
#include "feplb/sim/workload.h"

namespace feplb::testing {

inline ExpertShape glm5() { return ExpertShape{6144, 2048, Dtype::kBf16}; }

// A step from explicit per-source counts ([R][E]).
inline RoutingStep step_from(const std::vector<std::vector<int64_t>>& counts, int64_t layer = 0) {
  RoutingStep s(0, layer, static_cast<int>(counts.size()), static_cast<int>(counts[0].size()));
  for (size_t r = 0; r < counts.size(); ++r) {
    for (size_t e = 0; e < counts[r].size(); ++e)
      s.at(static_cast<int>(r), static_cast<int>(e)) = counts[r][e];
  }
  s.sum_experts();
  return s;
}

// Knobs with every switch of feplb's mode set, to one mode: two-phase, no prefetch, rows, hidden
// copies, 20 us reserved for the planner (the defaults before feplb chose its own mode). Tests of
// one mode's behaviour start from these; Knobs{} leaves the mode to feplb's chooser.
inline Knobs explicit_knobs() { return fixed_mode_knobs(); }

// Writes the schedule of a plan made by hand (explicit_knobs(), GLM-5 experts on the roofline), as
// a planner writes its plans': the metrics and the GPU layer refuse a plan without one.
inline void write_schedule(Plan& plan, const Topology& topo) {
  const Knobs k = explicit_knobs();
  ScheduleWriter().write(plan, topo, k, RooflineCostModel(glm5(), k));
}

// feplb's one hop refined from the previous micro-batch (one_hop_refine), late copies, with a
// prefetch window of 500 us.
inline Knobs refined_one_hop_knobs() {
  Knobs k = explicit_knobs();
  k.one_hop = 1;
  k.one_hop_refine = 1;
  k.copy_timing = 3;
  k.prefetch_window_us = 500;
  return k;
}

// Owns a cost model and builds planners over one topology (by default in one explicit mode).
struct Bench {
  Bench(int ranks, int gpus_per_node, int experts, Knobs k = explicit_knobs(),
        ExpertShape s = glm5())
      : topo(Topology::contiguous(ranks, gpus_per_node, experts)),
        shape(s),
        knobs(k),
        cost(std::make_unique<RooflineCostModel>(s, k)) {}
  std::unique_ptr<Planner> make(const std::string& name) const {
    return make_planner(name, PlannerContext{topo, shape, knobs, cost.get()});
  }
  Topology topo;
  ExpertShape shape;
  Knobs knobs;
  std::unique_ptr<RooflineCostModel> cost;
};

// A realistic step: lognormal popularity with the given skew, drawn by the generator.
inline RoutingStep random_step(int ranks, int experts, int top_k, int64_t tokens, double skew,
                               uint64_t seed, double concentration = 300) {
  const Prior p = lognormal_prior(experts, skew, 1, seed);
  WorkloadSpec spec;
  spec.num_ranks = ranks;
  spec.top_k = top_k;
  spec.tokens_per_rank = tokens;
  spec.seq_len = std::max<int64_t>(1, tokens / 2);
  spec.concentration = concentration;
  spec.seed = seed;
  return generate_step(p.popularity[0], spec, static_cast<int64_t>(seed), 0);
}

inline std::vector<int64_t> rows_per_gpu(const Plan& plan, int ranks) {
  std::vector<int64_t> rows(static_cast<size_t>(ranks), 0);
  for (const Slice& s : plan.slices) rows[s.gpu] += s.rows;
  return rows;
}

}  // namespace feplb::testing
