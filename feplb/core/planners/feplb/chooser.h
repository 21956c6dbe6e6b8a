// FeplbChooser: the `feplb` policy when it chooses its own mode (the knobs' default: one_hop,
// prefetch, copy_timing and time_balance_budget at -1). Per layer it keeps a mode, plans each
// micro-batch once in it, and revises it from what the plans of the same counts in other modes
// would have cost (docs/planners.md, "How feplb chooses its mode").
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "feplb/core/copy_links.h"
#include "feplb/core/fork_join.h"
#include "feplb/core/plan.h"
#include "feplb/core/planners/feplb/config.h"
#include "feplb/core/planners/feplb/engine.h"
#include "feplb/core/planners/planner.h"

namespace feplb {

// Which of feplb's mode switches the knobs leave to the chooser (each at -1).
struct FeplbAuto {
  bool path = false, prefetch = false, balance = false, copy_rule = false;
  bool any() const { return path || prefetch || balance || copy_rule; }
  static FeplbAuto from_knobs(const Knobs& knobs);
};

// A plan's modelled cost for the chooser: the layer time it adds (GEMM straggler + exposed copy
// time from its schedule + the plan's latency where the dispatch waits for it, the reserve) and
// its token straggler within the NVLink domains.
struct PlanCost {
  double layer_ms = 0;
  double token_straggler = 0;
};
// Reads `plan`'s schedule (written) and slices; `plan_latency_ms` is charged when the plan was
// made before the dispatch. No allocation once `gemm_ms` has grown to the GPU count.
PlanCost plan_cost(const Plan& plan, const Topology& topo, double plan_latency_ms,
                   std::vector<double>& gemm_ms, std::vector<int64_t>& rows, double delay_ms = 0);

// The candidate modes the chooser keeps and the rule that moves between them:
//  - candidates: from the switches left to it (every combination of their values below, the
//    others as the knobs set them): path two-phase or one-hop; prefetch on or off; balance rows,
//    or time within token_bound by all of the time budget's tries (FeplbBudgetTries::kAll: the
//    blends, time under the row cap and rows, each levelled, the lowest GEMM straggler of the
//    micro-batch kept; five plans a step: such a mode reserves twice the planner time ahead of
//    its copies, Plan::reserve_us, where the reserve is left to feplb; beyond
//    kAllTriesGpusMax GPUs the blends alone, two plans), up to kTimeGpusMax GPUs, the most
//    measured (a one-hop plan, which the dispatch waits for, is charged its reserve, so a one-hop
//    time candidate wins only where the GEMM time it saves is more); the time budget the
//    chooser's plans take keeps the token straggler summed over its plans within kAimShare of
//    the bound (time_budget_now); copies hidden, or late by the busiest too with one hop and,
//    over several domains of at most kLateTwoPhaseDomainMax GPUs, with two phases;
//  - the first plan of a layer first met by a plan (no history of its own), on its counts: with
//    planner_threads T > 1, T candidates planned side by side on T host threads (ForkJoin: the
//    caller's and T - 1 of the process's, which poll between jobs; fewer where the process may
//    run on fewer cores, charged as T: Plan::extra_plans), each costed (plan_cost), the best
//    kept, in one plan's time: the layer's start mode (where other layers were explored the
//    candidate their pooled sums rank best, below; before any the rule's), then the rule's order
//    alternating between the paths (first_candidates). With T = 1, the planner's very first plan
//    tries the rule's mode and its choice on the other path one after the other (two plans' time,
//    Plan::extra_plans), a later layer's first plan is its start mode alone. Why: the path is
//    where the rule misses by far (at EP=32 with 4 experts per GPU, an OLMoE prior, two-phase
//    left 68% of the token straggler where one hop removed 99%); every candidate in series, 12
//    plans' time on the critical path, cost more than a better mode saves on traces of two
//    micro-batches per layer; and the pooled best of the layers before is not every layer's own
//    (docs/planners.md, "The first plan"). A layer first met by observe() (a history before its
//    plans) starts in the rule's mode and is explored at once: one-hop where a GPU has at most
//    kOneHopExpertsMax experts (two-phase moves a hot expert's rows after the dispatch, into
//    windows one or two static experts do not leave), else two-phase; prefetch on; time where
//    allowed, else rows; copies hidden (two-phase) or late (one-hop);
//  - revision, off the critical path (observe(), after the copies are issued): on every
//    micro-batch up to kExploreAllGpusMax GPUs (its plans take microseconds), else on a layer's
//    first kExploreFirst micro-batches and every kExploreEvery-th after, its counts are planned
//    in every candidate and each plan costed (plan_cost, at this host's planner speed:
//    set_recent_plan_us): the same counts and the same prefetched weights for all (the history
//    records the step's plan after, made again with copy time ignored: the pairs it would use
//    with every weight in place), so the candidates are compared pair by pair. The layer
//    keeps, per candidate, its cost and how often its token straggler passed token_bound x the
//    unbalanced one, over those micro-batches (each new one weighs 1, the older ones kDecay
//    times less per explored micro-batch). Summed over the layers (pooled: the candidates'
//    costs vary between micro-batches far more than their means differ), it plans in the
//    candidate that passed the bound least, then cost least, and moves off its mode only for one
//    that passed it less often (by half a micro-batch per layer), or cost kMoveMargin less (and
//    2 us per explored micro-batch); at a layer's first explored micro-batch without the margin
//    (its mode was a guess). Deterministic: every rank sees the same counts (and the
//    same planner time) and makes the same moves.
class FeplbChooser final : public Planner {
 public:
  static constexpr int kTimeGpusMax = 288;  // the most measured: one domain of 256, 4 of 72
  static constexpr int kAllTriesGpusMax = 16;
  static constexpr int kOneHopExpertsMax = 2;
  // A layer's plans made side by side (its first): a second, measured (one more of 23 first-plan
  // workloads met), would pick a mode its history cannot replay (docs/planners.md).
  static constexpr int kSidePlansPerLayer = 1;
  static constexpr int kExploreFirst = 3;
  static constexpr int kExploreEvery = 8;
  static constexpr int kExploreAllGpusMax = 16;
  static constexpr int kLateTwoPhaseDomainMax = 16;
  static constexpr double kDecay = 0.8;
  static constexpr double kMoveMargin = 0.03;
  static constexpr double kTokenDecay = 0.95;
  static constexpr double kMinBudgetShare = 0.5;
  static constexpr double kAimShare = 0.95;

  FeplbChooser(const PlannerContext& ctx, const FeplbAuto& left);
  std::string_view name() const override { return "feplb"; }
  // Its plans are two-phase or one-hop, whichever the layer's mode is.
  PlanLimits limits() const override;
  void observe(const RoutingStep& routing) override;
  std::span<const Copy> prefetch(int64_t layer) const override;
  // Drops the one-hop candidates (where a two-phase one is left): a layer in a one-hop mode
  // moves to its first mode among the rest, and every layer's tries start again.
  void keep_rows_via_homes() override;
  // Its two-phase candidates' planning time on this host: per candidate, the p90 (and p99) of
  // kProbeSteps - kProbeWarmSteps plans (each with its schedule, as plan() makes it) of
  // synthetic micro-batches (synthetic_step), on a fresh chooser that observes them as plan()'s
  // caller would. Empty where the reserve is the knob's (planner_budget_us set).
  std::vector<ModeTime> measure_mode_times(int64_t rows_per_rank) const override;
  void warm(int64_t max_expert_rows) override;
  // This host's scale from the start-up times (where the reserve is feplb's): the largest of a
  // named two-phase candidate's time over its reserve, at least 1. The plans stay as they are.
  void set_host_times(std::span<const ModeTime> times) override;
  // Where the reserve is feplb's (planner_budget_us -1): `us` over what the rule charges the mode
  // of the layer's last plan is this host's scale (kept while `us` is 0; below 1 on a faster
  // host). The plans are still made for the rule's reserve (on a slower host their copies start
  // later than they modelled); the candidates are costed at the host's scale: a two-phase plan's
  // copies start max(0, scale - 1) x its reserve later, a one-hop plan delays the dispatch by
  // scale x its charge (on a faster host less than its reserve: the dispatch waits for the plan,
  // not the reserve).
  // Given before a micro-batch observed without a plan (the simulation's history at a charged
  // planner time), the exploration of that micro-batch uses it too.
  // Raising the reserve instead (copies planned from when the plan is ready) keeps fewer copies
  // hidden: with every plan taking 250-400 us it left 30-78% of the token straggler removed on
  // small-expert workloads (docs/planners.md, "On the host it runs on").
  void set_recent_plan_us(double us) override { recent_us_ = us; }
  // This host's planner time over the rule's (1 until a time is known).
  double host_scale() const { return host_scale_; }
  static constexpr int kProbeSteps = 136;
  static constexpr int kProbeWarmSteps = 8;
  static constexpr uint64_t kProbeSeed = 0x7e57;

  // The candidate modes, in order (the first modes' rule picks among them).
  std::span<const FeplbConfig> candidates() const { return modes_; }
  // The mode layer `layer` plans in now (its first mode before it has been seen).
  const FeplbConfig& mode_of(int64_t layer) const;

 protected:
  void make_plan(const RoutingStep& routing, Plan& out) override;
  // The layer's last observed micro-batch in the layer's mode, at the time budget make_plan()
  // would give it; no decision state changes (make_plan() sets the layer's).
  bool prime_plan(int64_t layer, Plan& out) override;
  const GemmCostModel& schedule_cost() const override { return engine_.schedule_cost(); }

 private:
  struct Layer {
    int64_t layer = 0;
    int mode = 0;                 // index into modes_
    int64_t seen = 0;             // micro-batches observed
    std::vector<double> cost_ms;  // [modes] decayed sums of plan_cost over the explored ones
    std::vector<double> over;     // [modes] decayed counts of those above the token bound
    double budget = -1;           // the time budget of this micro-batch's plan (-1: none planned)
    int planned = -1;             // the mode of its last plan (-1: none)
  };
  // The layer's state; a new one starts in the mode below (`planning`: met by make_plan()).
  Layer& layer_state(int64_t layer, bool planning);
  // host_scale_ from recent_us_ and the mode of the layer's last plan (its mode before one).
  void update_host_scale(const Layer& l);
  // Whether a layer's micro-batch `seen` (0: its first) is explored.
  bool explores(int64_t seen) const;
  // The summed weight of a layer's explored micro-batches (the scale of its decayed sums).
  double total_weight(const Layer& l) const;
  const Layer* find_layer(int64_t layer) const;
  int first_mode() const;
  // The rule's preference for candidate `mode` (lower first): first_mode() is the lowest.
  int rule_score(int mode) const;
  // Sets the candidates (modes_), their labels and each one's order of tries.
  void set_modes(std::vector<FeplbConfig> modes);
  // On an explored micro-batch: every candidate planned on `routing` at the layer's budget and
  // costed (`now`: the layer's own plan), their decayed sums updated, and the layer's mode moved
  // by the rule above. `bound`: the token-straggler bound in rows.
  void explore(Layer& l, const RoutingStep& routing, const PlanCost& now, double bound);
  // Every layer's decayed sums, summed into pooled_cost_ and pooled_over_; returns their weight
  // (0 before any micro-batch was explored).
  double pool();
  // Whether candidate a beats b on these sums (`half`: the margin in passes of the bound, half a
  // micro-batch per layer pooled; `margin`: in cost), and the best candidate by that order.
  static bool better(std::span<const double> cost, std::span<const double> over, double half, int a,
                     int b, double margin);
  int best_of(std::span<const double> cost, std::span<const double> over, double half) const;
  // What one host thread plans with: its engine (the chooser's own on the caller's thread, a
  // copy with its own copy of the cost model on the others: their tables fill as they plan), its
  // schedule writer and scratch.
  struct Lane {
    std::unique_ptr<GemmCostModel> cost;  // null on the caller's thread
    std::unique_ptr<FeplbEngine> own;     // null on the caller's thread
    FeplbEngine* engine = nullptr;
    ScheduleWriter writer;
    std::vector<double> gemm;
    std::vector<int64_t> rows;
  };
  // A layer's first plan: `count` candidates of first_candidates() planned on `routing` at the
  // layer's budget and costed, side by side on the lanes; the best one's plan left in `out`
  // (`bound`: the token-straggler bound in rows), its plans made in series besides in
  // out.extra_plans.
  int first_plan_mode(const Layer& l, const RoutingStep& routing, double bound, int count,
                      Plan& out);
  // The `count` candidates a layer's first plan tries, into picks_: `start` (the layer's start
  // mode), then the rule's order (rule_score, then index) alternating between the paths, the
  // other path first (where the other path has none left, the start's).
  void first_candidates(int start, int count);
  // Plans `routing` in candidate `mode` (a time budget at `budget`) and costs it, on `lane`.
  // Reads no chooser state a plan changes: the lanes run it side by side.
  PlanCost cost_on(Lane& lane, int mode, double budget, const RoutingStep& routing,
                   Plan& scratch) const;
  PlanCost cost_of(int mode, double budget, const RoutingStep& routing, Plan& scratch) {
    return cost_on(main_, mode, budget, routing, scratch);
  }
  Lane& lane(int thread) { return thread == 0 ? main_ : *lanes_[static_cast<size_t>(thread - 1)]; }
  // Candidate `mode` with its time budget at `budget` (where the chooser sets the balance).
  FeplbConfig mode_at(int mode, double budget) const;
  // What the rule charges candidate `mode`'s plans, us: its reserve, or the knobs' (one-hop).
  double charged_us(int mode) const;
  // The time budget of the plan of `routing`: what keeps the token straggler, summed over the
  // plans of every layer, within kAimShare x the bound x the unbalanced one's sum (the margin
  // is for the micro-batches no plan brings within it), at least kMinBudgetShare of the bound
  // and at most all of it. `unbalanced`: the token straggler of routing's home loads in the
  // domains (unbalanced_straggler).
  double time_budget_now(double unbalanced) const;
  // The token straggler of `routing` without balancing, within the NVLink domains.
  double unbalanced_straggler(const RoutingStep& routing);

  FeplbAuto left_;  // the switches the knobs leave to it
  FeplbEngine engine_;
  std::vector<FeplbConfig> modes_;
  std::vector<std::string> labels_;  // [modes] FeplbConfig::label()
  double bound_ = 0;                 // token_bound
  bool chooses_budget_ = false;      // the time budget is the chooser's (time_balance_budget -1)
  // Its plans' token stragglers and the unbalanced ones, every layer's, summed (the older decayed
  // by kTokenDecay per plan).
  double straggler_sum_ = 0, unbalanced_sum_ = 0;
  double reserve_ms_ = 0;  // the planner's reserve, charged to one-hop plans
  double recent_us_ = 0;   // set_recent_plan_us
  double host_scale_ = 1;  // this host's planner time over the rule's (start-up: at least 1)
  std::vector<Layer> layers_;
  Lane main_;                                 // the caller's thread: engine_, observe()'s plans
  std::vector<std::unique_ptr<Lane>> lanes_;  // [planner_threads - 1] the side threads'
  std::shared_ptr<ForkJoin> side_;  // the process's planner_threads (null: 1, or no lanes)
  // The threads a side-by-side plan is charged for (Plan::extra_plans): planner_threads, or 1
  // where the cost model cannot be copied (its candidates always in series).
  int side_charge_ = 1;
  std::vector<int> picks_;             // first_candidates()
  std::vector<Plan> first_plans_;      // [picks] a first plan's candidates
  std::vector<PlanCost> first_costs_;  // [picks]
  Plan current_, candidate_;
  std::vector<int64_t> home_scratch_;
  std::vector<double> pooled_cost_, pooled_over_;  // pool(): every layer's sums, summed
  int64_t explored_ = 0;                           // micro-batches explored so far, every layer's
};

}  // namespace feplb
