// The cost model (roofline with wave quantisation) and the plan metrics on hand examples.
#include "feplb/core/metrics.h"

#include <gtest/gtest.h>

#include "feplb/core/copy_links.h"
#include "feplb/core/error.h"
#include "test_util.h"

namespace feplb {
namespace {

using testing::glm5;
using testing::step_from;

// measure_plan of a plan made by hand, its schedule written first as a planner writes its plans'.
StepMetrics measured(Plan& plan, const Topology& topo, const GemmCostModel& cost, const Knobs& k,
                     double planner_us) {
  ScheduleWriter().write(plan, topo, k, cost);
  return measure_plan(plan, topo, cost, planner_us);
}

TEST(CostModel, ZeroRowsCostNothingAndTimeNeverFallsWithRows) {
  const Knobs k;
  const RooflineCostModel m(glm5(), k);
  EXPECT_EQ(m.expert_ms(0), 0.0);
  double prev = 0.0;
  for (int64_t rows = 1; rows <= 20000; rows += 7) {
    const double t = m.expert_ms(rows);
    EXPECT_GE(t, prev) << rows;
    prev = t;
  }
}

TEST(CostModel, LargeGemmIsComputeBoundWithWaveQuantisation) {
  Knobs k;
  k.gemm_launch_us = 0;
  const RooflineCostModel m(glm5(), k);
  // [4096, 6144] x [6144, 4096]: 128x256 tiles -> 32 x 16 = 512 tiles = 3.88 waves on 132 SMs;
  // no tile shape does better than 4 full waves of 128x256 work, i.e. 4 * 132 tiles' time.
  const double tile_ms = 2.0 * 128 * 256 * 6144 / (720e12 / 132) * 1e3;
  EXPECT_NEAR(m.gemm_ms(4096, 4096, 6144), 4 * tile_ms, 1e-9);
  // Ideal (unquantised) time is lower: quantisation costs 3%.
  const double ideal_ms = 2.0 * 4096 * 4096 * 6144 / 720e12 * 1e3;
  EXPECT_GT(m.gemm_ms(4096, 4096, 6144), ideal_ms);
  // One row is memory bound: it reads the whole [6144, 4096] weight.
  const double weight_read_ms = 6144.0 * 4096 * 2 / 4000e9 * 1e3;
  EXPECT_GE(m.gemm_ms(1, 4096, 6144), weight_read_ms);
}

TEST(Metrics, HandExample) {
  // EP=2, 2 experts per GPU. GPU 0 owns experts 0 (300 rows) and 1 (100); GPU 1 owns 2, 3 (50
  // each). Move 150 rows of expert 0 to GPU 1: loads 250 / 250.
  const auto s = step_from({{150, 50, 25, 25}, {150, 50, 25, 25}});
  const Topology topo = Topology::contiguous(2, 8, 4);
  const ExpertShape shape{64, 32, Dtype::kBf16};
  Knobs k;
  const RooflineCostModel cost(shape, k);
  Plan plan;
  plan.clear(4);
  plan.add_migration(0, 0, 1, 150, shape);
  std::vector<int64_t> moved = {150, 0, 0, 0};
  plan.add_home_slices(topo, s, moved);
  validate(plan, topo, s, shape, PlanLimits{});
  const StepMetrics m = measured(plan, topo, cost, k, 1.0);
  EXPECT_DOUBLE_EQ(m.mean_rows, 250);
  EXPECT_DOUBLE_EQ(m.token_straggler, 0);
  EXPECT_DOUBLE_EQ(m.token_max_over_mean, 1.0);
  EXPECT_EQ(m.weight_bytes, 3 * 64 * 32 * 2);
  EXPECT_EQ(m.token_bytes, 2 * 150 * 64 * 2);  // rows in and outputs back
  EXPECT_EQ(m.guest_experts, 1);
  EXPECT_DOUBLE_EQ(m.planner_us, 1.0);
  // Static plan of the same step: 400 / 100.
  Plan none;
  none.clear(4);
  none.add_home_slices(topo, s, std::vector<int64_t>(4, 0));
  const StepMetrics n = measured(none, topo, cost, k, 0.0);
  EXPECT_DOUBLE_EQ(n.token_straggler, 150);
  EXPECT_DOUBLE_EQ(n.token_max_over_mean, 1.6);
  EXPECT_DOUBLE_EQ(n.oracle_straggler, 0);
  EXPECT_TRUE(n.fits_static_window);
  EXPECT_GT(n.gemm_straggler_ms, 0);
}

TEST(Metrics, CopiesThatLandAfterTheOwnWorkDoNotFit) {
  // GPU 1 has almost no own work, so the 72 MiB weight copy cannot hide behind it.
  const auto s = step_from({{4000, 0, 1, 0}, {4000, 0, 1, 0}});
  const Topology topo = Topology::contiguous(2, 8, 4);
  Knobs k;
  const RooflineCostModel cost(glm5(), k);
  Plan plan;
  plan.clear(4);
  plan.add_migration(0, 0, 1, 2000, glm5());
  plan.add_home_slices(topo, s, {2000, 0, 0, 0});
  const StepMetrics m = measured(plan, topo, cost, k, 0.0);
  EXPECT_FALSE(m.fits_static_window);
  EXPECT_LT(m.window_slack_ms, 0);
  // Weights + rows at copy_gbps from when the plan exists (0 us planner here): GPU 1 finishes at
  // arrival + its guest GEMM, later than GPU 0's 6000-row GEMM? It is not: exposure is 0 here.
  const double arrival_ms =
      (3.0 * 6144 * 2048 * 2 + 2000.0 * 6144 * 2) / (k.copy_gbps * 1e9) * 1e3 + 2 * 5e-3;
  const double gpu1_finish = std::max(cost.expert_ms(2), arrival_ms) + cost.expert_ms(2000);
  EXPECT_NEAR(m.copy_exposed_ms, std::max(0.0, gpu1_finish - m.gemm_max_ms), 1e-9);
}

// Whether late copies cost time: a receiver that waits for its copies but still finishes before
// the slowest GPU costs nothing (fits false, exposed 0, the layer not delayed); one that becomes
// the slowest GPU because it waited delays the layer by exactly its wait.
TEST(Metrics, LateCopiesDelayTheLayerOnlyWhenTheReceiverBecomesTheSlowest) {
  const auto s = step_from({{4000, 0, 1, 0}, {4000, 0, 1, 0}});
  const Topology topo = Topology::contiguous(2, 8, 4);
  Knobs k;
  const RooflineCostModel cost(glm5(), k);
  const auto arrival_ms = [&](int64_t rows) {
    return (3.0 * 6144 * 2048 * 2 + static_cast<double>(rows) * 6144 * 2) / (k.copy_gbps * 1e9) *
               1e3 +
           2 * 5e-3;
  };
  // 2000 of 8000 rows to GPU 1: it waits (its own work is 2 rows) but ends long before GPU 0.
  Plan plan;
  plan.clear(4);
  plan.add_migration(0, 0, 1, 2000, glm5());
  plan.add_home_slices(topo, s, {2000, 0, 0, 0});
  StepMetrics m = measured(plan, topo, cost, k, 0.0);
  EXPECT_FALSE(m.fits_static_window);
  EXPECT_LT(m.window_slack_ms, 0);
  ASSERT_LT(arrival_ms(2000) + cost.expert_ms(2000), cost.expert_ms(6000));
  EXPECT_DOUBLE_EQ(m.copy_exposed_ms, 0.0);
  EXPECT_FALSE(m.delays_layer());
  // 4000 rows to GPU 1: both GPUs compute 4000 rows; GPU 1 starts them only once they land.
  plan.clear(4);
  plan.add_migration(0, 0, 1, 4000, glm5());
  plan.add_home_slices(topo, s, {4000, 0, 0, 0});
  m = measured(plan, topo, cost, k, 0.0);
  EXPECT_FALSE(m.fits_static_window);
  const double gpu1_finish = std::max(cost.expert_ms(2), arrival_ms(4000)) + cost.expert_ms(4000);
  ASSERT_GT(gpu1_finish, m.gemm_max_ms);
  EXPECT_NEAR(m.copy_exposed_ms, gpu1_finish - m.gemm_max_ms, 1e-9);
  EXPECT_TRUE(m.delays_layer());
  EXPECT_DOUBLE_EQ(m.plan_exposed_ms, 0.0);
}

// Weights prefetched before routing and rows dispatched straight to the helper (one-hop): the
// helper needs no copy after the plan, so nothing waits; the plan before the dispatch delays
// every GPU by the planner. An unused prefetch is wasted bytes.
TEST(Metrics, PrefetchAndOneHopNeedNoCopyAfterThePlanButChargeThePlan) {
  const auto s = step_from({{4000, 0, 1, 0}, {4000, 0, 1, 0}});
  const Topology topo = Topology::contiguous(2, 8, 4);
  Knobs k;
  k.prefetch_window_us = 1000;  // room for both 72 MiB prefetches on GPU 0's egress
  const RooflineCostModel cost(glm5(), k);
  Plan plan;
  plan.clear(4);
  plan.planned_before_dispatch = true;
  plan.add_prefetch(0, 0, 1, glm5());
  plan.add_prefetch(1, 0, 1, glm5());  // expert 1 has no rows: wasted
  plan.add_migration(0, 0, 1, 4000, glm5(), /*weights_prefetched=*/true, /*one_hop=*/true);
  plan.add_home_slices(topo, s, {4000, 0, 0, 0});
  validate(plan, topo, s, glm5(), PlanLimits{});
  StepMetrics m = measured(plan, topo, cost, k, 3.0);
  EXPECT_TRUE(m.fits_static_window);
  EXPECT_DOUBLE_EQ(m.copy_exposed_ms, 0.0);
  EXPECT_NEAR(m.plan_exposed_ms, 3.0e-3, 1e-12);  // the planner, not the counts round trip
  EXPECT_TRUE(m.delays_layer());
  EXPECT_EQ(m.token_bytes, 0);
  EXPECT_EQ(m.prefetch_copies, 2);
  EXPECT_EQ(m.prefetch_hits, 1);
  EXPECT_EQ(m.prefetch_bytes, 2 * glm5().weight_bytes());
  EXPECT_EQ(m.prefetch_wasted_bytes, glm5().weight_bytes());
  EXPECT_EQ(m.weight_bytes, 2 * glm5().weight_bytes());
  EXPECT_EQ(m.guest_weights_needed, 1);
  EXPECT_EQ(m.max_guest_slots, 2);
  // With too little earlier work (1 us) the used prefetch lands after GPU 1's own 1-row GEMM:
  // GPU 1 waits, and since its 4000 rows then end after GPU 0's, the layer is delayed too.
  k.prefetch_window_us = 1;
  m = measured(plan, topo, cost, k, 3.0);
  EXPECT_FALSE(m.fits_static_window);
  EXPECT_GT(m.copy_exposed_ms, 0.0);
  // Two-phase with the weights prefetched: only the rows are copied after the plan.
  plan.clear(4);
  plan.add_prefetch(0, 0, 1, glm5());
  plan.add_migration(0, 0, 1, 4000, glm5(), true, false);
  plan.add_home_slices(topo, s, {4000, 0, 0, 0});
  validate(plan, topo, s, glm5(), PlanLimits{});
  k.prefetch_window_us = 1000;
  m = measured(plan, topo, cost, k, 0.0);
  EXPECT_EQ(m.token_bytes, 2 * 4000 * glm5().row_bytes());
  EXPECT_EQ(m.guest_experts, 0);
  EXPECT_DOUBLE_EQ(m.plan_exposed_ms, 0.0);
  // Prefetched and copied again is invalid; so is a guest without weights.
  plan.copies.push_back({CopyKind::kWeights, 0, 0, 1, 0, glm5().weight_bytes()});
  EXPECT_THROW(validate(plan, topo, s, glm5(), PlanLimits{}), Error);
}

// EP=4 over 2 nodes of 2 GPUs; every rank routes 10 rows to expert 0 (home GPU 0).
TEST(Metrics, TrafficSplitsNvlinkAndNetwork) {
  const Topology topo = Topology::contiguous(4, 2, 4);
  const ExpertShape shape{64, 32, Dtype::kBf16};
  const auto s = step_from({{10, 0, 0, 0}, {10, 0, 0, 0}, {10, 0, 0, 0}, {10, 0, 0, 0}});
  Knobs k;
  const RooflineCostModel cost(shape, k);
  const int64_t row = shape.row_bytes();
  // Static: GPU 1's rows cross NVLink, GPUs 2 and 3's the network, both ways.
  Plan plan;
  plan.clear(4);
  plan.add_home_slices(topo, s, {0, 0, 0, 0});
  StepMetrics m = measured(plan, topo, cost, k, 0.0);
  measure_traffic(plan, topo, s, shape, m);
  EXPECT_EQ(m.dispatch_nvlink_bytes, 2 * 10 * row);
  EXPECT_EQ(m.dispatch_network_bytes, 2 * 20 * row);
  EXPECT_EQ(m.nvlink_bytes + m.network_bytes, 0);
  // 20 rows dispatched to GPU 2 (weights copied there, over the network). By ordinal, sources 0
  // and 1 fill the home, 2 and 3 fill GPU 2: only 1 -> 0 and 3 -> 2 move, both inside a node.
  plan.clear(4);
  plan.slices.push_back({0, 0, 20, RowSource::kHome});
  plan.slices.push_back({0, 2, 20, RowSource::kDispatched});
  plan.copies.push_back({CopyKind::kWeights, 0, 0, 2, 0, shape.weight_bytes()});
  validate(plan, topo, s, shape, PlanLimits{false, 4});
  m = measured(plan, topo, cost, k, 0.0);
  measure_traffic(plan, topo, s, shape, m);
  EXPECT_EQ(m.dispatch_nvlink_bytes, 2 * 20 * row);
  EXPECT_EQ(m.dispatch_network_bytes, 0);
  EXPECT_EQ(m.network_bytes, shape.weight_bytes());
  EXPECT_EQ(m.nvlink_bytes, 0);
  EXPECT_EQ(m.max_guest_slots, 1);
  // FEPLB-style: all rows to the home, 20 copied on to GPU 1 (NVLink) and back.
  plan.clear(4);
  plan.add_migration(0, 0, 1, 20, shape);
  plan.add_home_slices(topo, s, {20, 0, 0, 0});
  m = measured(plan, topo, cost, k, 0.0);
  measure_traffic(plan, topo, s, shape, m);
  EXPECT_EQ(m.dispatch_network_bytes, 2 * 20 * row);  // as static
  EXPECT_EQ(m.nvlink_bytes, shape.weight_bytes() + 2 * 20 * row);
  EXPECT_EQ(m.network_bytes, 0);
}

// A resident replica's rows need no copy, so they count as the GPU's own work, and installing a
// replica happens between micro-batches: it is never waited for.
TEST(Metrics, ResidentReplicasAreOwnWorkAndInstallsAreNotTimed) {
  const Topology topo = Topology::contiguous(2, 8, 4);
  const auto s = step_from({{4000, 0, 1, 0}, {4000, 0, 1, 0}});
  Knobs k;
  const RooflineCostModel cost(glm5(), k);
  Plan plan;
  plan.clear(4);
  plan.slices.push_back({0, 0, 4000, RowSource::kHome});
  plan.slices.push_back({0, 1, 4000, RowSource::kDispatched});
  plan.slices.push_back({2, 1, 2, RowSource::kHome});
  plan.resident.push_back({0, 1});
  plan.copies.push_back({CopyKind::kReplicaWeights, 0, 0, 1, 0, glm5().weight_bytes()});
  validate(plan, topo, s, glm5(), PlanLimits{true, 1});
  const StepMetrics m = measured(plan, topo, cost, k, 0.0);
  EXPECT_TRUE(m.fits_static_window);
  EXPECT_DOUBLE_EQ(m.copy_exposed_ms, 0.0);
  EXPECT_EQ(m.weight_bytes, glm5().weight_bytes());
  EXPECT_EQ(m.guest_experts, 0) << "no weights copied for this micro-batch";
  EXPECT_EQ(m.max_guest_slots, 1);
  EXPECT_DOUBLE_EQ(m.token_straggler, 1.0);  // 4000 and 4002 rows
}

TEST(Metrics, OracleFloorPerDomain) {
  // Two domains of 2 GPUs; all load in domain 0: its GPUs can only share it between them.
  const Topology topo = Topology::contiguous(4, 2, 4);
  std::vector<int64_t> counts = {101, 0, 0, 0};
  // Domain 0: ceil(101 / 2) = 51; mean over 4 GPUs = 25.25.
  EXPECT_DOUBLE_EQ(oracle_token_straggler(topo, counts), 51 - 25.25);
}

// The copy links on a hand example (1 GB/s, no setup: 1e6 bytes take 1 ms). GPU 2's first copy
// waits for GPU 1's ingress (busy with GPU 0's copy until 3 ms); its next copy, to a free GPU 3,
// runs in that gap instead of queueing behind it; one that does not fit the gap queues after
// (first in, first out); a migration's weights and rows are one copy.
TEST(CopyTimer, CopiesRunInTheGapsABusyLinkLeaves) {
  const Topology topo = Topology::contiguous(4, 8, 4);
  Knobs k;
  k.copy_gbps = 1.0;
  k.copy_setup_us = 0.0;
  k.prefetch_window_us = 0.0;
  Plan plan;
  plan.clear(4);
  const auto rows = [&](int src, int dst, int64_t bytes) {
    plan.copies.push_back({CopyKind::kTokenRows, src, src, dst, 1, bytes});
  };
  rows(0, 1, 3'000'000);  // [0, 3]
  rows(2, 1, 1'000'000);  // waits for GPU 1: [3, 4], GPU 2's egress idle in [0, 3]
  rows(2, 3, 2'000'000);  // in the gap: [0, 2]
  rows(2, 0, 2'000'000);  // the gap's rest [2, 3] is too short: after GPU 2's queue, [4, 6];
                          // GPU 0's ingress idle in [0, 4]
  plan.copies.push_back({CopyKind::kWeights, 3, 3, 0, 0, 1'000'000});  // in GPU 0's gap: [0, 1]
  rows(3, 0, 1'000'000);                                               // with its weights: [1, 2]
  plan.copies.push_back({CopyKind::kWeights, 3, 3, 2, 0, 1'000'000});  // after them: [2, 3]
  rows(3, 2, 1'000'000);
  plan.copies.push_back({CopyKind::kOutputRows, 3, 2, 3, 1, 1'000'000});  // not waited for
  CopyTimer timer;
  const auto t = timer.time(plan, topo, k, 0.0);
  ASSERT_EQ(t.size(), plan.copies.size());
  const double want[][2] = {{0, 3}, {3, 4}, {0, 2}, {4, 6}, {0, 1}, {1, 2}, {2, 3}, {3, 4}};
  for (size_t i = 0; i < std::size(want); ++i) {
    EXPECT_TRUE(t[i].timed) << i;
    EXPECT_NEAR(t[i].start_ms, want[i][0], 1e-9) << i;
    EXPECT_NEAR(t[i].end_ms, want[i][1], 1e-9) << i;
  }
  EXPECT_FALSE(t.back().timed);
  // A receiver still busy when the gap begins does not use it: GPU 1 until 4 ms here.
  CopyLinks links;
  links.reset(4, 0.0);
  links.add(0, 1, 3.0);                           // GPU 1 busy until 3
  EXPECT_DOUBLE_EQ(links.add(2, 1, 1.0), 4.0);    // GPU 2 idle in [0, 3]
  links.add(0, 3, 1.0);                           // GPU 3 busy in [3, 4]
  EXPECT_DOUBLE_EQ(links.start(2, 3, 1.0), 4.0);  // GPU 3 not free at 0 when the gap begins
  EXPECT_DOUBLE_EQ(links.start(2, 0, 1.0), 0.0);  // GPU 0 is
}

// A receiver's ingress idles while its first sender is busy elsewhere; a later copy from a free
// sender runs in that gap if it fits, one from a sender busy past the gap's end does not.
TEST(CopyLinks, ASecondSenderUsesTheReceiversIdleGap) {
  CopyLinks links;
  links.reset(4, 0.0);
  links.add(0, 1, 3.0);                           // GPU 0 busy until 3
  EXPECT_DOUBLE_EQ(links.add(0, 2, 1.0), 4.0);    // GPU 2's ingress idle in [0, 3]
  EXPECT_DOUBLE_EQ(links.add(1, 2, 2.0), 2.0);    // in it: [0, 2]
  EXPECT_DOUBLE_EQ(links.start(3, 2, 1.5), 4.0);  // the rest [2, 3] is too short
  EXPECT_DOUBLE_EQ(links.add(3, 2, 1.0), 3.0);    // but holds this one: [2, 3]
  links.add(0, 3, 2.0);                           // GPU 3's ingress: [4, 6], idle in [0, 4]
  EXPECT_DOUBLE_EQ(links.add(1, 2, 1.0), 5.0);    // GPU 2 after its last copy: [4, 5]
  EXPECT_DOUBLE_EQ(links.start(1, 3, 1.0), 6.0);  // GPU 1, busy until 5, misses GPU 3's gap
  EXPECT_DOUBLE_EQ(links.start(2, 3, 1.0), 0.0);  // GPU 2 is free in it
}

}  // namespace
}  // namespace feplb

namespace feplb {
namespace {

TEST(TableCostModel, InterpolatesAndExtrapolates) {
  const TableCostModel t({128, 256, 512}, {0.1, 0.15, 0.35}, testing::glm5(), "test");
  EXPECT_EQ(t.expert_ms(0), 0.0);
  EXPECT_DOUBLE_EQ(t.expert_ms(64), 0.1);  // below the first point: its cost
  EXPECT_DOUBLE_EQ(t.expert_ms(192), 0.125);
  EXPECT_DOUBLE_EQ(t.expert_ms(1024), 0.35 + 0.2 * 2);  // last slope
  EXPECT_THROW(TableCostModel({128, 64}, {0.1, 0.2}, testing::glm5(), ""), InputError);
  // A time no GEMM takes (finite, but its extrapolation overflows): refused.
  EXPECT_THROW(TableCostModel({1, 128, 4096}, {0.01, 0.02, 0.41e308}, testing::glm5(), ""),
               InputError);
}

}  // namespace
}  // namespace feplb
