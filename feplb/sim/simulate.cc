#include "feplb/sim/simulate.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>

#include "feplb/core/error.h"
#include "feplb/core/placement.h"
#include "feplb/core/planners/planner.h"
#include "feplb/core/planners/planner_clock.h"
#include "feplb/core/stats.h"

namespace feplb {

double timed_plan_us(Planner& planner, const RoutingStep& step, Plan& plan, const Knobs& knobs) {
  const bool charged = knobs.planner_time_us >= 0;
  const int64_t reps = charged ? 1 : knobs.planner_reps;
  std::vector<double> us;
  us.reserve(static_cast<size_t>(reps));
  int32_t extra = 0;  // the first run's extra plans (a later run of the same counts may make none)
  for (int64_t r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    planner.plan(step, plan);
    const auto t1 = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    if (r == 0) extra = plan.extra_plans;
  }
  plan.extra_plans = extra;
  // Each extra plan at the time of one (the later runs make none; the first run's own time also
  // holds its cold start, which a layer spends in Planner::warm before its first call).
  const double one = charged ? knobs.planner_time_us : quantile_of(std::move(us), 0.5);
  return one * (1 + extra);
}

PolicySummary summarise_steps(const std::vector<StepMetrics>& steps) {
  auto column = [&](auto field) {
    std::vector<double> v;
    v.reserve(steps.size());
    for (const StepMetrics& m : steps) v.push_back(static_cast<double>(field(m)));
    return v;
  };
  PolicySummary s;
  const auto st = column([](const StepMetrics& m) { return m.token_straggler; });
  const auto mm = column([](const StepMetrics& m) { return m.token_max_over_mean; });
  const auto sg = column([](const StepMetrics& m) { return m.gemm_straggler_ms; });
  const auto us = column([](const StepMetrics& m) { return m.planner_us; });
  s.token_straggler = mean_of(st);
  s.token_straggler_p95 = quantile_of(st, 0.95);
  s.token_max_over_mean = mean_of(mm);
  s.token_max_over_mean_p95 = quantile_of(mm, 0.95);
  s.gemm_straggler_ms = mean_of(sg);
  s.gemm_straggler_ms_p95 = quantile_of(sg, 0.95);
  s.weight_bytes_per_step = mean_of(column([](const StepMetrics& m) { return m.weight_bytes; }));
  s.token_bytes_per_step = mean_of(column([](const StepMetrics& m) { return m.token_bytes; }));
  s.guest_experts_per_step = mean_of(column([](const StepMetrics& m) { return m.guest_experts; }));
  s.nvlink_bytes_per_step = mean_of(column([](const StepMetrics& m) { return m.nvlink_bytes; }));
  s.network_bytes_per_step = mean_of(column([](const StepMetrics& m) { return m.network_bytes; }));
  s.dispatch_nvlink_bytes_per_step =
      mean_of(column([](const StepMetrics& m) { return m.dispatch_nvlink_bytes; }));
  s.dispatch_network_bytes_per_step =
      mean_of(column([](const StepMetrics& m) { return m.dispatch_network_bytes; }));
  for (const StepMetrics& m : steps) {
    s.guest_slots_max = std::max(s.guest_slots_max, static_cast<double>(m.max_guest_slots));
  }
  s.fits_static_window =
      mean_of(column([](const StepMetrics& m) { return m.fits_static_window ? 1 : 0; }));
  std::vector<double> slack;
  for (const StepMetrics& m : steps) {
    if (m.weight_bytes + m.token_bytes > 0) slack.push_back(m.window_slack_ms);
  }
  s.window_slack_ms_p5 = quantile_of(slack, 0.05);
  const auto exposed = column([](const StepMetrics& m) { return m.copy_exposed_ms; });
  s.copy_exposed_ms = mean_of(exposed);
  s.copy_exposed_ms_p95 = quantile_of(exposed, 0.95);
  s.plan_exposed_ms = mean_of(column([](const StepMetrics& m) { return m.plan_exposed_ms; }));
  const auto total_exposed = column([](const StepMetrics& m) { return m.exposed_ms(); });
  s.exposed_ms = mean_of(total_exposed);
  s.exposed_ms_p95 = quantile_of(total_exposed, 0.95);
  s.delayed_steps = mean_of(column([](const StepMetrics& m) { return m.delays_layer() ? 1 : 0; }));
  s.prefetch_bytes_per_step =
      mean_of(column([](const StepMetrics& m) { return m.prefetch_bytes; }));
  s.prefetch_wasted_bytes_per_step =
      mean_of(column([](const StepMetrics& m) { return m.prefetch_wasted_bytes; }));
  double copies = 0, hits = 0, needed = 0;
  for (const StepMetrics& m : steps) {
    copies += static_cast<double>(m.prefetch_copies);
    hits += static_cast<double>(m.prefetch_hits);
    needed += static_cast<double>(m.guest_weights_needed);
  }
  s.prefetch_hit_rate = copies > 0 ? hits / copies : 0.0;
  s.prefetch_coverage = needed > 0 ? hits / needed : 0.0;
  s.planner_us_median = quantile_of(us, 0.5);
  s.planner_us_p99 = quantile_of(us, 0.99);
  s.above_oracle_pct_of_mean = mean_of(column([](const StepMetrics& m) {
    return m.mean_rows > 0 ? (m.token_straggler - m.oracle_straggler) / m.mean_rows * 100.0 : 0.0;
  }));
  s.inter_node_floor = mean_of(column([](const StepMetrics& m) { return m.oracle_straggler; }));
  for (const StepMetrics& m : steps) {
    if (m.mode.empty()) continue;
    const auto it = std::find_if(s.modes.begin(), s.modes.end(),
                                 [&](const auto& entry) { return entry.first == m.mode; });
    if (it == s.modes.end())
      s.modes.emplace_back(m.mode, 1);
    else
      ++it->second;
  }
  return s;
}

void apply_reductions(std::vector<PolicySummary*> summaries, const PolicySummary& base) {
  for (PolicySummary* s : summaries) {
    s->token_straggler_reduction =
        base.token_straggler > 0 ? 1.0 - s->token_straggler / base.token_straggler : 0.0;
    s->gemm_straggler_reduction =
        base.gemm_straggler_ms > 0 ? 1.0 - s->gemm_straggler_ms / base.gemm_straggler_ms : 0.0;
  }
}

double SimulationResult::migration_bytes_per_step() const {
  double bytes = 0;
  for (const Replan& r : replans) bytes += static_cast<double>(r.migration.total_bytes());
  return step_ids.empty() ? 0.0 : bytes / static_cast<double>(step_ids.size());
}

const PolicyResult* SimulationResult::find(const std::string& name) const {
  for (const PolicyResult& p : policies) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

namespace {

// Runs of trace steps [first, end) planned on one placement. A walk-forward replan starts a new
// epoch; its planners first observe the replan's history [history_first, first).
struct Epoch {
  size_t first = 0, end = 0, history_first = 0;
  const Placement* placement = nullptr;  // null: contiguous homes, one planner for all layers
};

// The trace's steps with their micro-batches: micro_batch[i] = index of step i's micro-batch
// (distinct step ids, in trace order); the first warmup_steps micro-batches are history only.
struct TraceSteps {
  const Trace& trace;
  std::vector<int64_t> micro_batch;
  int64_t warmup_steps;
  TraceSteps(const Trace& t, int64_t warmup)
      : trace(t), micro_batch(t.steps.size(), 0), warmup_steps(warmup) {
    for (size_t i = 1; i < t.steps.size(); ++i) {
      micro_batch[i] = micro_batch[i - 1] + (t.steps[i].step != t.steps[i - 1].step ? 1 : 0);
    }
  }
  bool warmup(size_t i) const { return micro_batch[i] < warmup_steps; }
};

void check_config(const Trace& trace, const SimulationConfig& config) {
  validate_knobs(config.knobs);
  FEPLB_REQUIRE_INPUT(config.shape.hidden > 0 && config.shape.ffn > 0,
                      "expert shape: unknown for model '{}'; pass --hidden and --ffn", trace.model);
  FEPLB_REQUIRE_INPUT(config.warmup_steps >= 0, "--warmup: {} must be at least 0",
                      config.warmup_steps);
  FEPLB_REQUIRE_INPUT(config.replan_interval >= 0, "--walk-forward: {} must be at least 0",
                      config.replan_interval);
  FEPLB_REQUIRE_INPUT(config.replan_window >= 0, "--window: {} must be at least 0",
                      config.replan_window);
}

// The policies to run (static first, added when missing), each once; the dynamic-set knobs that
// need a placement have one.
void check_policies(std::vector<std::string>& names, const Knobs& knobs, bool placed) {
  FEPLB_REQUIRE_INPUT(!names.empty(), "policies: none given");
  for (size_t i = 0; i < names.size(); ++i) {
    FEPLB_REQUIRE_INPUT(std::count(names.begin(), names.end(), names[i]) == 1,
                        "policies: '{}' is listed twice", names[i]);
  }
  if (std::find(names.begin(), names.end(), "static") == names.end())
    names.insert(names.begin(), "static");
  const auto uses = [&](const char* name) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  FEPLB_REQUIRE_INPUT(placed || !uses("feplb") || knobs.feplb_dyn_set == 0,
                      "--feplb-dyn-set: {} needs a placement (--placement or --walk-forward)",
                      knobs.feplb_dyn_set);
  FEPLB_REQUIRE_INPUT(placed || !uses("feplb-paper") || knobs.paper_dyn_set != 2,
                      "--paper-dyn-set: 2 needs a placement (--placement or --walk-forward)");
}

// Walk-forward: the epochs between replans, each replan's placement (after the first, the
// config's or contiguous, in `placements`) and its record in `result.replans`.
std::vector<Epoch> walk_forward(const TraceSteps& ts, const SimulationConfig& config,
                                std::vector<Placement>& placements, SimulationResult& result) {
  const Trace& trace = ts.trace;
  std::vector<Epoch> epochs;
  const int64_t window = config.replan_window > 0 ? config.replan_window : config.replan_interval;
  Placer placer(trace.num_ranks, config.gpus_per_node, trace.num_experts,
                place_options(config.knobs));
  size_t start = 0, history_first = 0;
  for (size_t i = 1; i < trace.steps.size(); ++i) {
    const int64_t k = ts.micro_batch[i];
    const bool replan = k != ts.micro_batch[i - 1] && k >= config.warmup_steps &&
                        (k - config.warmup_steps) % config.replan_interval == 0;
    if (!replan) continue;
    epochs.push_back({start, i, history_first, nullptr});
    size_t first = i;
    while (first > 0 && ts.micro_batch[first - 1] >= k - window) --first;
    Replan r;
    r.micro_batch = k;
    r.history_micro_batches = k - ts.micro_batch[first];
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<LayerHistory> histories = layer_histories(trace, first, i);
    Placement next = placer.place(histories, placements.back(), &r.layers);
    r.place_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    r.migration = migration_between(placements.back(), next, config.shape,
                                    config.knobs.optimizer_bytes_per_param);
    result.replans.push_back(std::move(r));
    placements.push_back(std::move(next));
    start = i;
    history_first = first;
  }
  epochs.push_back({start, trace.steps.size(), history_first, nullptr});
  return epochs;
}

// What every policy's run shares.
struct PolicyRun {
  const TraceSteps& ts;
  const SimulationConfig& config;
  const Knobs& knobs;  // the result's (prefetch window fixed)
  const GemmCostModel& cost;
  const Topology& topo;  // contiguous homes
};

// One policy over one epoch: one planner per layer on that layer's homes, or one for every layer
// on contiguous homes; history observed, measured steps planned, checked and measured.
void run_epoch(const PolicyRun& run, const std::string& name, const Epoch& epoch, PolicyResult& pr,
               Plan& plan, const std::function<void()>& step_done) {
  const Trace& trace = run.ts.trace;
  std::vector<int64_t> layers;
  std::vector<Topology> topos;
  std::vector<std::unique_ptr<Planner>> planners;
  if (epoch.placement) {
    for (const LayerPlacement& l : epoch.placement->layers) {
      layers.push_back(l.layer);
      topos.push_back(layer_topology(*epoch.placement, l));
      planners.push_back(make_planner(
          name, PlannerContext{topos.back(), run.config.shape, run.knobs, &run.cost, l.dynamic}));
    }
  } else {
    topos.push_back(run.topo);
    planners.push_back(
        make_planner(name, PlannerContext{run.topo, run.config.shape, run.knobs, &run.cost}));
  }
  const auto slot = [&](int64_t layer) {
    if (layers.empty()) return size_t{0};
    const auto it = std::find(layers.begin(), layers.end(), layer);
    FEPLB_CHECK(it != layers.end(), "no placement for layer {}", layer);
    return static_cast<size_t>(it - layers.begin());
  };
  // Each layer's recent planner time, for its next plans, as in the GPU layer (where the reserve
  // is feplb's, its choice of mode follows this host's speed; its plans do not).
  std::map<int64_t, PlannerClock> clocks;
  pr.movement = planners.front()->data_movement();
  // A charged planner time is this host's from the start: a history is explored at it.
  const double charged_us = run.config.knobs.planner_time_us;
  for (size_t i = epoch.history_first; i < epoch.first; ++i) {
    Planner& planner = *planners[slot(trace.steps[i].layer)];
    if (charged_us > 0) planner.set_recent_plan_us(charged_us);
    planner.observe(trace.steps[i]);
  }
  for (size_t i = epoch.first; i < epoch.end; ++i) {
    const RoutingStep& step = trace.steps[i];
    const size_t k = slot(step.layer);
    Planner& planner = *planners[k];
    const Topology& topo = topos[k];
    if (!run.ts.warmup(i)) {
      PlannerClock& clock = clocks[step.layer];
      planner.set_recent_plan_us(charged_us > 0 ? charged_us : clock.recent_us());
      const double us = timed_plan_us(planner, step, plan, run.config.knobs);
      clock.add(plan.mode, us, plan.candidates);
      validate(plan, topo, step, run.config.shape, planner.limits());
      GpuLoads loads;
      pr.steps.push_back(measure_plan(plan, topo, run.cost, us, &loads));
      measure_traffic(plan, topo, step, run.config.shape, pr.steps.back());
      pr.loads.push_back(std::move(loads));
    } else if (charged_us > 0) {
      planner.set_recent_plan_us(charged_us);
    }
    planner.observe(step);
    step_done();
  }
}

}  // namespace

SimulationResult simulate(const Trace& trace, const SimulationConfig& config,
                          const Progress& progress) {
  check_config(trace, config);
  SimulationResult result(
      config, Topology::contiguous(trace.num_ranks, config.gpus_per_node, trace.num_experts));
  if (!config.placement.empty()) {
    check_placement_matches(config.placement, trace, config.gpus_per_node);
  }
  const bool placed = !config.placement.empty() || config.replan_interval > 0;
  result.model = trace.model;
  result.top_k = trace.top_k;
  result.tokens_per_rank = trace.tokens_per_rank;
  const TraceSteps ts(trace, config.warmup_steps);
  for (size_t i = 0; i < trace.steps.size(); ++i) {
    if (!ts.warmup(i)) result.step_ids.emplace_back(trace.steps[i].step, trace.steps[i].layer);
  }
  FEPLB_REQUIRE_INPUT(!result.step_ids.empty(),
                      "--warmup: {} leaves no step of the trace to measure", config.warmup_steps);
  auto& names = result.config.policies;
  check_policies(names, config.knobs, placed);

  std::vector<Placement> placements;  // one per epoch when placed
  if (placed) {
    placements.push_back(config.placement.empty()
                             ? contiguous_placement(trace.num_ranks, config.gpus_per_node,
                                                    trace.num_experts, trace_layers(trace),
                                                    config.knobs.dyn)
                             : config.placement);
  }
  std::vector<Epoch> epochs = config.replan_interval > 0
                                  ? walk_forward(ts, config, placements, result)
                                  : std::vector<Epoch>{{0, trace.steps.size(), 0, nullptr}};
  for (size_t e = 0; e < epochs.size() && placed; ++e) epochs[e].placement = &placements[e];
  if (placed) result.final_placement = placements.back();

  // The prefetch window, when derived from the layer shapes (prefetch_window_us = 0), is fixed
  // here for every planner and the metrics, and reported in the result's knobs.
  result.config.knobs.prefetch_window_us =
      prefetch_window_us(config.shape, trace.tokens_per_rank, config.knobs);
  const Knobs& knobs = result.config.knobs;
  const RooflineCostModel roofline(config.shape, config.knobs);
  const GemmCostModel& cost = config.cost ? *config.cost : roofline;
  // Unknown policies and bad planner knobs fail here, before any planning.
  for (const std::string& name : names) {
    make_planner(name, PlannerContext{result.topo, config.shape, knobs, &cost});
  }

  const int64_t total = static_cast<int64_t>(names.size() * trace.steps.size());
  int64_t done = 0;
  const auto step_done = [&] {
    if (progress) progress(++done, total);
  };
  const PolicyRun run{ts, config, knobs, cost, result.topo};
  Plan plan;
  for (const std::string& name : names) {
    PolicyResult pr;
    pr.name = name;
    for (const Epoch& epoch : epochs) run_epoch(run, name, epoch, pr, plan, step_done);
    pr.summary = summarise_steps(pr.steps);
    result.policies.push_back(std::move(pr));
  }
  const PolicySummary base = result.find("static")->summary;
  std::vector<PolicySummary*> all;
  for (PolicyResult& pr : result.policies) all.push_back(&pr.summary);
  apply_reductions(all, base);
  return result;
}

}  // namespace feplb
