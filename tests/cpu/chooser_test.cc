// feplb's mode chooser (feplb/core/planners/feplb/chooser.h): which switches the knobs leave to
// it, its candidates and first modes, the move rule on workloads where one mode is far better,
// determinism, its cost model against the metrics', and what its prefetch history learns from.
#include "feplb/core/planners/feplb/chooser.h"

#include <gtest/gtest.h>

#include <numeric>
#include <utility>
#include <vector>

#include "feplb/core/metrics.h"
#include "feplb/core/planners/feplb/engine.h"
#include "feplb/sim/prior.h"
#include "feplb/sim/workload.h"
#include "test_util.h"

namespace feplb {
namespace {

using testing::Bench;

std::vector<RoutingStep> steps_of(const Prior& prior, int ranks, int count, uint64_t seed) {
  WorkloadSpec spec;
  spec.num_ranks = ranks;
  spec.top_k = 8;
  spec.tokens_per_rank = 4096;
  spec.seq_len = 4096;
  spec.concentration = 2000;
  spec.seed = seed;
  std::vector<RoutingStep> out;
  for (int mb = 0; mb < count; ++mb) out.push_back(generate_step(prior.popularity[0], spec, mb, 0));
  return out;
}

TEST(FeplbChooser, TheDefaultKnobsLeaveEverySwitchToIt) {
  const FeplbAuto left = FeplbAuto::from_knobs(Knobs{});
  EXPECT_TRUE(left.path && left.prefetch && left.balance && left.copy_rule);
  Knobs set;  // every switch set (the reserve left as it is)
  set.one_hop = 0;
  set.prefetch = 1;
  set.copy_timing = 1;
  set.time_balance_budget = 0;
  EXPECT_FALSE(FeplbAuto::from_knobs(set).any());
  // Every switch set: one mode, as before (no chooser).
  const Bench b(8, 8, 128, set);
  EXPECT_EQ(dynamic_cast<FeplbChooser*>(b.make("feplb").get()), nullptr);
}

TEST(FeplbChooser, ReservesAtLeastWhatItsTwoPhaseModesTakeOnThisHost) {
  const Bench b(8, 8, 128, Knobs{});
  const PlannerContext ctx{b.topo, b.shape, b.knobs, b.cost.get()};
  FeplbChooser c(ctx, FeplbAuto::from_knobs(b.knobs));
  const std::vector<ModeTime> times = c.measure_mode_times(8 * 4096);
  // One time per two-phase candidate (a one-hop plan reserves nothing), positive.
  size_t two_phase = 0;
  for (const FeplbConfig& m : c.candidates()) two_phase += m.path == FeplbPath::kTwoPhase;
  ASSERT_EQ(times.size(), two_phase);
  for (const ModeTime& t : times) EXPECT_GT(t.us, 0.0) << t.mode;
  // Measuring plans on a fresh chooser: this one's plans are unchanged.
  const auto steps = steps_of(lognormal_prior(128, 5.0, 1, 3), 8, 3, 5);
  const auto plans_of = [&](Planner& p) {
    std::vector<std::string> out;
    for (const RoutingStep& s : steps) {
      Plan plan;
      p.plan(s, plan);
      out.push_back(serialize(plan));
      p.observe(s);
    }
    return out;
  };
  FeplbChooser fresh(ctx, FeplbAuto::from_knobs(b.knobs));
  const std::vector<std::string> expected = plans_of(fresh);
  EXPECT_EQ(plans_of(c), expected);
  // Tables grown ahead (Planner::warm): the same plans.
  FeplbChooser warmed(ctx, FeplbAuto::from_knobs(b.knobs));
  warmed.warm(1 << 16);
  EXPECT_EQ(plans_of(warmed), expected);
  Knobs time_mode = b.knobs;  // one mode, the time budget's tries
  time_mode.one_hop = 0;
  time_mode.prefetch = 0;
  time_mode.copy_timing = 1;
  time_mode.time_balance_budget = 0.05;
  const PlannerContext fixed{b.topo, b.shape, time_mode, b.cost.get()};
  auto cold = make_planner("feplb", fixed), hot = make_planner("feplb", fixed);
  hot->warm(1 << 16);
  for (const RoutingStep& s : steps) {
    Plan a, h;
    cold->plan(s, a);
    hot->plan(s, h);
    EXPECT_EQ(serialize(a), serialize(h));
  }
  // A slower host (its modes' start-up times): the largest of a two-phase mode's time over its
  // reserve is its scale; a faster one is 1; unknown modes are ignored. The candidates keep their
  // reserves.
  std::vector<ModeTime> slow;
  for (const FeplbConfig& m : c.candidates()) slow.push_back({m.label(), 1000.5});
  slow.push_back({"no such mode", 1e7});
  FeplbChooser d(ctx, FeplbAuto::from_knobs(b.knobs));
  d.set_host_times(slow);
  double least_reserve = 1e9;
  for (size_t i = 0; i < d.candidates().size(); ++i) {
    const FeplbConfig& m = d.candidates()[i];
    EXPECT_EQ(m.reserve_us, c.candidates()[i].reserve_us) << m.label();
    if (m.path == FeplbPath::kTwoPhase) least_reserve = std::min(least_reserve, m.reserve_us);
  }
  EXPECT_DOUBLE_EQ(d.host_scale(), 1000.5 / least_reserve);
  std::vector<ModeTime> fast = slow;
  for (ModeTime& t : fast) t.us = 0.5;
  FeplbChooser e(ctx, FeplbAuto::from_knobs(b.knobs));
  e.set_host_times(fast);
  EXPECT_EQ(e.host_scale(), 1.0);
  // What the layer's recent plans took (the GPU layer's PlannerClock): the scale is that over the
  // rule's reserve for the mode of the layer's last plan; the plans are still made for the rule's
  // reserve (their copies start when they are ready: later).
  FeplbChooser f(ctx, FeplbAuto::from_knobs(b.knobs));
  f.set_recent_plan_us(500);
  const auto rule_us = [&](const std::string& mode) {
    for (const FeplbConfig& m : c.candidates()) {
      if (m.label() == mode) return m.reserve_us;
    }
    ADD_FAILURE() << "no candidate " << mode;
    return 1.0;
  };
  std::string last;
  for (const RoutingStep& s : steps) {
    Plan plan;
    f.plan(s, plan);
    if (!last.empty()) {
      const double charged =
          rule_us(last) >= 0 ? rule_us(last) : planner_reserve_us(b.knobs, b.topo);
      EXPECT_DOUBLE_EQ(f.host_scale(), 500 / charged) << last;
    }
    EXPECT_EQ(plan.reserve_us, rule_us(plan.mode)) << plan.mode;
    last = plan.mode;
    f.observe(s);
  }
  // A faster one than the rule (1 us a plan): the scale is below 1, the plans are still made for
  // the rule's reserve, and a one-hop plan is charged what it takes, not its reserve (the dispatch
  // waits for the plan): the chooser plans in one hop at least as often as at the rule's speed.
  FeplbChooser g(ctx, FeplbAuto::from_knobs(b.knobs));
  FeplbChooser h(ctx, FeplbAuto::from_knobs(b.knobs));
  g.set_recent_plan_us(1);
  int one_hop_fast = 0, one_hop_rule = 0;
  for (const RoutingStep& s : steps) {
    Plan pg, ph;
    g.plan(s, pg);
    h.plan(s, ph);
    EXPECT_EQ(pg.reserve_us, rule_us(pg.mode)) << pg.mode;
    one_hop_fast += pg.planned_before_dispatch ? 1 : 0;
    one_hop_rule += ph.planned_before_dispatch ? 1 : 0;
    g.observe(s);
    h.observe(s);
  }
  EXPECT_LT(g.host_scale(), 1.0);
  EXPECT_EQ(h.host_scale(), 1.0);
  EXPECT_GE(one_hop_fast, one_hop_rule);
  EXPECT_GT(one_hop_fast, 0);
  // The reserve set by the knob: nothing to measure.
  Knobs set = b.knobs;
  set.planner_budget_us = 30;
  const FeplbChooser k(PlannerContext{b.topo, b.shape, set, b.cost.get()},
                       FeplbAuto::from_knobs(set));
  EXPECT_TRUE(k.measure_mode_times(8 * 4096).empty());
}

TEST(FeplbChooser, CandidatesFollowTheSwitchesLeftAndTheDomain) {
  const Bench b(8, 8, 128, Knobs{});
  const FeplbChooser c(PlannerContext{b.topo, b.shape, b.knobs, b.cost.get()},
                       FeplbAuto::from_knobs(b.knobs));
  // prefetch x (time within the bound by all tries; rows) x the copy rules: hidden (two-phase),
  // late by the busiest or hidden (one-hop).
  EXPECT_EQ(c.candidates().size(), 4u + 8u);
  // 16 experts per GPU: two-phase first, weights prefetched, time within the bound.
  const FeplbConfig& first = c.mode_of(0);
  EXPECT_EQ(first.path, FeplbPath::kTwoPhase);
  EXPECT_EQ(first.prefetch, FeplbPrefetch::kOn);
  EXPECT_EQ(first.balance, FeplbBalance::kTimeBudget);
  EXPECT_EQ(first.budget_tries, FeplbBudgetTries::kAll);
  // Five plans: twice the reserve of the default's two-phase plans (20 us here, its floor).
  EXPECT_DOUBLE_EQ(first.reserve_us,
                   2 * planner_reserve_us(b.knobs, b.topo, kDefaultReservePerUnitUs));
  EXPECT_DOUBLE_EQ(first.reserve_us, 40.0);
  for (const FeplbConfig& m : c.candidates()) {
    const bool time = m.balance == FeplbBalance::kTimeBudget;
    if (time) {
      EXPECT_EQ(m.budget_tries, FeplbBudgetTries::kAll) << m.label();
    }
    // Time modes twice the reserve; two-phase rows the default's reserve; one-hop rows the knobs'.
    const double expected = time ? first.reserve_us : m.path == FeplbPath::kTwoPhase ? 20.0 : -1.0;
    EXPECT_EQ(m.reserve_us, expected) << m.label();
  }
  EXPECT_DOUBLE_EQ(first.time_budget, b.knobs.token_bound);
  EXPECT_EQ(first.copy_rule, FeplbCopyRule::kHidden);
  int late = 0;
  for (const FeplbConfig& m : c.candidates()) {
    if (m.path == FeplbPath::kTwoPhase) {
      EXPECT_EQ(m.copy_rule, FeplbCopyRule::kHidden);
    }
    late += m.copy_rule == FeplbCopyRule::kLateByBusiest;
  }
  EXPECT_EQ(late, 4);
  // The path fixed by its knob: two-phase candidates only.
  Knobs two_phase;
  two_phase.one_hop = 0;
  const Bench b2(8, 8, 128, two_phase);
  const FeplbChooser c2(PlannerContext{b2.topo, b2.shape, b2.knobs, b2.cost.get()},
                        FeplbAuto::from_knobs(b2.knobs));
  EXPECT_EQ(c2.candidates().size(), 4u);
  for (const FeplbConfig& m : c2.candidates()) EXPECT_EQ(m.path, FeplbPath::kTwoPhase);
  EXPECT_TRUE(c2.limits().rows_via_homes);
  EXPECT_FALSE(c.limits().rows_via_homes);
  // A domain of 64 GPUs: time balancing by the blends alone on both paths; two experts per GPU:
  // one-hop first, with time.
  const Bench big(64, 64, 128, Knobs{});
  const FeplbChooser c3(PlannerContext{big.topo, big.shape, big.knobs, big.cost.get()},
                        FeplbAuto::from_knobs(big.knobs));
  EXPECT_EQ(c3.candidates().size(), 4u + 8u);
  int time = 0, one_hop_time = 0;
  for (const FeplbConfig& m : c3.candidates()) {
    if (m.balance == FeplbBalance::kTimeBudget) {
      // Beyond 16 GPUs the blends alone (one to three plans): two-phase at the default's
      // reserve (0.125 us per expert and per GPU: 24 us), one-hop charged twice the knobs'
      // (0.1 us per expert and per GPU, at least 20 us; the dispatch waits for it).
      EXPECT_EQ(m.budget_tries, FeplbBudgetTries::kBlends) << m.label();
      EXPECT_DOUBLE_EQ(m.reserve_us, m.path == FeplbPath::kOneHop ? 40.0 : 24.0) << m.label();
      ++time;
      one_hop_time += m.path == FeplbPath::kOneHop;
    }
  }
  EXPECT_EQ(time, 6);  // two-phase with and without prefetch; one-hop x prefetch x copy rules
  EXPECT_EQ(one_hop_time, 4);
  EXPECT_EQ(c3.mode_of(0).path, FeplbPath::kOneHop);
  EXPECT_EQ(c3.mode_of(0).balance, FeplbBalance::kTimeBudget);
  // 256 GPUs: time by the blends alone, as at 64.
  const Bench rack(256, 256, 1024, Knobs{});
  const FeplbChooser c4(PlannerContext{rack.topo, rack.shape, rack.knobs, rack.cost.get()},
                        FeplbAuto::from_knobs(rack.knobs));
  time = 0;
  for (const FeplbConfig& m : c4.candidates()) {
    if (m.balance != FeplbBalance::kTimeBudget) continue;
    EXPECT_EQ(m.budget_tries, FeplbBudgetTries::kBlends) << m.label();
    ++time;
  }
  EXPECT_EQ(time, 6);
  EXPECT_EQ(c4.mode_of(0).path, FeplbPath::kTwoPhase);  // 4 experts per GPU
  // Several domains of at most 16 GPUs: two-phase copies late by the busiest too; the first mode
  // keeps them hidden.
  const Bench nodes(64, 8, 256, Knobs{});
  const FeplbChooser c6(PlannerContext{nodes.topo, nodes.shape, nodes.knobs, nodes.cost.get()},
                        FeplbAuto::from_knobs(nodes.knobs));
  EXPECT_EQ(c6.candidates().size(), 8u + 8u);
  int two_phase_late = 0;
  for (const FeplbConfig& m : c6.candidates()) {
    two_phase_late +=
        m.path == FeplbPath::kTwoPhase && m.copy_rule == FeplbCopyRule::kLateByBusiest;
  }
  EXPECT_EQ(two_phase_late, 4);
  EXPECT_EQ(c6.mode_of(0).path, FeplbPath::kTwoPhase);
  EXPECT_EQ(c6.mode_of(0).copy_rule, FeplbCopyRule::kHidden);
  // Beyond FeplbChooser::kTimeGpusMax GPUs: rows only (a time plan's planner time is not measured
  // there).
  const Bench larger(FeplbChooser::kTimeGpusMax + 32, 32, 4 * (FeplbChooser::kTimeGpusMax + 32),
                     Knobs{});
  const FeplbChooser c5(PlannerContext{larger.topo, larger.shape, larger.knobs, larger.cost.get()},
                        FeplbAuto::from_knobs(larger.knobs));
  for (const FeplbConfig& m : c5.candidates()) EXPECT_EQ(m.balance, FeplbBalance::kRows);
}

// A layer whose caller dispatched the rows (the GPU layer's forward_dispatched): the chooser drops
// its one-hop modes, a layer in one moves to a two-phase mode, and its plans keep rows at home.
TEST(FeplbChooser, KeepsRowsViaHomesWhenAsked) {
  const Bench big(64, 64, 128, Knobs{});
  FeplbChooser c(PlannerContext{big.topo, big.shape, big.knobs, big.cost.get()},
                 FeplbAuto::from_knobs(big.knobs));
  const RoutingStep s = testing::random_step(64, 128, 8, 2048, 8.0, 3);
  Plan plan;
  c.plan(s, plan);
  c.observe(s);
  EXPECT_EQ(c.mode_of(0).path, FeplbPath::kOneHop);  // two experts per GPU
  c.keep_rows_via_homes();
  EXPECT_TRUE(c.limits().rows_via_homes);
  for (const FeplbConfig& m : c.candidates()) EXPECT_EQ(m.path, FeplbPath::kTwoPhase);
  EXPECT_EQ(c.mode_of(0).path, FeplbPath::kTwoPhase);
  for (int step = 0; step < 3; ++step) {
    c.plan(s, plan);
    validate(plan, big.topo, s, big.shape, c.limits());
    EXPECT_FALSE(plan.planned_before_dispatch);
    c.observe(s);
  }
}

// Four experts per GPU with hot experts (rack.md section 2's lognormal max/mean 13 at EP=72): the
// first mode (two-phase) cannot copy a hot expert's rows into the windows the static experts
// leave; one hop sends them in the dispatch. The chooser tries one-hop on the same counts, finds
// it far better and moves there.
// Where one hop is far better (EP=72, 4 experts per GPU, max/mean 13), a layer that starts in
// the rule's mode (two-phase: a history observed before any plan) moves off it at its first
// explored micro-batch, and plans one hop from then on.
TEST(FeplbChooser, MovesToAModeThatIsFarBetter) {
  const int R = 72, E = 288;
  const Bench b(R, R, E, Knobs{});
  auto planner = b.make("feplb");
  auto* chooser = dynamic_cast<FeplbChooser*>(planner.get());
  ASSERT_NE(chooser, nullptr);
  ASSERT_EQ(chooser->mode_of(0).path, FeplbPath::kTwoPhase);
  const std::vector<RoutingStep> steps = steps_of(lognormal_prior(E, 13.0, 1, 3), R, 8, 3);
  planner->observe(steps[0]);
  EXPECT_EQ(chooser->mode_of(0).path, FeplbPath::kOneHop) << chooser->mode_of(0).label();
  Plan plan;
  for (size_t i = 1; i < steps.size(); ++i) {
    planner->plan(steps[i], plan);
    validate(plan, b.topo, steps[i], b.shape, planner->limits());
    EXPECT_EQ(plan.mode, chooser->mode_of(0).label());
    EXPECT_EQ(chooser->mode_of(0).path, FeplbPath::kOneHop);
    planner->observe(steps[i]);
  }
}

// With one planner thread, the planner's first plan, before any history: the rule's mode and the
// rule's choice on the other path planned on its counts, the better one kept, and the plan says
// it took one plan more (Plan::extra_plans, which a charged simulation charges). On the workload
// above it is one hop at once, and costs less than half of what the rule's two-phase first plan
// costs (GEMM straggler + exposed time, the plan's latency at the reserve); a second layer then
// starts in the mode the first one's exploration found, planned once.
TEST(FeplbChooser, TheFirstPlanIsTheBestCandidateOnItsCounts) {
  const int R = 72, E = 288;
  Knobs one_thread;
  one_thread.planner_threads = 1;
  const Bench b(R, R, E, one_thread);
  Knobs two_phase = one_thread;
  two_phase.one_hop = 0;  // the rule's first mode here: the other switches left to the chooser
  const Bench rule(R, R, E, two_phase);
  auto planner = b.make("feplb"), by_rule = rule.make("feplb");
  const auto* chooser = dynamic_cast<const FeplbChooser*>(planner.get());
  ASSERT_NE(chooser, nullptr);
  const std::vector<RoutingStep> steps = steps_of(lognormal_prior(E, 13.0, 1, 3), R, 2, 3);
  const double reserve_us = planner_reserve_us(b.knobs, b.topo);
  Plan first, ruled;
  planner->plan(steps[0], first);
  by_rule->plan(steps[0], ruled);
  validate(first, b.topo, steps[0], b.shape, planner->limits());
  EXPECT_EQ(chooser->mode_of(0).path, FeplbPath::kOneHop) << first.mode;
  EXPECT_EQ(first.mode, chooser->mode_of(0).label());
  EXPECT_EQ(first.extra_plans, 1);
  EXPECT_EQ(ruled.extra_plans, 1);  // two two-phase candidates: the rule's first and next
  const StepMetrics m = measure_plan(first, b.topo, *b.cost, reserve_us);
  const StepMetrics r = measure_plan(ruled, b.topo, *b.cost, reserve_us);
  EXPECT_LT(2 * (m.gemm_straggler_ms + m.exposed_ms()), r.gemm_straggler_ms + r.exposed_ms())
      << first.mode << " against " << ruled.mode;
  planner->observe(steps[0]);
  RoutingStep second = steps[1];
  second.layer = 1;
  Plan next;
  planner->plan(second, next);
  EXPECT_EQ(chooser->mode_of(1).label(), chooser->mode_of(0).label());
  EXPECT_EQ(next.mode, chooser->mode_of(1).label());
  EXPECT_EQ(next.extra_plans, 0);
}

// The first plan's kept candidate (planned on a side thread's engine, or the caller's) is the
// plan the chooser makes in that mode: byte for byte what it plans on the same counts again.
TEST(FeplbChooser, TheFirstPlanKeepsTheCandidatesPlanAsMade) {
  const int R = 72, E = 288;
  const Bench b(R, R, E, Knobs{});
  auto planner = b.make("feplb");
  const auto* chooser = dynamic_cast<const FeplbChooser*>(planner.get());
  ASSERT_NE(chooser, nullptr);
  const std::vector<RoutingStep> steps = steps_of(lognormal_prior(E, 13.0, 1, 3), R, 1, 3);
  Plan first, again;
  planner->plan(steps[0], first);
  ASSERT_EQ(first.extra_plans, 0);  // its candidates side by side, one per planner thread
  // The same counts again (no observe(): the layer's mode now set, planned once).
  planner->plan(steps[0], again);
  EXPECT_EQ(again.extra_plans, 0);
  EXPECT_EQ(again.mode, first.mode);
  EXPECT_EQ(serialize(again), serialize(first));
}

// The chooser's prefetch history learns from the step's plan made again with copy time ignored
// (the pairs it would use with every weight in place), not from the plan held to its copy rule:
// after a layer's first micro-batch, observed in the rule's mode, the prediction is the one an
// engine makes from that mode's copy-free plan of the counts, and not the one from its plan.
TEST(FeplbChooser, ThePrefetchHistoryLearnsFromTheCopyFreePlan) {
  const int R = 72, E = 288;
  Knobs k;
  k.prefetch = 1;
  k.copy_timing = 1;
  k.time_balance_budget = 0;  // rows: the mode's plan does not depend on the chooser's budget
  k.prefetch_window_us = prefetch_window_us(testing::glm5(), 4096, k);  // as the simulator sets it
  const Bench b(R, R, E, k);
  auto planner = b.make("feplb");
  const auto* chooser = dynamic_cast<const FeplbChooser*>(planner.get());
  ASSERT_NE(chooser, nullptr);
  const std::vector<RoutingStep> steps = steps_of(lognormal_prior(E, 13.0, 1, 3), R, 1, 3);
  const FeplbConfig observed_in = chooser->mode_of(0);  // the rule's: the layer is new
  ASSERT_EQ(observed_in.prefetch, FeplbPrefetch::kOn);
  ASSERT_EQ(observed_in.copy_rule, FeplbCopyRule::kHidden);
  planner->observe(steps[0]);
  // What an engine of the same context predicts after recording either plan of these counts.
  const auto predicted = [&](FeplbCopyRule rule) {
    FeplbEngine engine(PlannerContext{b.topo, b.shape, b.knobs, b.cost.get()});
    FeplbConfig mode = observed_in;
    mode.copy_rule = rule;
    Plan plan;
    engine.plan_with(mode, steps[0], plan);
    engine.record(0, plan);
    std::vector<std::pair<int, int>> pairs;
    for (const Copy& c : engine.prefetch(0)) pairs.emplace_back(c.expert, c.dst_gpu);
    return pairs;
  };
  std::vector<std::pair<int, int>> learned;
  for (const Copy& c : chooser->prefetch(0)) learned.emplace_back(c.expert, c.dst_gpu);
  const auto copy_free = predicted(FeplbCopyRule::kIgnore);
  const auto held = predicted(FeplbCopyRule::kHidden);
  ASSERT_NE(copy_free, held);  // the workload tells the two apart
  EXPECT_FALSE(learned.empty());
  EXPECT_EQ(learned, copy_free);
}

// A cost model that cannot be copied for another thread (GemmCostModel::clone null): a chooser
// over it plans the first plan's candidates one after the other, on the caller's thread.
class NoCopies final : public GemmCostModel {
 public:
  explicit NoCopies(const GemmCostModel& m) : m_(m) {}
  double expert_ms(int64_t rows) const override { return m_.expert_ms(rows); }

 private:
  const GemmCostModel& m_;
};

// With planner_threads 4, a layer's first plan tries 4 candidates: side by side (one round,
// extra_plans 0), or in series where the cost model cannot be copied (extra_plans 3); the same
// plans and modes, bit for bit, either way, on three layers of three micro-batches, the later
// ones planned once. On the workload where one hop is far better, the first plan is one hop.
TEST(FeplbChooser, EveryLayersFirstPlanTriesItsCandidatesSideBySide) {
  const int R = 72, E = 288;
  const Bench b(R, R, E, Knobs{});
  ASSERT_EQ(b.knobs.planner_threads, 4);
  const NoCopies serial_cost(*b.cost);
  auto side = b.make("feplb");
  auto serial = make_planner("feplb", PlannerContext{b.topo, b.shape, b.knobs, &serial_cost});
  const auto* chooser = dynamic_cast<const FeplbChooser*>(side.get());
  ASSERT_NE(chooser, nullptr);
  const std::vector<RoutingStep> steps = steps_of(lognormal_prior(E, 13.0, 1, 3), R, 9, 3);
  Plan ps, pq;
  for (size_t i = 0; i < steps.size(); ++i) {
    RoutingStep s = steps[i];
    s.layer = static_cast<int64_t>(i % 3);  // three layers, three micro-batches each
    side->plan(s, ps);
    serial->plan(s, pq);
    validate(ps, b.topo, s, b.shape, side->limits());
    ASSERT_EQ(serialize(ps), serialize(pq)) << "micro-batch " << i;
    ASSERT_EQ(ps.mode, pq.mode);
    const bool first = i < 3;
    EXPECT_EQ(ps.extra_plans, 0) << "micro-batch " << i;
    EXPECT_EQ(pq.extra_plans, first ? 3 : 0) << "micro-batch " << i;
    if (i == 0) {
      EXPECT_EQ(chooser->mode_of(0).path, FeplbPath::kOneHop) << ps.mode;
    }
    side->observe(s);
    serial->observe(s);
  }
}

// Every rank runs its own chooser on the same counts: the same plans and moves, bit for bit.
TEST(FeplbChooser, IsDeterministic) {
  const int R = 8, E = 64;
  const Bench b(R, 8, E, Knobs{});
  auto a = b.make("feplb"), c = b.make("feplb");
  Plan pa, pc;
  for (const RoutingStep& s : steps_of(lognormal_prior(E, 6.0, 1, 5), R, 20, 5)) {
    a->plan(s, pa);
    c->plan(s, pc);
    ASSERT_EQ(serialize(pa), serialize(pc));
    ASSERT_EQ(pa.mode, pc.mode);
    a->observe(s);
    c->observe(s);
  }
}

// A history observed without plans (the simulator's warm-up) is costed at the time budget the
// plans would have got: after it, the chooser moves and plans as one that planned every step.
// One chooser plans and observes each micro-batch, another only observes them (a history), each
// told `us` of planner time before every micro-batch (0: none): the same mode after every one,
// and the same plan for the last. Returns the observing chooser's host scale.
double expect_history_counts_as_planned(double us) {
  const int R = 8, E = 64;
  const Bench b(R, 8, E, Knobs{});
  auto planned = b.make("feplb"), observed = b.make("feplb");
  const std::vector<RoutingStep> steps = steps_of(lognormal_prior(E, 6.0, 1, 7), R, 21, 7);
  Plan pa, pb;
  const auto* a = dynamic_cast<const FeplbChooser*>(planned.get());
  const auto* o = dynamic_cast<const FeplbChooser*>(observed.get());
  if (!a || !o) {
    ADD_FAILURE() << "feplb is not the chooser";
    return 0;
  }
  for (size_t i = 0; i + 1 < steps.size(); ++i) {
    if (us > 0) {
      planned->set_recent_plan_us(us);
      observed->set_recent_plan_us(us);
    }
    planned->plan(steps[i], pa);
    planned->observe(steps[i]);
    observed->observe(steps[i]);
    EXPECT_EQ(a->mode_of(0).label(), o->mode_of(0).label()) << "after micro-batch " << i;
  }
  planned->plan(steps.back(), pa);
  observed->plan(steps.back(), pb);
  EXPECT_EQ(pa.mode, pb.mode);
  EXPECT_EQ(serialize(pa), serialize(pb));
  return o->host_scale();
}

TEST(FeplbChooser, AHistoryObservedWithoutPlansCountsAsPlanned) {
  // No planner time given: the rule's speed (scale 1) for both.
  EXPECT_EQ(expect_history_counts_as_planned(0), 1.0);
}

// A history observed at a planner time given before each micro-batch (the simulation's charged
// time) is explored at that host's speed, as plans made at it are.
TEST(FeplbChooser, AHistoryIsExploredAtThePlannerTimeGivenForIt) {
  EXPECT_LT(expect_history_counts_as_planned(1), 1.0);
}

// plan_cost (the chooser's) is the metrics' GEMM straggler + exposed time, the plan's latency
// charged at the reserve where the dispatch waits for it; on a slower host (a plan that took 2.5x
// its reserve) too: a two-phase plan's copies start that much later, a one-hop plan delays the
// dispatch that long.
TEST(FeplbChooser, CostIsTheMetricsGemmStragglerAndExposedTime) {
  const int R = 8, E = 64;
  for (int one_hop : {0, 1}) {
    Knobs k;
    k.one_hop = one_hop;
    k.prefetch = 0;
    k.copy_timing = one_hop ? 3 : 1;
    k.time_balance_budget = 0;
    const Bench b(R, 8, E, k);
    auto planner = b.make("feplb");
    std::vector<double> gemm;
    std::vector<int64_t> rows;
    for (const RoutingStep& s : steps_of(lognormal_prior(E, 8.0, 1, 7), R, 6, 7)) {
      Plan plan;
      planner->plan(s, plan);
      const double reserve_us = planner_reserve_us(b.knobs, b.topo);
      for (const double scale : {1.0, 2.5}) {
        const double took_us = reserve_us * scale;
        const double delay_ms = one_hop ? 0.0 : (took_us - reserve_us) * 1e-3;
        const PlanCost c = plan_cost(plan, b.topo, took_us * 1e-3, gemm, rows, delay_ms);
        const StepMetrics m = measure_plan(plan, b.topo, *b.cost, took_us);
        EXPECT_NEAR(c.layer_ms, m.gemm_straggler_ms + m.exposed_ms(), 1e-9) << one_hop << scale;
        EXPECT_NEAR(c.token_straggler, m.token_straggler, 1e-9);
      }
    }
  }
}

}  // namespace
}  // namespace feplb
