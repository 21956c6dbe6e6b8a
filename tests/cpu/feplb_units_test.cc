// The units of the feplb planner (feplb/core/planners/feplb/): its config (validation, label, the
// one-hop rule), each copy rule on a hand example, and FeplbEngine::plan_with (the knobs' planner's
// bytes; modes planned in any order on one engine).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "feplb/core/errors.h"
#include "feplb/core/metrics.h"
#include "feplb/core/planners/feplb/candidates.h"
#include "feplb/core/planners/feplb/config.h"
#include "feplb/core/planners/feplb/copy_rules.h"
#include "feplb/core/planners/feplb/engine.h"
#include "feplb/core/planners/feplb/level_time.h"
#include "feplb/core/planners/feplb/time_budget.h"
#include "test_util.h"

namespace feplb {
namespace {

using feplb_detail::ExposedBeforeDonor;
using feplb_detail::HiddenCopies;
using feplb_detail::IgnoreCopyTime;
using feplb_detail::LateByBusiest;
using feplb_detail::LoadMeasure;
using feplb_detail::Loads;

// The message of the InputError `f` throws ("" if none).
template <typename F>
std::string input_error(F f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

FeplbConfig config_of(const Knobs& k) { return FeplbConfig::from_knobs(k, true); }

TEST(FeplbConfig, TheKnobsModeAndItsLabel) {
  const FeplbConfig defaults = config_of(testing::explicit_knobs());
  EXPECT_EQ(defaults.path, FeplbPath::kTwoPhase);
  EXPECT_EQ(defaults.prefetch, FeplbPrefetch::kOff);
  EXPECT_EQ(defaults.balance, FeplbBalance::kRows);
  EXPECT_EQ(defaults.copy_rule, FeplbCopyRule::kHidden);
  EXPECT_EQ(defaults.candidate_set(), FeplbCandidates::kBusiest);
  EXPECT_EQ(defaults.label(), "two-phase, rows, hidden copies");

  Knobs k = testing::explicit_knobs();
  k.prefetch = 1;
  k.time_balance_budget = 0.05;
  EXPECT_EQ(config_of(k).label(), "two-phase, prefetch, time budget 0.05, hidden copies");
  k = testing::explicit_knobs();
  k.balance_time_weight = 0.5;
  k.copy_timing = 2;
  k.feplb_dyn_set = 1;
  EXPECT_EQ(config_of(k).label(),
            "two-phase, placement's sets, time blend 0.5, exposed copies before the donor");
  k.balance_time_weight = 1;
  k.copy_timing = 0;
  EXPECT_EQ(config_of(k).label(), "two-phase, placement's sets, time, copy time ignored");
}

// One-hop plans before the dispatch: every local expert is a candidate, whatever feplb_dyn_set and
// dyn_cover say; the config says so, and switching the path back restores the two-phase set.
TEST(FeplbConfig, OneHopTakesEveryLocalExpertAndSaysSo) {
  Knobs k = testing::explicit_knobs();
  k.one_hop = 1;
  k.copy_timing = 3;
  k.feplb_dyn_set = 1;
  FeplbConfig c = config_of(k);  // dyn_cover keeps its default (1.5): not an error
  EXPECT_EQ(c.label(), "one-hop, rows, late copies by the busiest");
  EXPECT_EQ(c.candidate_set(), FeplbCandidates::kEveryLocal);
  EXPECT_EQ(c.candidate_cover(), 0.0);
  EXPECT_NE(c.describe().find("every local expert"), std::string::npos) << c.describe();
  EXPECT_NE(c.describe().find("--feplb-dyn-set and --dyn-cover apply to two-phase plans only"),
            std::string::npos)
      << c.describe();
  c.path = FeplbPath::kTwoPhase;
  EXPECT_EQ(c.candidate_set(), FeplbCandidates::kPlacementSets);
  EXPECT_EQ(c.candidate_cover(), 1.5);
  EXPECT_EQ(c.describe().find("every local expert"), std::string::npos) << c.describe();
}

TEST(FeplbConfig, BadValuesAndContradictionsNameTheFlag) {
  const auto error_for = [](auto set) {
    Knobs k = testing::explicit_knobs();
    set(k);
    return input_error([&] { config_of(k); });
  };
  EXPECT_NE(error_for([](Knobs& k) { k.copy_timing = 4; }).find("--copy-timing"),
            std::string::npos);
  EXPECT_NE(error_for([](Knobs& k) { k.feplb_dyn_set = 2; }).find("--feplb-dyn-set"),
            std::string::npos);
  EXPECT_NE(error_for([](Knobs& k) { k.one_hop = 2; }).find("--one-hop"), std::string::npos);
  EXPECT_NE(error_for([](Knobs& k) { k.prefetch = 2; }).find("--prefetch"), std::string::npos);
  EXPECT_NE(error_for([](Knobs& k) { k.min_slice_rows = 0; }).find("--min-slice-rows"),
            std::string::npos);
  EXPECT_NE(error_for([](Knobs& k) { k.slice_align_rows = 0; }).find("--slice-align-rows"),
            std::string::npos);
  // The budget tries its own blends: a weight beside it cannot be meant.
  EXPECT_NE(error_for([](Knobs& k) {
              k.balance_time_weight = 0.5;
              k.time_balance_budget = 0.05;
            }).find("--balance-time-weight"),
            std::string::npos);
  // Timing copies or balancing time needs a cost model; rows with copy time ignored does not.
  EXPECT_NE(input_error([] {
              FeplbConfig::from_knobs(testing::explicit_knobs(), false);
            }).find("--copy-timing 1"),
            std::string::npos);
  Knobs untimed = testing::explicit_knobs();
  untimed.copy_timing = 0;
  EXPECT_EQ(input_error([&] { FeplbConfig::from_knobs(untimed, false); }), "");
  untimed.balance_time_weight = 1;
  EXPECT_NE(input_error([&] { FeplbConfig::from_knobs(untimed, false); }).find("GEMM cost model"),
            std::string::npos);
  // A hand-made mode: a time blend needs its weight; two-phase keeps static experts.
  FeplbConfig c = config_of(testing::explicit_knobs());
  c.balance = FeplbBalance::kTimeBlend;
  EXPECT_NE(input_error([&] { c.validate(true); }).find("--balance-time-weight"),
            std::string::npos);
  c.time_weight = 0.25;
  EXPECT_EQ(input_error([&] { c.validate(true); }), "");
  c.candidates = FeplbCandidates::kEveryLocal;
  EXPECT_NE(input_error([&] { c.validate(true); }).find("one-hop's rule"), std::string::npos);
  c.path = FeplbPath::kOneHop;
  EXPECT_EQ(input_error([&] { c.validate(true); }), "");
}

// A GEMM of r rows takes r us: hand examples in round numbers.
class MicrosecondPerRow final : public GemmCostModel {
 public:
  double expert_ms(int64_t rows) const override {
    return rows <= 0 ? 0.0 : static_cast<double>(rows) * 1e-3;
  }
};

// One expert per GPU with these rows: GPU g's own work takes counts[g] us.
struct RuleBench {
  explicit RuleBench(std::vector<int64_t> rows)
      : counts(std::move(rows)),
        topo(Topology::contiguous(static_cast<int>(counts.size()), static_cast<int>(counts.size()),
                                  static_cast<int>(counts.size()))),
        measure(&cost) {}
  // Each GPU's own GEMM time, what the rules start from.
  std::vector<double> own_ms() const {
    std::vector<double> ms, out;
    for (const int64_t c : counts) ms.push_back(measure.gemm_ms(c));
    feplb_detail::own_ms_at_home(topo, ms, out);
    return out;
  }
  std::vector<int64_t> counts;
  Topology topo;
  MicrosecondPerRow cost;
  LoadMeasure measure;
};

// rows_shedding() and rows_within() against their definitions, row by row, on the roofline
// (wave-quantised steps, never decreasing) and on a measured table that dips (its units fall
// there for the larger time weights): where the predicate turns once over the rows, the one
// answer; where it turns more often, one where it turns, as a bisection finds.
TEST(FeplbLoadMeasure, ShedAndWithinRowsMatchTheirDefinitions) {
  const ExpertShape shape{.hidden = 2048, .ffn = 768, .dtype = Dtype::kBf16};
  const RooflineCostModel roofline(shape, Knobs{});
  // 0.20 ms at 512 rows, 0.12 at 640: a dip.
  const TableCostModel dipping({64, 512, 640, 4096}, {0.05, 0.20, 0.12, 1.0}, shape, "test");
  // Nearly flat at large row counts: one row is a tiny unit, the units reach ~1e11 (no table).
  const TableCostModel flat({64, 4096, 16384}, {0.05, 1.0, 1.0000001}, shape, "test");
  // The answer for predicate `p` over [0, n): the first x where it holds (n if none) when it
  // turns once, else any x where it turns.
  const auto check = [](int64_t n, int64_t x, const auto& p) {
    ASSERT_TRUE(x >= 0 && x <= n) << x;
    int64_t first = 0, turns = 0;
    while (first < n && !p(first)) ++first;
    for (int64_t y = first; y + 1 < n; ++y) turns += p(y) && !p(y + 1);
    if (turns == 0) {
      ASSERT_EQ(x, first);
    } else {
      ASSERT_TRUE(x == n || p(x)) << x;
      ASSERT_TRUE(x == 0 || !p(x - 1)) << x;
    }
  };
  int turning = 0;  // cases whose predicate turns more than once (the search's)
  for (const GemmCostModel* cost :
       {static_cast<const GemmCostModel*>(&roofline), static_cast<const GemmCostModel*>(&dipping),
        static_cast<const GemmCostModel*>(&flat)}) {
    for (const double weight : {0.1, 0.5, 1.0}) {
      LoadMeasure m(cost);
      m.set_time_weight(weight);
      for (const int64_t held : {0, 1, 7, 300, 641, 2000}) {
        for (int64_t u = -3; u <= m.units(held) + 3; u += 1 + m.units(held) / 97) {
          SCOPED_TRACE(::testing::Message()
                       << (cost == &roofline  ? "roofline"
                           : cost == &dipping ? "dipping"
                                              : "flat")
                       << " weight " << weight << " held " << held << " u " << u);
          const auto sheds = [&](int64_t s) { return m.units(held) - m.units(held - s) >= u; };
          check(held, m.rows_shedding(held, u), sheds);
          // rows_within(u, limit) is one less than the first s that is more than `limit` rows or
          // more than u units.
          const int64_t limit = held;
          const auto over = [&](int64_t s) { return s > limit || m.units(s) > u; };
          if (u <= 0) {
            ASSERT_EQ(m.rows_within(u, limit), 0);
          } else {
            check(limit + 1, m.rows_within(u, limit) + 1, over);
          }
          int64_t y = 0;
          while (y < held && !sheds(y)) ++y;
          while (y + 1 < held && !(sheds(y) && !sheds(y + 1))) ++y;
          turning += y + 1 < held;
        }
      }
    }
  }
  EXPECT_GT(turning, 0);  // the dipping table reached the search
}

// The planner's one table by row count stands in for the cost model exactly: the schedule
// writer's GEMM times (TabledGemmCost) are the cost model's, and a step's loads, from the step's
// array of GEMM times (Loads::expert_ms), are its blend's units; a new step (or a plan outside
// one) reads its own counts, not the last step's.
TEST(FeplbLoadMeasure, OneTableGivesTheCostModelsNumbers) {
  const ExpertShape shape{.hidden = 2048, .ffn = 768, .dtype = Dtype::kBf16};
  const RooflineCostModel roofline(shape, Knobs{});
  const TableCostModel table({64, 512, 640, 4096}, {0.05, 0.20, 0.12, 1.0}, shape, "test");
  for (const GemmCostModel* cost :
       {static_cast<const GemmCostModel*>(&roofline), static_cast<const GemmCostModel*>(&table)}) {
    LoadMeasure m(cost);
    const feplb_detail::TabledGemmCost tabled(m);
    for (const int64_t rows : {int64_t{-1}, int64_t{0}, int64_t{1}, int64_t{63}, int64_t{700},
                               int64_t{5000}, feplb_detail::kGemmTableRows + 5}) {
      EXPECT_EQ(tabled.expert_ms(rows), cost->expert_ms(rows)) << rows;
    }
    // Two GPUs of two experts each; the home loads of each step, plan by plan.
    const Topology topo = Topology::contiguous(2, 2, 4);
    Loads loads(cost);
    const auto expected = [&](const RoutingStep& r, double weight) {
      LoadMeasure fresh(cost);
      fresh.set_time_weight(weight);
      std::vector<int64_t> load(2, 0);
      for (int e = 0; e < 4; ++e) load[topo.home(e)] += fresh.units(r.expert_counts[e]);
      return load;
    };
    RoutingStep a(0, 0, 2, 4), b(1, 0, 2, 4);
    a.expert_counts = {900, 3, 4100, 64};
    b.expert_counts = {10, 2500, 0, 700};
    loads.begin_step();
    for (const double weight : {0.5, 0.1, 1.0}) {
      loads.start(topo, a, weight, -1);
      EXPECT_EQ(loads.load, expected(a, weight)) << weight;
    }
    loads.end_step();
    loads.begin_step();
    loads.start(topo, b, 0.25, -1);
    EXPECT_EQ(loads.load, expected(b, 0.25));
    loads.end_step();
    loads.start(topo, a, 0.25, -1);  // outside a step
    EXPECT_EQ(loads.load, expected(a, 0.25));
    loads.start(topo, b, 0.25, -1);
    EXPECT_EQ(loads.load, expected(b, 0.25));
  }
}

TEST(FeplbCopyRules, IgnoreTakesAnyCopy) {
  RuleBench b({1000, 200, 100});
  IgnoreCopyTime rule;
  rule.start(b.topo, b.measure, b.own_ms());
  EXPECT_FALSE(IgnoreCopyTime::kTimed);
  EXPECT_TRUE(rule.fits(1000, 0, 1, 900, 100.0));  // lands long after every GPU is done
  EXPECT_EQ(rule.window_ms(1), 0.0);
}

// Hidden: a copy lands while the receiver has work whose copies landed: its own, then each donor's
// guests in landing order.
TEST(FeplbCopyRules, HiddenCopiesLandBehindOwnWorkOrEarlierGuests) {
  RuleBench b({1000, 200, 100, 100});  // GPU 1's own work: 0.2 ms
  HiddenCopies rule;
  rule.start(b.topo, b.measure, b.own_ms());
  EXPECT_TRUE(rule.fits(1000, 0, 1, 100, 0.2));    // within its own work
  EXPECT_FALSE(rule.fits(1000, 0, 1, 100, 0.25));  // after it, and no guests yet
  // Donor 0's 100 rows land at 0.15: GPU 1 runs them from 0.2 to 0.3. Donor 2's 200 rows land at
  // 0.28, within that: they run from 0.3 to 0.5.
  rule.record(1000, 0, 1, 100, true, 0.15);
  EXPECT_TRUE(rule.fits(100, 2, 1, 200, 0.28));
  rule.record(100, 2, 1, 200, true, 0.28);
  EXPECT_DOUBLE_EQ(rule.window_ms(1), 0.5);
  EXPECT_DOUBLE_EQ(rule.own_ms(0), 0.9);         // the donor's own work shrank
  EXPECT_TRUE(rule.fits(100, 3, 1, 50, 0.5));    // donor 3 behind both
  EXPECT_FALSE(rule.fits(100, 3, 1, 50, 0.51));  // after the window
  // Within the window, but donor 0's guests would then wait for a copy landing at 0.35, and GPU 1
  // would idle from 0.2 (donor 2's at 0.28 no longer lands while it has work): not hidden.
  EXPECT_FALSE(rule.fits(900, 0, 1, 100, 0.35));
}

// Exposed before the donor: a late copy is taken if the receiver, waiting and then running its
// guests, finishes before the donor does after giving the rows, and so do its earlier late
// receivers.
TEST(FeplbCopyRules, ExposedCopiesFinishBeforeTheDonor) {
  RuleBench b({1000, 200, 100});
  ExposedBeforeDonor rule;
  rule.start(b.topo, b.measure, b.own_ms());
  // 300 rows landing at 0.5: GPU 1 ends at 0.8, after the donor (1.0 - 0.3 = 0.7).
  EXPECT_FALSE(rule.fits(1000, 0, 1, 300, 0.5));
  EXPECT_TRUE(rule.fits(1000, 0, 1, 200, 0.5));  // 0.7 <= 0.8
  rule.record(1000, 0, 1, 200, true, 0.5);       // GPU 1 now ends at 0.7, the donor at 0.8
  // To GPU 2, landing at 0.4: 100 rows leave the donor at 0.7, as late as GPU 1 (kept); 150 rows
  // would leave it at 0.65, before GPU 1 finishes.
  EXPECT_TRUE(rule.fits(800, 0, 2, 100, 0.4));
  EXPECT_FALSE(rule.fits(800, 0, 2, 150, 0.4));
  EXPECT_TRUE(rule.fits(800, 0, 2, 150, 0.1));  // within GPU 2's own work: hidden
}

// Late by the busiest: a late copy is taken if the receiver, its own work, the wait and its guests
// included, finishes by the GEMM time of the busiest GPU that gives nothing away.
TEST(FeplbCopyRules, LateCopiesFinishByTheBusiestNonDonor) {
  RuleBench b({1000, 400, 100, 100});  // target 400: GPUs 1-3 give nothing away
  Loads loads(&b.cost);
  loads.load = b.counts;
  LateByBusiest rule;
  rule.start(b.topo, b.measure, b.own_ms());
  const std::vector<int64_t> targets = {400};
  rule.targets_set(b.topo, loads, targets, 0);
  EXPECT_DOUBLE_EQ(rule.finish_by_ms(0), 0.4);  // GPU 1's own work
  // 200 rows into GPU 2 (own work 0.1) landing at 0.15: it waits, then ends at 0.35.
  EXPECT_TRUE(rule.fits(1000, 0, 2, 200, 0.15));
  EXPECT_FALSE(rule.fits(1000, 0, 2, 200, 0.25));  // would end at 0.45
  rule.record(1000, 0, 2, 200, true, 0.15);
  EXPECT_FALSE(rule.fits(800, 0, 2, 100, 0.15));  // its guests now take 0.2: 0.45
  EXPECT_TRUE(rule.fits(800, 0, 2, 50, 0.15));    // 0.4
}

// Knob sets covering every explicit mode of the knobs (feplb_plan_dump's grid, in short).
std::vector<Knobs> explicit_modes() {
  std::vector<Knobs> out;
  for (int64_t timing = 0; timing <= 3; ++timing) {
    for (int64_t one_hop = 0; one_hop <= 1; ++one_hop) {
      for (int64_t prefetch = 0; prefetch <= 1; ++prefetch) {
        Knobs k = testing::explicit_knobs();
        k.copy_timing = timing;
        k.one_hop = one_hop;
        k.prefetch = prefetch;
        k.prefetch_window_us = 500;
        out.push_back(k);
      }
    }
  }
  for (const double weight : {1.0, 0.5}) {
    Knobs k = testing::explicit_knobs();
    k.balance_time_weight = weight;
    k.prefetch_window_us = 500;
    out.push_back(k);
  }
  for (const int64_t one_hop : {0, 1}) {
    Knobs k = testing::explicit_knobs();
    k.time_balance_budget = 0.05;
    k.prefetch = 1;
    k.one_hop = one_hop;
    k.prefetch_window_us = 500;
    out.push_back(k);
  }
  return out;
}

std::vector<RoutingStep> engine_steps() {
  std::vector<RoutingStep> steps;
  for (uint64_t seed = 1; seed <= 6; ++seed)
    steps.push_back(testing::random_step(16, 128, 8, 2048, 4.0, seed));
  return steps;
}

// plan_with(the knobs' mode) gives the `feplb` policy's bytes, step after step (prefetches
// predicted from the same plans).
TEST(FeplbEngine, PlanWithTheKnobsModeGivesThePoliciesBytes) {
  const std::vector<RoutingStep> steps = engine_steps();
  for (const Knobs& k : explicit_modes()) {
    testing::Bench b(16, 8, 128, k);
    const PlannerContext ctx{b.topo, b.shape, k, b.cost.get()};
    const FeplbConfig mode = FeplbConfig::from_knobs(k, true);
    auto planner = make_planner("feplb", ctx);
    FeplbEngine engine(ctx);
    Plan by_policy, by_engine;
    int64_t moved = 0;
    for (const RoutingStep& s : steps) {
      planner->plan(s, by_policy);
      engine.plan_with(mode, s, by_engine);
      ASSERT_EQ(serialize(by_engine), serialize(by_policy)) << mode.label();
      moved += static_cast<int64_t>(by_engine.slices.size());
      planner->observe(s);
      if (mode.prefetch == FeplbPrefetch::kOn) engine.record(s.layer, by_engine);
    }
    EXPECT_GT(moved, static_cast<int64_t>(steps.size()) * 128) << mode.label();  // some split
  }
}

// One engine planning every step in every mode, in a different order each step, gives each mode
// the bytes an engine of its own gives: no mode leaves state another reads (the predictions both
// see come from the same recorded plans).
TEST(FeplbEngine, ModesPlannedInAnyOrderOnOneEngineGiveTheirOwnBytes) {
  const std::vector<RoutingStep> steps = engine_steps();
  const std::vector<Knobs> knobs = explicit_modes();
  testing::Bench b(16, 8, 128, knobs[0]);
  std::vector<FeplbConfig> modes;
  std::vector<std::unique_ptr<FeplbEngine>> alone;
  for (const Knobs& k : knobs) {
    modes.push_back(FeplbConfig::from_knobs(k, true));
    alone.push_back(
        std::make_unique<FeplbEngine>(PlannerContext{b.topo, b.shape, k, b.cost.get()}));
  }
  FeplbEngine shared(PlannerContext{b.topo, b.shape, knobs[0], b.cost.get()});
  Knobs predicting = testing::explicit_knobs();
  predicting.prefetch = 1;
  const FeplbConfig predictor = FeplbConfig::from_knobs(predicting, true);
  Plan plan, reference, recorded;
  for (size_t step = 0; step < steps.size(); ++step) {
    const RoutingStep& s = steps[step];
    for (size_t i = 0; i < modes.size(); ++i) {
      const size_t m = step % 2 == 0 ? i : modes.size() - 1 - i;
      shared.plan_with(modes[m], s, plan);
      alone[m]->plan_with(modes[m], s, reference);
      ASSERT_EQ(serialize(plan), serialize(reference)) << modes[m].label() << " step " << step;
    }
    // Every engine's prediction: from the plan two-phase with prefetch and hidden copies.
    shared.plan_with(predictor, s, recorded);
    shared.record(s.layer, recorded);
    for (auto& engine : alone) engine->record(s.layer, recorded);
  }
}

// The time budget's tries on 24 random steps at EP=16 with Qwen3-30B-sized experts, whose GEMMs'
// fixed cost makes rows and time differ most; the knobs' mode (both tries) at a budget of 0.05.
class FeplbTimeBudgetTries : public ::testing::Test {
 protected:
  static Knobs budget_knobs() {
    Knobs k = testing::explicit_knobs();
    k.time_balance_budget = 0.05;
    return k;
  }
  FeplbTimeBudgetTries() {
    for (uint64_t seed = 1; seed <= 24; ++seed)
      steps.push_back(testing::random_step(16, 128, 8, 4096, 3.0, seed));
  }
  std::vector<RoutingStep> steps;
  const Knobs k = budget_knobs();
  const testing::Bench b{16, 8, 128, k,
                         ExpertShape{.hidden = 2048, .ffn = 768, .dtype = Dtype::kBf16}};
  FeplbEngine engine{PlannerContext{b.topo, b.shape, k, b.cost.get()}};
};

// The time budget's two tries alone (the chooser's candidates) and both (the knob's mode): both
// keeps the blends' plan or the capped plan, so its bytes are one of theirs, and its GEMM
// straggler is never above the blends'.
TEST_F(FeplbTimeBudgetTries, AloneAndBoth) {
  FeplbConfig both = FeplbConfig::from_knobs(k, true), blends = both, capped = both;
  blends.budget_tries = FeplbBudgetTries::kBlends;
  capped.budget_tries = FeplbBudgetTries::kCapped;
  EXPECT_EQ(blends.label(), "two-phase, time budget 0.05 (blends), hidden copies");
  Plan p_both, p_blends, p_capped;
  int from_capped = 0;
  for (const RoutingStep& s : steps) {
    engine.plan_with(both, s, p_both);
    engine.plan_with(blends, s, p_blends);
    engine.plan_with(capped, s, p_capped);
    if (serialize(p_both) == serialize(p_blends)) continue;
    ASSERT_EQ(serialize(p_both), serialize(p_capped)) << "layer " << s.layer;
    ++from_capped;
  }
  EXPECT_GT(from_capped, 0) << "the capped try never won: the test no longer tells them apart";
}

// All tries (the chooser's time candidates): both tries and rows levelled, the plan with the lowest
// GEMM straggler kept. Its plan is one of both's or rows levelled's (the capped try's fallback,
// kept where it is also the capped plan's), and never has a higher GEMM straggler than both's.
TEST_F(FeplbTimeBudgetTries, AllKeepRowsWhereTheyAreBetter) {
  FeplbConfig both = FeplbConfig::from_knobs(k, true), all = both, capped = both;
  all.budget_tries = FeplbBudgetTries::kAll;
  capped.budget_tries = FeplbBudgetTries::kCapped;
  EXPECT_EQ(all.label(), "two-phase, time budget 0.05 (or rows), hidden copies");
  const auto straggler_ms = [&](const Plan& p) {  // the engine's plans, scheduled as plan() does
    Plan scheduled = p;
    ScheduleWriter().write(scheduled, b.topo, k, *b.cost);
    return measure_plan(scheduled, b.topo, *b.cost, 0.0).gemm_straggler_ms;
  };
  Plan p_both, p_all, p_capped;
  int from_rows = 0;
  for (const RoutingStep& s : steps) {
    engine.plan_with(both, s, p_both);
    engine.plan_with(all, s, p_all);
    engine.plan_with(capped, s, p_capped);
    validate(p_all, b.topo, s, b.shape, PlanLimits{});
    if (serialize(p_all) == serialize(p_both)) continue;
    // Not both's: rows levelled won against its plan, so it is the capped mode's plan (rows
    // levelled, or the capped try where that is better still).
    ASSERT_EQ(serialize(p_all), serialize(p_capped)) << "layer " << s.layer;
    EXPECT_LT(straggler_ms(p_all), straggler_ms(p_both) + 1e-9);
    ++from_rows;
  }
  EXPECT_GT(from_rows, 0) << "rows never won: the test no longer tells the tries apart";
}

// The blends alone: each step's plan is the blend the documented order gives (the most time
// first: kept, the answer; then the least: not kept, rows; then those between), levelled, checked
// against every blend planned on its own. Where the blends keep within the budget in order (a
// blend nearer rows whenever one nearer time does) that is the most time-weighted one that keeps.
TEST_F(FeplbTimeBudgetTries, BlendsTakeTheMostTimeThatKeepsWithinTheBudget) {
  FeplbConfig blends = FeplbConfig::from_knobs(k, true);
  blends.budget_tries = FeplbBudgetTries::kBlends;
  const PlannerContext ctx{b.topo, b.shape, k, b.cost.get()};
  feplb_detail::BalancedPlan plans(ctx);
  feplb_detail::TimeLeveller leveller(ctx);
  const std::span<const double> weights = feplb_detail::TimeBudget::kTimeWeights;
  const int n = static_cast<int>(weights.size());
  Plan got, want, scratch;
  std::vector<int> taken(static_cast<size_t>(n) + 1, 0);  // [blend, or n: rows] steps
  // Budgets from the knob's 0.05 up, so that every outcome occurs.
  for (const double fraction : {0.05, 0.15, 0.4}) {
    blends.time_budget = fraction;
    for (const RoutingStep& s : steps) {
      engine.plan_with(blends, s, got);
      plans.begin_step();
      const double budget = blends.time_budget * plans.unbalanced_row_straggler(s);
      std::vector<bool> keeps;
      for (const double w : weights) {
        plans.plan(blends, w, -1, {}, s, scratch);
        keeps.push_back(plans.row_straggler() <= budget);
      }
      int chosen = n;
      if (keeps[0]) {
        chosen = 0;
      } else if (keeps[static_cast<size_t>(n - 1)]) {
        chosen = n - 1;
        for (int i = 1; i < n - 1 && chosen == n - 1; ++i) {
          if (keeps[static_cast<size_t>(i)]) chosen = i;
        }
      }
      if (std::is_sorted(keeps.begin(), keeps.end())) {  // in order: not kept, ..., kept, ...
        EXPECT_EQ(chosen, std::find(keeps.begin(), keeps.end(), true) - keeps.begin())
            << "layer " << s.layer;
      }
      plans.plan(blends, chosen < n ? weights[static_cast<size_t>(chosen)] : 0.0, -1, {}, s, want);
      leveller.level(blends, plans.measure(), static_cast<int64_t>(std::floor(budget)), want);
      plans.end_step();
      ASSERT_EQ(serialize(got), serialize(want))
          << "budget " << fraction << ", layer " << s.layer << ", blend " << chosen;
      ++taken[static_cast<size_t>(chosen)];
    }
  }
  // Every outcome occurs: the most time kept (one plan), one between, the least, none (rows).
  for (int i = 0; i <= n; ++i) EXPECT_GT(taken[static_cast<size_t>(i)], 0) << "outcome " << i;
}

// One hop refined from the previous micro-batch (knob one_hop_refine): a layer's first
// micro-batch gets the full one-hop plan; the later ones re-split their rows over the previous
// plan's helpers: every row computed once (validate), the prefetch() copies listed, a helper's
// slice at least min_slice_rows, made before the dispatch, the same bytes when planned again.
TEST(FeplbRefinedOneHop, RefinesThePreviousPlansHelpersOnTheNewCounts) {
  const Knobs k = testing::refined_one_hop_knobs();
  testing::Bench b(16, 8, 128, k);
  const PlannerContext ctx{b.topo, b.shape, k, b.cost.get()};
  auto planner = make_planner("feplb", ctx);
  const std::vector<RoutingStep> steps = engine_steps();
  Plan plan, again;
  int64_t guest_rows = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    const RoutingStep& s = steps[i];
    const std::span<const Copy> p = planner->prefetch(s.layer);
    const std::vector<Copy> predicted(p.begin(), p.end());
    planner->plan(s, plan);
    validate(plan, b.topo, s, b.shape, planner->limits());
    EXPECT_TRUE(plan.planned_before_dispatch);
    planner->plan(s, again);
    EXPECT_EQ(serialize(plan), serialize(again));
    std::vector<Copy> listed;
    for (const Copy& c : plan.copies) {
      if (c.kind == CopyKind::kPrefetchWeights) listed.push_back(c);
    }
    ASSERT_EQ(listed.size(), predicted.size()) << "micro-batch " << i;
    for (size_t j = 0; j < listed.size(); ++j) {
      EXPECT_EQ(listed[j].expert, predicted[j].expert);
      EXPECT_EQ(listed[j].dst_gpu, predicted[j].dst_gpu);
    }
    const bool refined = plan.mode.find("refined") != std::string::npos;
    EXPECT_EQ(refined, i > 0) << plan.mode;
    for (const Slice& sl : plan.slices) {
      if (!refined || sl.gpu == b.topo.home(sl.expert)) continue;
      EXPECT_GE(sl.rows, k.min_slice_rows);
      guest_rows += sl.rows;
    }
    planner->observe(s);
  }
  EXPECT_GT(guest_rows, 0)
      << "no refined plan moved a row: the test no longer tests the refinement";
}

// Each GPU's candidates are its busiest experts, ties to the lower index, at every number of local
// experts (each counted by the experts busier than it up to 8, by insertion up to 32, by sorting
// beyond), with and without the cover that widens a set, on counts full of ties.
TEST(FeplbCandidateSets, BusiestFirstTiesToTheLowerIndex) {
  std::mt19937_64 rng(0xca4d);
  int checked_widened = 0;
  for (const int local_n : {1, 2, 3, 4, 5, 7, 8, 9, 16, 32, 33, 40}) {
    const int ranks = 6, experts = ranks * local_n;
    // A placement that does not list a GPU's experts in index order.
    std::vector<int> home(static_cast<size_t>(experts));
    for (int e = 0; e < experts; ++e) home[e] = e % ranks;
    const Topology topo = Topology::with_placement(ranks, ranks, home);
    Knobs knobs = testing::explicit_knobs();
    const RooflineCostModel cost(testing::glm5(), knobs);
    const PlannerContext ctx{topo, testing::glm5(), knobs, &cost};
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<int64_t> counts(static_cast<size_t>(experts));
      for (int64_t& c : counts) c = static_cast<int64_t>(rng() % 4) * (rng() % 3 == 0 ? 100 : 1);
      std::vector<int64_t> rows_at(static_cast<size_t>(ranks), 0);
      for (int e = 0; e < experts; ++e) rows_at[topo.home(e)] += counts[e];
      FeplbConfig mode;
      mode.dyn = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(local_n));
      mode.dyn_cover = trial % 2 == 0 ? 0.0 : 0.9;
      feplb_detail::CandidateSets sets;
      std::vector<uint8_t> dynamic(static_cast<size_t>(experts), 0);
      sets.choose(ctx, mode, counts, rows_at, dynamic);

      const double mean =
          static_cast<double>(std::accumulate(rows_at.begin(), rows_at.end(), int64_t{0})) / ranks;
      std::vector<uint8_t> want_dynamic(static_cast<size_t>(experts), 0);
      for (int g = 0; g < ranks; ++g) {
        std::vector<int> order(topo.local_experts(g).begin(), topo.local_experts(g).end());
        std::sort(order.begin(), order.end(), [&](int a, int b) {
          return counts[a] != counts[b] ? counts[a] > counts[b] : a < b;
        });
        const int per_gpu = static_cast<int>(std::min<int64_t>(mode.dyn, local_n));
        int n = per_gpu;
        const double wanted = mode.dyn_cover > 0 && per_gpu < local_n
                                  ? mode.dyn_cover * (static_cast<double>(rows_at[g]) - mean)
                                  : 0.0;
        if (wanted > 0) {
          int64_t rows = 0;
          int num = 0;
          for (; num < local_n - 1 && (num < n || static_cast<double>(rows) < wanted); ++num)
            rows += counts[order[num]];
          checked_widened += num > n ? 1 : 0;
          n = std::max(n, num);
        }
        ASSERT_EQ(sets.end(g) - sets.begin(g), n) << "local " << local_n << " GPU " << g;
        for (int i = 0; i < n; ++i) {
          EXPECT_EQ(sets.at(sets.begin(g) + i), order[i]) << "local " << local_n << " GPU " << g;
          want_dynamic[order[i]] = 1;
        }
      }
      EXPECT_EQ(dynamic, want_dynamic) << "local " << local_n;
    }
  }
  EXPECT_GT(checked_widened, 0) << "no set was widened: the cover is not tested";
}

TEST(FeplbRefinedOneHop, NeedsOneHop) {
  Knobs k = testing::explicit_knobs();
  k.one_hop = 0;
  k.one_hop_refine = 1;
  testing::Bench b(16, 8, 128, k);
  const PlannerContext ctx{b.topo, b.shape, k, b.cost.get()};
  EXPECT_EQ(input_error([&] { make_planner("feplb", ctx); }),
            "one_hop_refine: 1 needs one_hop = 1, not 0");
}

}  // namespace
}  // namespace feplb
