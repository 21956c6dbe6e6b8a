// Smoke test: the bundled default trace plans and validates under every policy.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace feplb
