// Smoke test: the bundled default trace plans and validates under every policy; the simulator
// feeds the default's chooser its layers' planner time, as the GPU layer does.
#include <gtest/gtest.h>

#include <string>

#include "feplb/core/cost_model.h"
#include "feplb/core/planners/planner.h"
#include "feplb/core/trace_io.h"
#include "feplb/sim/simulate.h"

namespace feplb {
namespace {

TEST(Smoke, DefaultTraceSimulatesUnderEveryPolicy) {
  const Trace trace = read_trace(std::string(FEPLB_DATA_DIR) + "/traces/default.json");
  SimulationConfig cfg;
  cfg.policies = planner_names();
  cfg.shape = *trace.expert_shape;
  cfg.knobs.planner_reps = 1;
  const SimulationResult r = simulate(trace, cfg);
  ASSERT_EQ(r.policies.size(), cfg.policies.size());
  for (const PolicyResult& p : r.policies) EXPECT_EQ(p.steps.size(), trace.steps.size()) << p.name;
}

// Steps whose plan's mode balances rows alone (the chooser's labels say "rows").
int64_t rows_mode_steps(const SimulationResult& r) {
  int64_t n = 0;
  for (const StepMetrics& m : r.find("feplb")->steps) {
    EXPECT_FALSE(m.mode.empty());
    n += m.mode.find(", rows,") != std::string::npos;
  }
  return n;
}

// The bundled trace with the default policy alone and the measured H200 table, every plan
// charged `planner_us` (--planner-time-us).
SimulationResult default_policy_charged(double planner_us, int64_t planner_threads = 4) {
  const Trace trace = read_trace(std::string(FEPLB_DATA_DIR) + "/traces/default.json");
  const TableCostModel table =
      read_gemm_table(std::string(FEPLB_DATA_DIR) + "/cost/h200-glm5.json");
  SimulationConfig cfg;
  cfg.policies = {"feplb"};
  cfg.shape = *trace.expert_shape;
  cfg.cost = &table;
  cfg.knobs.planner_time_us = planner_us;
  cfg.knobs.planner_threads = planner_threads;
  return simulate(trace, cfg);
}

// With every plan charged 10 ms (--planner-time-us), the layer's clock tells its chooser that
// the host is hundreds of times slower than its rule's reserve: the time modes' copies (40 us
// reserved) then land later than the rows modes' (20 us), and it moves to rows. At 0 us (or
// without the clock) it balances time on this trace in every step. The choice is the clock's:
// the chooser reads no other knob of the charged time.
TEST(Smoke, TheSimulatorTellsTheDefaultItsLayersPlannerTime) {
  const SimulationResult fast = default_policy_charged(0);
  const SimulationResult slow = default_policy_charged(10000);
  EXPECT_EQ(rows_mode_steps(fast), 0);
  EXPECT_GT(rows_mode_steps(slow), static_cast<int64_t>(slow.find("feplb")->steps.size()) / 2);
  // What it pays for that choice is charged: every plan's 10 ms delays its copies.
  EXPECT_EQ(fast.find("feplb")->summary.exposed_ms, 0.0);
  EXPECT_GT(slow.find("feplb")->summary.exposed_ms, 1.0);
}

// A charged planner time is charged once per plan made in series on the counts: with one
// planner thread the chooser's first plan, which plans two candidates, is charged twice, the
// later plans once; with four, every layer's first plan (four candidates side by side) once.
TEST(Smoke, AChargedPlannerTimeCountsThePlansAPlanTook) {
  const SimulationResult one = default_policy_charged(30, 1);
  const std::vector<StepMetrics>& steps = one.find("feplb")->steps;
  ASSERT_GT(steps.size(), 2u);
  EXPECT_EQ(steps[0].planner_us, 60.0);
  for (size_t i = 1; i < steps.size(); ++i) EXPECT_EQ(steps[i].planner_us, 30.0) << "step " << i;
  const SimulationResult four = default_policy_charged(30, 4);
  for (const StepMetrics& m : four.find("feplb")->steps) EXPECT_EQ(m.planner_us, 30.0);
}

}  // namespace
}  // namespace feplb
