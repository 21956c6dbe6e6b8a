// The plan's schedule (Plan::schedule): written once by the planner (ScheduleWriter), read by the
// metrics and the GPU layer. Hand examples with the copy model's times worked out here.
#include "feplb/core/schedule.h"

#include <gtest/gtest.h>

#include <cmath>

#include "feplb/core/copy_links.h"
#include "feplb/core/errors.h"
#include "feplb/core/metrics.h"
#include "test_util.h"

namespace feplb {
namespace {

using testing::glm5;
using testing::step_from;

// EP=4, 2 experts per GPU. GPU 0 sends expert 0 to GPU 3 and expert 1 to GPU 1; GPU 2 sends
// expert 4 to GPU 3. GPU 0's egress runs its copies in plan order (to 3, then to 1); GPU 3's
// ingress takes GPU 2's copy once GPU 0's is done.
struct ThreeMigrations {
  Topology topo = Topology::contiguous(4, 8, 8);
  RoutingStep routing = step_from({{3000, 2000, 10, 10, 2500, 10, 10, 10},
                                   {0, 0, 10, 10, 0, 10, 10, 10},
                                   {0, 0, 10, 10, 0, 10, 10, 10},
                                   {0, 0, 10, 10, 0, 10, 10, 10}});
  Knobs knobs = testing::explicit_knobs();
  RooflineCostModel cost{glm5(), knobs};
  Plan plan;

  ThreeMigrations() {
    plan.clear(8);
    plan.add_migration(0, 0, 3, 1000, glm5());
    plan.add_migration(1, 0, 1, 800, glm5());
    plan.add_migration(4, 2, 3, 600, glm5());
    plan.add_home_slices(topo, routing, {1000, 800, 0, 0, 600, 0, 0, 0});
  }
  // The link time of a migration's weights + rows, as the copy model adds them.
  double migration_ms(int64_t rows) const {
    return link_ms(glm5().weight_bytes(), knobs.copy_gbps, knobs.copy_setup_us) +
           link_ms(rows * glm5().row_bytes(), knobs.copy_gbps, knobs.copy_setup_us);
  }
};

TEST(Schedule, TurnsRunInLandingOrderWithTheirWaits) {
  ThreeMigrations x;
  ScheduleWriter().write(x.plan, x.topo, x.knobs, x.cost);
  const Schedule& s = x.plan.schedule;
  ASSERT_TRUE(s.written(x.plan.copies.size(), 4));
  const double start = x.knobs.planner_budget_us * 1e-3;
  EXPECT_DOUBLE_EQ(s.copy_start_ms, start);
  const double to3 = start + x.migration_ms(1000);  // GPU 0 -> 3 lands
  const double to1 = to3 + x.migration_ms(800);     // then GPU 0 -> 1 on the same egress
  const double from2 = to3 + x.migration_ms(600);   // GPU 2 -> 3 waits for GPU 3's ingress
  // GPU 3: own work (its experts 6, 7: 40 rows each), then GPU 0's guests, then GPU 2's.
  const auto turns3 = s.turns_of(3);
  ASSERT_EQ(turns3.size(), 2u);
  EXPECT_EQ(turns3[0].owner, 0);
  EXPECT_EQ(turns3[1].owner, 2);
  EXPECT_NEAR(turns3[0].lands_ms, to3, 1e-12);
  EXPECT_NEAR(turns3[1].lands_ms, from2, 1e-12);
  const double own3 = x.cost.expert_ms(40) + x.cost.expert_ms(40);
  EXPECT_NEAR(s.own_ms[3], own3, 1e-12);
  EXPECT_NEAR(turns3[0].gemm_ms, x.cost.expert_ms(1000), 1e-12);
  EXPECT_NEAR(turns3[0].wait_ms, to3 - own3, 1e-12);  // own work is far shorter than the copy
  const double after0 = to3 + x.cost.expert_ms(1000);
  EXPECT_NEAR(turns3[1].wait_ms, std::max(0.0, from2 - after0), 1e-12);
  ASSERT_EQ(s.turns_of(1).size(), 1u);
  EXPECT_NEAR(s.turns_of(1)[0].lands_ms, to1, 1e-12);
  EXPECT_TRUE(s.turns_of(0).empty());
  EXPECT_TRUE(s.turns_of(2).empty());
  // Helpers in issue order: GPU 0 sends to 3 first, then 1.
  EXPECT_EQ(std::vector<int>(s.helpers_of(0).begin(), s.helpers_of(0).end()),
            (std::vector<int>{3, 1}));
  EXPECT_EQ(std::vector<int>(s.helpers_of(2).begin(), s.helpers_of(2).end()),
            (std::vector<int>{3}));
  EXPECT_TRUE(s.helpers_of(3).empty());
  // The timeline: GPU 3 finishes after both turns; copies landing 1 ms later finish 1 ms later.
  const Schedule::Timeline t = s.timeline(3);
  EXPECT_NEAR(t.finish_ms, std::max(after0, from2) + x.cost.expert_ms(600), 1e-12);
  EXPECT_NEAR(t.slack_ms, std::min(own3 - to3, after0 - from2), 1e-12);
  EXPECT_NEAR(s.timeline(3, 1.0).finish_ms, t.finish_ms + 1.0, 1e-9);
  // A GPU with no guests finishes with its own work and waits for nothing.
  EXPECT_NEAR(s.timeline(2).finish_ms, s.own_ms[2], 1e-12);
  EXPECT_TRUE(std::isinf(s.timeline(2).slack_ms));
}

// Guests whose inputs need no phase-2 copy (weights prefetched, rows dispatched in one hop) are
// ready work, run after the GPU's own once the prefetches landed; no turn waits for them.
TEST(Schedule, PrefetchedOneHopGuestsAreReadyWork) {
  const Topology topo = Topology::contiguous(2, 8, 4);
  const RoutingStep s = step_from({{4000, 0, 1, 0}, {4000, 0, 1, 0}});
  Knobs k = testing::explicit_knobs();
  k.prefetch_window_us = 1000;
  const RooflineCostModel cost(glm5(), k);
  Plan plan;
  plan.clear(4);
  plan.planned_before_dispatch = true;
  plan.add_prefetch(0, 0, 1, glm5());
  plan.add_migration(0, 0, 1, 4000, glm5(), /*weights_prefetched=*/true, /*one_hop=*/true);
  plan.add_home_slices(topo, s, {4000, 0, 0, 0});
  ScheduleWriter().write(plan, topo, k, cost);
  const Schedule& sch = plan.schedule;
  EXPECT_DOUBLE_EQ(sch.copy_start_ms, 0.0);
  EXPECT_TRUE(sch.turns_of(1).empty());
  EXPECT_NEAR(sch.ready_ms[1], cost.expert_ms(4000), 1e-12);
  EXPECT_NEAR(sch.own_ms[1], cost.expert_ms(2), 1e-12);
  // The prefetch ran from -1 ms on free links and landed before the GEMMs started.
  EXPECT_LT(sch.prefetch_ms[1], 0.0);
  EXPECT_NEAR(sch.timeline(1).finish_ms, sch.own_ms[1] + sch.ready_ms[1], 1e-12);
  EXPECT_TRUE(sch.helpers_of(0).empty());  // no phase-2 copy
}

// Every planner's plan() writes the schedule, the metrics read it and refuse a plan without one,
// and writing it again gives the same numbers bit for bit.
TEST(Schedule, EveryPlannerWritesItAndTheMetricsReadIt) {
  const testing::Bench b(8, 8, 64);
  for (const std::string& name : planner_names()) {
    auto planner = b.make(name);
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      const RoutingStep step = testing::random_step(8, 64, 8, 2048, 4.0, seed);
      Plan plan;
      planner->plan(step, plan);
      ASSERT_TRUE(plan.schedule.written(plan.copies.size(), 8)) << name;
      const StepMetrics m = measure_plan(plan, b.topo, *b.cost, 7.0);
      EXPECT_GE(m.gemm_straggler_ms, 0.0) << name;
      Plan bare = plan;
      bare.schedule.clear();
      EXPECT_THROW(measure_plan(bare, b.topo, *b.cost, 7.0), InputError) << name;
      planner->write_schedule(bare);
      EXPECT_TRUE(bare.schedule == plan.schedule) << name;
      planner->observe(step);
    }
  }
}

// The cases no planner of the bench makes often: a guest whose weights came from a GPU other than
// its owner waits for nothing of its owner's (its turn lands at kNever, first); three guests of
// one owner on one GPU are one turn, their GEMM times summed in plan order. EP=3, 3 experts per
// GPU.
TEST(Schedule, GuestsCopiedByAnotherGpuAndThreeGuestsOfOneOwner) {
  const Topology topo = Topology::contiguous(3, 8, 9);
  const Knobs knobs = testing::explicit_knobs();
  const RooflineCostModel cost{glm5(), knobs};
  Plan plan;
  plan.clear(9);
  for (int e : {3, 4, 5}) plan.add_migration(e, 1, 0, 100 * e, glm5());  // owner 1's, on GPU 0
  plan.slices.push_back({0, 2, 50, RowSource::kHome});  // expert 0 (GPU 0's) on GPU 2 ...
  plan.copies.push_back({CopyKind::kWeights, 0, 1, 2, 0, glm5().weight_bytes()});  // from GPU 1
  plan.slices.push_back({7, 2, 10, RowSource::kHome});                             // GPU 2's own
  ScheduleWriter().write(plan, topo, knobs, cost);
  const Schedule& s = plan.schedule;
  ASSERT_TRUE(s.written(plan.copies.size(), 3));
  double lands = Schedule::kNever;  // owner 1's last phase-2 copy into GPU 0
  for (size_t i = 0; i < plan.copies.size(); ++i) {
    const Copy& c = plan.copies[i];
    if (c.src_gpu == 1 && c.dst_gpu == 0 && s.copies[i].timed)
      lands = std::max(lands, s.copies[i].end_ms);
  }
  const auto turns0 = s.turns_of(0);
  ASSERT_EQ(turns0.size(), 1u);
  EXPECT_EQ(turns0[0].owner, 1);
  EXPECT_EQ(turns0[0].lands_ms, lands);
  EXPECT_EQ(turns0[0].gemm_ms,
            ((0.0 + cost.expert_ms(300)) + cost.expert_ms(400)) + cost.expert_ms(500));
  const auto turns2 = s.turns_of(2);
  ASSERT_EQ(turns2.size(), 1u);
  EXPECT_EQ(turns2[0].owner, 0);
  EXPECT_EQ(turns2[0].lands_ms, Schedule::kNever);
  EXPECT_EQ(turns2[0].gemm_ms, cost.expert_ms(50));
  EXPECT_EQ(turns2[0].wait_ms, 0.0);
  EXPECT_EQ(s.own_ms[2], cost.expert_ms(10));
  // GPU 1 sends to GPU 0 (three migrations) and GPU 2, in the order its first copy to each starts.
  const auto helpers1 = s.helpers_of(1);
  ASSERT_EQ(helpers1.size(), 2u);
  EXPECT_EQ(helpers1[0], 0);
  EXPECT_EQ(helpers1[1], 2);
}

}  // namespace
}  // namespace feplb
