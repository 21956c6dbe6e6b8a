#include "feplb/core/simulate.h"

#include <algorithm>
#include <chrono>

#include "feplb/core/error.h"
#include "feplb/core/planners/planner.h"
#include "feplb/core/stats.h"

namespace feplb {
namespace {

double time_plan_us(Planner& planner, const RoutingStep& step, Plan& plan, int64_t reps) {
  std::vector<double> us;
  us.reserve(static_cast<size_t>(reps));
  for (int64_t r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    planner.plan(step, plan);
    const auto t1 = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  return quantile_of(std::move(us), 0.5);
}

}  // namespace

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
  s.fits_static_window = mean_of(column([](const StepMetrics& m) { return m.fits_static_window ? 1 : 0; }));
  std::vector<double> slack;
  for (const StepMetrics& m : steps) {
    if (m.weight_bytes + m.token_bytes > 0) slack.push_back(m.window_slack_ms);
  }
  s.window_slack_ms_p5 = quantile_of(slack, 0.05);
  const auto exposed = column([](const StepMetrics& m) { return m.copy_exposed_ms; });
  s.copy_exposed_ms = mean_of(exposed);
  s.copy_exposed_ms_p95 = quantile_of(exposed, 0.95);
  s.planner_us_median = quantile_of(us, 0.5);
  s.planner_us_p99 = quantile_of(us, 0.99);
  s.above_oracle_pct_of_mean = mean_of(column([](const StepMetrics& m) {
    return m.mean_rows > 0 ? (m.token_straggler - m.oracle_straggler) / m.mean_rows * 100.0 : 0.0;
  }));
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

const PolicyResult* SimulationResult::find(const std::string& name) const {
  for (const PolicyResult& p : policies) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

SimulationResult simulate(const Trace& trace, const SimulationConfig& config, const Progress& progress) {
  validate_knobs(config.knobs);
  FEPLB_REQUIRE_INPUT(config.shape.hidden > 0 && config.shape.ffn > 0,
                      "expert shape: unknown for model '{}'; pass --hidden and --ffn", trace.model);
  FEPLB_REQUIRE_INPUT(config.warmup_steps >= 0, "--warmup: {} must be at least 0",
                      config.warmup_steps);
  SimulationResult result(
      config,
      config.placement.empty()
          ? Topology::contiguous(trace.num_ranks, config.gpus_per_node, trace.num_experts)
          : Topology::with_placement(trace.num_ranks, config.gpus_per_node, config.placement));
  FEPLB_REQUIRE_INPUT(result.topo.num_experts() == trace.num_experts,
                      "placement: {} experts, the trace has {}", result.topo.num_experts(),
                      trace.num_experts);
  result.model = trace.model;
  result.top_k = trace.top_k;
  result.tokens_per_rank = trace.tokens_per_rank;
  // warmup[i]: trace step i is history only (one of the first warmup_steps distinct step ids).
  std::vector<uint8_t> warmup(trace.steps.size(), 0);
  int64_t distinct = 0;
  for (size_t i = 0; i < trace.steps.size(); ++i) {
    if (i == 0 || trace.steps[i].step != trace.steps[i - 1].step) ++distinct;
    warmup[i] = distinct <= config.warmup_steps ? 1 : 0;
  }
  for (size_t i = 0; i < trace.steps.size(); ++i) {
    if (!warmup[i]) result.step_ids.emplace_back(trace.steps[i].step, trace.steps[i].layer);
  }
  FEPLB_REQUIRE_INPUT(!result.step_ids.empty(),
                      "--warmup: {} leaves no step of the trace to measure", config.warmup_steps);
  auto& names = result.config.policies;
  FEPLB_REQUIRE_INPUT(!names.empty(), "policies: none given");
  for (size_t i = 0; i < names.size(); ++i) {
    FEPLB_REQUIRE_INPUT(std::count(names.begin(), names.end(), names[i]) == 1,
                        "policies: '{}' is listed twice", names[i]);
  }
  if (std::find(names.begin(), names.end(), "static") == names.end()) names.insert(names.begin(), "static");

  const RooflineCostModel roofline(config.shape, config.knobs);
  const GemmCostModel& cost = config.cost ? *config.cost : roofline;
  const PlannerContext ctx{result.topo, config.shape, config.knobs, &cost};
  std::vector<std::unique_ptr<Planner>> planners;
  for (const std::string& name : names) planners.push_back(make_planner(name, ctx));  // checks names

  const int64_t total = static_cast<int64_t>(names.size() * trace.steps.size());
  int64_t done = 0;
  Plan plan;
  for (size_t p = 0; p < planners.size(); ++p) {
    Planner& planner = *planners[p];
    PolicyResult pr;
    pr.name = names[p];
    pr.transport = planner.transport();
    for (size_t i = 0; i < trace.steps.size(); ++i) {
      const RoutingStep& step = trace.steps[i];
      if (!warmup[i]) {
        const double us = time_plan_us(planner, step, plan, config.knobs.planner_reps);
        validate(plan, result.topo, step, config.shape, planner.limits());
        GpuLoads loads;
        pr.steps.push_back(measure_plan(plan, result.topo, cost, config.knobs, us, &loads));
        measure_traffic(plan, result.topo, step, config.shape, pr.steps.back());
        pr.loads.push_back(std::move(loads));
      }
      planner.observe(step);
      if (progress) progress(++done, total);
    }
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
