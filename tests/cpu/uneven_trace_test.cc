// Traces whose ranks have different token counts and drop rows (capacity factor; "tokens" and
// "dropped" in docs/trace-format.md): every policy plans them, every plan validates, and the
// metrics follow the rows actually routed.
#include <gtest/gtest.h>

#include <numeric>

#include "feplb/core/planners/planner.h"
#include "feplb/core/trace_io.h"
#include "feplb/sim/simulate.h"
#include "test_util.h"

namespace feplb {
namespace {

// A generated trace, then each step's ranks thinned: rank src keeps (src + 1) / R of its tokens'
// rows scaled down, and rank 0 drops a tenth of what it keeps (a capacity factor).
Trace uneven_trace() {
  const Prior p = lognormal_prior(64, 4.0, 2, 7);
  WorkloadSpec spec;
  spec.num_ranks = 8;
  spec.top_k = 8;
  spec.tokens_per_rank = 4096;
  spec.seq_len = 1024;
  spec.num_steps = 3;
  Trace t = generate_trace(p, spec);
  t.model = "glm5-test";
  for (RoutingStep& s : t.steps) {
    s.tokens.assign(static_cast<size_t>(t.num_ranks), t.tokens_per_rank);
    s.dropped.assign(static_cast<size_t>(t.num_ranks), 0);
    for (int src = 0; src < t.num_ranks; ++src) {
      // A rank with fewer tokens: keep every other row of each expert (rounded down), and call
      // the rest dropped; tokens stay S so every count is within them.
      if (src % 2 == 1) {
        int64_t kept = 0;
        for (int e = 0; e < t.num_experts; ++e) {
          s.at(src, e) /= 2;
          kept += s.at(src, e);
        }
        s.dropped[static_cast<size_t>(src)] = t.tokens_per_rank * t.top_k - kept;
      }
    }
    s.sum_experts();
  }
  return t;
}

TEST(UnevenTrace, IsValidAndRoundTrips) {
  const Trace t = uneven_trace();
  const Trace back = parse_trace(format_trace(t));
  ASSERT_EQ(back.steps.size(), t.steps.size());
  for (size_t i = 0; i < t.steps.size(); ++i) {
    EXPECT_EQ(back.steps[i].counts, t.steps[i].counts);
    EXPECT_EQ(back.steps[i].dropped, t.steps[i].dropped);
    for (int src = 0; src < t.num_ranks; ++src) {
      const auto row = back.steps[i].row(src);
      EXPECT_EQ(std::accumulate(row.begin(), row.end(), int64_t{0}),
                back.rows_of(back.steps[i], src));
    }
  }
  EXPECT_FALSE(back.uniform());
}

TEST(UnevenTrace, EveryPolicySimulatesItOnTheRowsRouted) {
  const Trace t = uneven_trace();
  SimulationConfig cfg;
  cfg.policies = planner_names();
  cfg.gpus_per_node = 8;
  cfg.shape = testing::glm5();
  const SimulationResult r = simulate(t, cfg);  // validates every plan
  ASSERT_EQ(r.policies.size(), planner_names().size());
  for (size_t i = 0; i < r.step_ids.size(); ++i) {
    const RoutingStep& s = t.steps[i];
    const double mean = static_cast<double>(s.total_rows()) / t.num_ranks;
    for (const PolicyResult& p : r.policies) {
      EXPECT_DOUBLE_EQ(p.steps[i].mean_rows, mean) << p.name << " step " << i;
    }
    // Fewer rows than S*K per rank: the mean is below it.
    EXPECT_LT(mean, static_cast<double>(t.tokens_per_rank * t.top_k));
  }
  // One node: the oracle balances exactly what was routed.
  EXPECT_LT(r.find("oracle")->summary.token_straggler, 1.0);
  EXPECT_GT(r.find("static")->summary.token_straggler, r.find("feplb")->summary.token_straggler);
}

}  // namespace
}  // namespace feplb
