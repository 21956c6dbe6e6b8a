#include "feplb/core/planners/feplb/host_time.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "feplb/core/planners/feplb/chooser.h"
#include "feplb/core/rng.h"

namespace feplb {
namespace feplb_detail {

void synthetic_totals(const Topology& topo, int64_t rows_per_rank, uint64_t seed, int64_t index,
                      std::vector<int64_t>& totals) {
  const int E = topo.num_experts();
  Rng rng(Rng::derive(seed, static_cast<uint64_t>(index)));
  std::vector<double> popularity(static_cast<size_t>(E));
  double sum = 0;
  for (double& p : popularity) {
    p = std::exp(0.8 * rng.normal());
    sum += p;
  }
  const double rows = static_cast<double>(rows_per_rank) * topo.num_ranks();
  totals.resize(static_cast<size_t>(E));
  for (size_t e = 0; e < totals.size(); ++e)
    totals[e] = static_cast<int64_t>(rows * popularity[e] / sum);
}

void synthetic_step(const Topology& topo, int64_t rows_per_rank, uint64_t seed, int64_t index,
                    RoutingStep& out) {
  const int R = topo.num_ranks(), E = topo.num_experts();
  if (out.num_ranks != R || out.num_experts != E) out = RoutingStep(index, 0, R, E);
  out.step = index;
  out.layer = index % 4;
  synthetic_totals(topo, rows_per_rank, seed, index, out.expert_counts);
  for (int e = 0; e < E; ++e) {
    const int64_t total = out.expert_counts[static_cast<size_t>(e)];
    for (int d = 0; d < R; ++d) out.at(d, e) = total / R + (d < total % R ? 1 : 0);
  }
}

}  // namespace feplb_detail

std::vector<ModeTime> FeplbChooser::measure_mode_times(int64_t rows_per_rank) const {
  if (ctx_.knobs.planner_budget_us >= 0) return {};
  using Clock = std::chrono::steady_clock;
  PlannerContext one = ctx_;
  one.knobs.planner_threads = 1;  // its plans are timed one by one, on this thread
  FeplbChooser probe(one, left_);
  // Two-phase candidates only: a one-hop plan reserves nothing (the dispatch waits for it).
  std::vector<size_t> timed;
  for (size_t m = 0; m < probe.modes_.size(); ++m) {
    if (probe.modes_[m].path == FeplbPath::kTwoPhase) timed.push_back(m);
  }
  std::vector<std::vector<double>> us(probe.modes_.size());
  // The probe's tables first cover the stream's busiest expert, as a planner's do once warm: a
  // plan that grows them is a start-up cost, not the steady state's.
  std::vector<int64_t> totals;
  int64_t most = 0;
  for (int s = 0; s < kProbeSteps; ++s) {
    feplb_detail::synthetic_totals(ctx_.topo, rows_per_rank, kProbeSeed, s, totals);
    most = std::max(most, *std::max_element(totals.begin(), totals.end()));
  }
  probe.warm(most);
  RoutingStep step;
  Plan plan;
  ScheduleWriter writer;
  for (int s = 0; s < kProbeSteps; ++s) {
    feplb_detail::synthetic_step(ctx_.topo, rows_per_rank, kProbeSeed, s, step);
    probe.layer_state(step.layer, /*planning=*/true);  // as plan() would
    for (const size_t m : timed) {
      const FeplbConfig mode = probe.mode_at(static_cast<int>(m), probe.bound_);
      const auto t0 = Clock::now();
      probe.engine_.plan_with(mode, step, plan);
      writer.write(plan, ctx_.topo, ctx_.knobs, probe.engine_.schedule_cost());
      const auto t1 = Clock::now();
      if (s >= kProbeWarmSteps)
        us[m].push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    probe.observe(step);
  }
  std::vector<ModeTime> times;
  for (const size_t m : timed) {
    std::vector<double>& t = us[m];
    std::sort(t.begin(), t.end());
    const auto at = [&](double q) {
      const auto i = static_cast<size_t>(std::ceil(q * static_cast<double>(t.size()))) - 1;
      return t[std::min(i, t.size() - 1)];
    };
    times.push_back({probe.labels_[m], at(0.90), at(0.99)});
  }
  return times;
}

void FeplbChooser::warm(int64_t max_expert_rows) {
  for (const FeplbConfig& mode : modes_) {
    engine_.warm(mode, max_expert_rows);
    for (auto& lane : lanes_) lane->engine->warm(mode, max_expert_rows);
  }
}

void FeplbChooser::set_host_times(std::span<const ModeTime> times) {
  if (ctx_.knobs.planner_budget_us >= 0) return;
  for (const ModeTime& t : times) {
    for (size_t m = 0; m < modes_.size(); ++m) {
      if (labels_[m] == t.mode && modes_[m].path == FeplbPath::kTwoPhase)
        host_scale_ = std::max(host_scale_, t.us / charged_us(static_cast<int>(m)));
    }
  }
}

}  // namespace feplb
