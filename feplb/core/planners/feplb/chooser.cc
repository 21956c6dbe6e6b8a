#include "feplb/core/planners/feplb/chooser.h"

#include <algorithm>
#include <cmath>

#include "feplb/core/error.h"

namespace feplb {
namespace {

// The token straggler within the NVLink domains of per-GPU `rows`: the largest of a GPU's rows
// above its domain's mean.
double domain_straggler(const Topology& topo, const std::vector<int64_t>& rows) {
  const int n = topo.domain_size();
  double worst = 0;
  for (int dom = 0; dom < topo.num_domains(); ++dom) {
    const int first = topo.first_gpu_of_domain(dom);
    int64_t total = 0, most = 0;
    for (int g = first; g < first + n; ++g) {
      total += rows[static_cast<size_t>(g)];
      most = std::max(most, rows[static_cast<size_t>(g)]);
    }
    worst = std::max(worst, static_cast<double>(most) - static_cast<double>(total) / n);
  }
  return worst;
}

}  // namespace

FeplbAuto FeplbAuto::from_knobs(const Knobs& k) {
  // A time blend the user set (balance_time_weight) is a balance of their choosing.
  return {k.one_hop < 0, k.prefetch < 0, k.time_balance_budget < 0 && k.balance_time_weight == 0,
          k.copy_timing < 0};
}

PlanCost plan_cost(const Plan& plan, const Topology& topo, double plan_latency_ms,
                   std::vector<double>& gemm_ms, std::vector<int64_t>& rows, double delay_ms) {
  const Schedule& s = plan.schedule;
  const int R = topo.num_ranks();
  FEPLB_CHECK(s.written(plan.copies.size(), R), "plan_cost: the plan has no schedule");
  gemm_ms.assign(static_cast<size_t>(R), 0.0);
  rows.assign(static_cast<size_t>(R), 0);
  double finish_max = 0, gemm_max = 0, gemm_sum = 0;
  for (int g = 0; g < R; ++g) {
    double ms = s.own_ms[static_cast<size_t>(g)] + s.ready_ms[static_cast<size_t>(g)];
    for (const OwnerTurn& t : s.turns_of(g)) ms += t.gemm_ms;
    gemm_max = std::max(gemm_max, ms);
    gemm_sum += ms;
    finish_max = std::max(finish_max, s.timeline(g, delay_ms).finish_ms);
  }
  for (const Slice& sl : plan.slices) rows[static_cast<size_t>(sl.gpu)] += sl.rows;
  PlanCost c;
  c.layer_ms = (gemm_max - gemm_sum / R) + std::max(0.0, finish_max - gemm_max) +
               (plan.planned_before_dispatch ? plan_latency_ms : 0.0);
  c.token_straggler = domain_straggler(topo, rows);
  return c;
}

FeplbChooser::FeplbChooser(const PlannerContext& ctx, const FeplbAuto& left)
    : Planner(ctx),
      left_(left),
      engine_(ctx_),
      bound_(ctx.knobs.token_bound),
      chooses_budget_(left.balance) {
  const Knobs& k = ctx_.knobs;
  const Topology& topo = ctx_.topo;
  reserve_ms_ = planner_reserve_us(k, topo) * 1e-3;
  // Every combination of the switches left to it; the others as the knobs set them.
  // Time balancing plans a step two or five times, each plan's time growing with the GPUs: where
  // the dispatch waits for the plan (one-hop) the chooser charges it its reserve, so it takes a
  // one-hop time plan only where the GEMM time it saves is more than that (few experts per GPU).
  const bool time_allowed = topo.num_ranks() <= kTimeGpusMax;
  const std::vector<int64_t> hops =
      left.path ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{k.one_hop};
  const std::vector<int64_t> prefetches =
      left.prefetch ? std::vector<int64_t>{1, 0} : std::vector<int64_t>{k.prefetch};
  // Balance: the knob's; or time within the bound by all the budget's tries (the blends, time
  // under the row cap and rows, each levelled: the lowest GEMM straggler of the three, per
  // micro-batch), and rows.
  struct Balance {
    double budget;
    FeplbBudgetTries tries;
  };
  const auto balances = [&] {
    if (!left.balance)
      return std::vector<Balance>{{std::max(k.time_balance_budget, 0.0), FeplbBudgetTries::kBoth}};
    if (!time_allowed) return std::vector<Balance>{{0.0, FeplbBudgetTries::kBoth}};
    // Beyond kAllTriesGpusMax GPUs a plan takes long enough (rows: about 20-50 us at 72 GPUs and
    // 90-180 at 256 on a 2-core VM) that five of them outlast the static experts' window: the
    // blends alone there (two plans and a levelling; on rack EP=72 they reach the GEMM straggler
    // of all tries, the capped try 40% more).
    const FeplbBudgetTries tries =
        topo.num_ranks() <= kAllTriesGpusMax ? FeplbBudgetTries::kAll : FeplbBudgetTries::kBlends;
    return std::vector<Balance>{{bound_, tries}, {0.0, FeplbBudgetTries::kBoth}};
  }();
  std::vector<FeplbConfig> modes;
  for (int64_t hop : hops) {
    for (int64_t pre : prefetches) {
      for (const Balance& balance : balances) {
        // Copies: with one hop late by the busiest (the rows are there already: a GPU with
        // little work of its own may wait for the weights) or hidden; with two phases hidden,
        // and also late by the busiest over several small domains (kLateTwoPhaseDomainMax GPUs
        // or fewer each): with few experts per GPU a hot expert's copy cannot land inside the
        // window the static experts leave, and one hop, which sends its rows in the dispatch,
        // makes the dispatch wait for its plan. In one large domain a late plan takes 1.3-1.8x
        // a hidden one (bench/results/chooser-two-phase-late-ab.txt), past the planner's budget.
        const bool late_two_phase =
            topo.num_domains() > 1 && topo.domain_size() <= kLateTwoPhaseDomainMax;
        const std::vector<int64_t> timings = !left.copy_rule  ? std::vector<int64_t>{k.copy_timing}
                                             : hop            ? std::vector<int64_t>{3, 1}
                                             : late_two_phase ? std::vector<int64_t>{1, 3}
                                                              : std::vector<int64_t>{1};
        for (int64_t timing : timings) {
          Knobs m = k;
          m.one_hop = hop;
          m.prefetch = pre;
          m.time_balance_budget = balance.budget;
          m.copy_timing = timing;
          modes.push_back(FeplbConfig::from_knobs(m, ctx_.cost != nullptr));
          FeplbConfig& mode = modes.back();
          mode.budget_tries = balance.tries;
          // Where the reserve is the chooser's (the knob at -1): a two-phase mode reserves
          // kDefaultReservePerUnitUs (copy_links.h: its p99); all tries plan a step four or five
          // times, the blends alone one or three times (time_budget.h), so a time mode reserves
          // twice the time when it makes all tries (two-phase: its copies start later) or when
          // the dispatch waits for it (one-hop: the chooser charges it so).
          if (k.planner_budget_us < 0) {
            const bool twice =
                mode.balance == FeplbBalance::kTimeBudget &&
                (mode.budget_tries == FeplbBudgetTries::kAll || mode.path == FeplbPath::kOneHop);
            if (mode.path == FeplbPath::kTwoPhase)
              mode.reserve_us =
                  (twice ? 2 : 1) * planner_reserve_us(k, topo, kDefaultReservePerUnitUs);
            else if (twice)
              mode.reserve_us = 2 * planner_reserve_us(k, topo);
          }
        }
      }
    }
  }
  set_modes(std::move(modes));
  // The side threads, each with an engine of its own on its own copy of the cost model (a model
  // that cannot be copied: the candidates in series, on the caller's thread), as many as the host
  // lets this process run at once: the plans are the same either way, and a plan is charged as
  // on a host with a core for each of planner_threads (Plan::extra_plans).
  main_.engine = &engine_;
  const bool copies = modes_.size() > 1 && ctx_.cost->clone() != nullptr;
  side_charge_ = copies ? static_cast<int>(k.planner_threads) : 1;
  const int threads = copies ? std::min(side_charge_, ForkJoin::usable_cores()) : 1;
  for (int t = 1; t < threads; ++t) {
    auto lane = std::make_unique<Lane>();
    lane->cost = ctx_.cost->clone();
    PlannerContext side = ctx_;
    side.cost = lane->cost.get();
    side.cost_owner = nullptr;
    lane->own = std::make_unique<FeplbEngine>(side);
    lane->engine = lane->own.get();
    lanes_.push_back(std::move(lane));
  }
  if (threads > 1) side_ = ForkJoin::shared(threads);
}

void FeplbChooser::set_modes(std::vector<FeplbConfig> modes) {
  FEPLB_CHECK(!modes.empty(), "feplb chooser: no candidate mode");
  modes_ = std::move(modes);
  labels_.clear();
  for (const FeplbConfig& m : modes_) labels_.push_back(m.label());
}

void FeplbChooser::keep_rows_via_homes() {
  std::vector<FeplbConfig> kept;
  std::vector<int> index(modes_.size(), -1);  // old mode -> new, -1: dropped
  for (size_t i = 0; i < modes_.size(); ++i) {
    if (modes_[i].path == FeplbPath::kOneHop) continue;
    index[i] = static_cast<int>(kept.size());
    kept.push_back(modes_[i]);
  }
  if (kept.empty() || kept.size() == modes_.size()) return;
  set_modes(std::move(kept));
  for (Layer& l : layers_) {
    const int now = index[static_cast<size_t>(l.mode)];
    l.mode = now >= 0 ? now : first_mode();
    l.seen = 0;  // explore the candidates left from the next micro-batch
    l.cost_ms.assign(modes_.size(), 0.0);
    l.over.assign(modes_.size(), 0.0);
  }
}

int FeplbChooser::rule_score(int mode) const {
  // Lower is preferred: the path the rule names, prefetch on, time where allowed (the candidates
  // hold it only where it is), copies as the path suggests (the candidates' own).
  const bool one_hop = ctx_.topo.experts_per_rank() <= kOneHopExpertsMax;
  const FeplbConfig& m = modes_[static_cast<size_t>(mode)];
  return (m.path == (one_hop ? FeplbPath::kOneHop : FeplbPath::kTwoPhase) ? 0 : 4) +
         (m.prefetch == FeplbPrefetch::kOn ? 0 : 2) + (m.balance == FeplbBalance::kRows ? 1 : 0);
}

int FeplbChooser::first_mode() const {
  int best = 0;
  for (int i = 1; i < static_cast<int>(modes_.size()); ++i) {
    if (rule_score(i) < rule_score(best)) best = i;
  }
  return best;
}

const FeplbChooser::Layer* FeplbChooser::find_layer(int64_t layer) const {
  for (const Layer& l : layers_) {
    if (l.layer == layer) return &l;
  }
  return nullptr;
}

FeplbChooser::Layer& FeplbChooser::layer_state(int64_t layer, bool planning) {
  for (Layer& l : layers_) {
    if (l.layer == layer) return l;
  }
  Layer l;
  l.layer = layer;
  // A layer first met by a plan: what the layers explored so far found best (the pooled sums, as
  // the revision ranks them); before any, and for a layer first met by observe(), the rule.
  l.mode = planning && pool() > 0
               ? best_of(pooled_cost_, pooled_over_, 0.5 * static_cast<double>(layers_.size()))
               : first_mode();
  l.cost_ms.assign(modes_.size(), 0.0);
  l.over.assign(modes_.size(), 0.0);
  layers_.push_back(std::move(l));
  return layers_.back();
}

const FeplbConfig& FeplbChooser::mode_of(int64_t layer) const {
  const Layer* l = find_layer(layer);
  return modes_[static_cast<size_t>(l ? l->mode : first_mode())];
}

PlanLimits FeplbChooser::limits() const {
  PlanLimits l = Planner::limits();
  l.rows_via_homes = std::all_of(modes_.begin(), modes_.end(), [](const FeplbConfig& m) {
    return m.path == FeplbPath::kTwoPhase;
  });
  return l;
}

std::span<const Copy> FeplbChooser::prefetch(int64_t layer) const {
  return mode_of(layer).prefetch == FeplbPrefetch::kOn ? engine_.prefetch(layer)
                                                       : std::span<const Copy>{};
}

void FeplbChooser::make_plan(const RoutingStep& routing, Plan& out) {
  Layer& l = layer_state(routing.layer, /*planning=*/true);
  update_host_scale(l);
  const double unbalanced = unbalanced_straggler(routing);
  l.budget = time_budget_now(unbalanced);
  const int threads = static_cast<int>(ctx_.knobs.planner_threads);
  // A layer's first kSidePlansPerLayer plans (its counts are here): several candidates planned on
  // them side by side, the best kept (with one thread, the planner's very first plan only: two,
  // in series).
  const bool first = modes_.size() > 1 &&
                     (threads > 1 ? l.seen < kSidePlansPerLayer : l.planned < 0 && explored_ == 0);
  if (first) {
    l.mode = first_plan_mode(l, routing, bound_ * unbalanced, std::max(threads, 2), out);
    l.planned = l.mode;
    out.mode = labels_[static_cast<size_t>(l.mode)];
    return;
  }
  l.planned = l.mode;
  engine_.plan_with(mode_at(l.mode, l.budget), routing, out);
  out.mode = labels_[static_cast<size_t>(l.mode)];
}

void FeplbChooser::first_candidates(int start, int count) {
  const int n = static_cast<int>(modes_.size());
  // Each path's candidates in the rule's order (rule_score, then index), the start's path apart.
  std::vector<int> same, other;
  const FeplbPath path = modes_[static_cast<size_t>(start)].path;
  for (int m = 0; m < n; ++m) {
    if (m != start) (modes_[static_cast<size_t>(m)].path == path ? same : other).push_back(m);
  }
  const auto by_rule = [&](int a, int b) {
    return rule_score(a) != rule_score(b) ? rule_score(a) < rule_score(b) : a < b;
  };
  std::sort(same.begin(), same.end(), by_rule);
  std::sort(other.begin(), other.end(), by_rule);
  picks_.assign(1, start);
  count = std::min(count, n);
  for (size_t i = 0; static_cast<int>(picks_.size()) < count; ++i) {
    if (i < other.size()) picks_.push_back(other[i]);
    if (i < same.size() && static_cast<int>(picks_.size()) < count) picks_.push_back(same[i]);
  }
}

int FeplbChooser::first_plan_mode(const Layer& l, const RoutingStep& routing, double bound,
                                  int count, Plan& out) {
  first_candidates(l.mode, count);
  const int k = static_cast<int>(picks_.size());
  if (first_plans_.size() < picks_.size()) first_plans_.resize(picks_.size());
  first_costs_.resize(picks_.size());
  // Every lane predicts the copies the caller's engine does (a layer's first plan: none; the side
  // engines record the plans of a layer that still plans side by side), so each plans the bytes
  // the caller's engine would.
  for (const auto& side : lanes_) {
    FEPLB_CHECK(
        side->engine->prefetch(routing.layer).size() == engine_.prefetch(routing.layer).size(),
        "feplb chooser: layer {}'s side engines predict other copies", routing.layer);
  }
  const double budget = l.budget;
  auto task = [&](int t, int thread) {
    const auto i = static_cast<size_t>(t);
    first_costs_[i] = cost_on(lane(thread), picks_[i], budget, routing, first_plans_[i]);
  };
  // Side by side; in series on this thread while another planner of the process uses the side
  // threads (the same plans, in more time).
  const bool side = side_ && side_->try_run(k, task);
  if (!side) {
    for (int t = 0; t < k; ++t) task(t, 0);
  }
  // The best by the revision's order (fewer passes of the bound, then cost; the earlier pick on a
  // tie), as a scan in pick order would find it.
  std::vector<double> cost(picks_.size()), over(picks_.size());
  for (size_t i = 0; i < picks_.size(); ++i) {
    cost[i] = first_costs_[i].layer_ms;
    over[i] = first_costs_[i].token_straggler > bound ? 1.0 : 0.0;
  }
  int best = 0;
  for (int i = 1; i < k; ++i) {
    if (better(cost, over, 0.5, i, best, 0.0)) best = i;
  }
  std::swap(out, first_plans_[static_cast<size_t>(best)]);
  // Charged as on a host with a core for each of planner_threads: the rounds after the first.
  out.extra_plans = (k + side_charge_ - 1) / side_charge_ - 1;
  out.candidates = k;
  return picks_[static_cast<size_t>(best)];
}

bool FeplbChooser::prime_plan(int64_t layer, Plan& out) {
  const RoutingStep* recent = engine_.recent(layer);
  const Layer* l = find_layer(layer);
  // A layer whose next plan is made side by side: the side threads start polling for it.
  if (side_ && (l == nullptr || l->seen < kSidePlansPerLayer)) side_->wake();
  if (recent == nullptr || l == nullptr) return false;
  engine_.prime_with(mode_at(l->mode, time_budget_now(unbalanced_straggler(*recent))), *recent,
                     out);
  return true;
}

double FeplbChooser::charged_us(int mode) const {
  const double us = modes_[static_cast<size_t>(mode)].reserve_us;
  return us >= 0 ? us : reserve_ms_ * 1e3;
}

double FeplbChooser::unbalanced_straggler(const RoutingStep& routing) {
  home_loads(ctx_.topo, routing, home_scratch_);
  return domain_straggler(ctx_.topo, home_scratch_);
}

double FeplbChooser::time_budget_now(double unbalanced) const {
  // What keeps the token straggler, summed over the plans (the older ones decayed), within
  // kAimShare of the bound: this plan may take what the earlier ones left, up to the bound.
  if (unbalanced <= 0) return bound_;
  const double left = kAimShare * bound_ * (kTokenDecay * unbalanced_sum_ + unbalanced) -
                      kTokenDecay * straggler_sum_;
  return std::clamp(left / unbalanced, kMinBudgetShare * bound_, bound_);
}

FeplbConfig FeplbChooser::mode_at(int mode, double budget) const {
  FeplbConfig m = modes_[static_cast<size_t>(mode)];
  if (m.balance == FeplbBalance::kTimeBudget && chooses_budget_) m.time_budget = budget;
  return m;
}

PlanCost FeplbChooser::cost_on(Lane& lane, int mode, double budget, const RoutingStep& routing,
                               Plan& scratch) const {
  lane.engine->plan_with(mode_at(mode, budget), routing, scratch);
  lane.writer.write(scratch, ctx_.topo, ctx_.knobs, lane.engine->schedule_cost());
  // At this host's speed: a one-hop plan delays the dispatch by its time (less than its reserve
  // on a faster host), a two-phase plan's copies start that much after the reserve it was made
  // for (never before it: they were planned from it).
  const double rule_ms = scratch.reserve_us >= 0 ? scratch.reserve_us * 1e-3 : reserve_ms_;
  const double delay_ms =
      scratch.planned_before_dispatch ? 0.0 : std::max(0.0, host_scale_ - 1) * rule_ms;
  return plan_cost(scratch, ctx_.topo, rule_ms * host_scale_, lane.gemm, lane.rows, delay_ms);
}

// This host's planner time over what the rule charges, from the mode the layer's recent plans
// were made in (set_recent_plan_us; kept while a new mode has no time yet). Below 1 on a host
// faster than the rule: a one-hop plan then holds the dispatch for less than its reserve. A
// step observed without a plan (a history) is explored at the speed given before it, if any.
void FeplbChooser::update_host_scale(const Layer& l) {
  if (recent_us_ > 0 && ctx_.knobs.planner_budget_us < 0)
    host_scale_ = recent_us_ / charged_us(l.planned >= 0 ? l.planned : l.mode);
}

void FeplbChooser::observe(const RoutingStep& routing) {
  Layer& l = layer_state(routing.layer, /*planning=*/false);
  if (l.budget < 0) update_host_scale(l);  // a step without a plan: at the speed given for it
  const int n = static_cast<int>(modes_.size());
  // The plan this step got (at the budget it got; a step observed without a plan, at the budget
  // a plan would have got): its prefetch history, and its cost.
  engine_.remember(routing);
  const double unbalanced = unbalanced_straggler(routing);
  if (l.budget < 0) l.budget = time_budget_now(unbalanced);
  const PlanCost now = cost_of(l.mode, l.budget, routing, current_);
  unbalanced_sum_ = kTokenDecay * unbalanced_sum_ + unbalanced;
  straggler_sum_ = kTokenDecay * straggler_sum_ + now.token_straggler;
  const int64_t seen = l.seen++;
  const int planned = l.mode;
  const double budget = l.budget;
  if (n > 1 && explores(seen)) explore(l, routing, now, bound_ * unbalanced);
  l.budget = -1;  // set by the next plan, or by the next observe() without one
  // The prefetch history learns from the pairs the step's plan would use with every weight in
  // place: its plan again with copy time ignored. A plan held to its copy rule moves an expert
  // only where its weights land in time, so once a hot expert is missing from the prediction no
  // plan moves it and no prediction brings it back (one-hop + prefetch + time on the real priors
  // at EP=64 in one domain, 8 per GPU: a layer kept 4,200-6,600 rows of token straggler on 7 of
  // 8 micro-batches against 770-2,140 without that lock). Recorded after exploring: the
  // candidates were costed with the weights this step had prefetched (a prediction made from the
  // step itself would favour the prefetch candidates).
  const Plan* learned = &current_;
  if (modes_[static_cast<size_t>(planned)].prefetch == FeplbPrefetch::kOn &&
      modes_[static_cast<size_t>(planned)].copy_rule != FeplbCopyRule::kIgnore) {
    FeplbConfig free_copies = mode_at(planned, budget);
    free_copies.copy_rule = FeplbCopyRule::kIgnore;
    engine_.plan_with(free_copies, routing, candidate_);
    learned = &candidate_;
  }
  engine_.record(routing.layer, *learned);
  // The side engines predict the copies the caller's engine does, for the plans they still make.
  if (l.seen < kSidePlansPerLayer) {
    for (auto& side : lanes_) side->engine->record(routing.layer, *learned);
  }
}

void FeplbChooser::explore(Layer& l, const RoutingStep& routing, const PlanCost& now,
                           double bound) {
  const int n = static_cast<int>(modes_.size());
  // Every candidate on these counts, at the budget the layer's plan got.
  for (int m = 0; m < n; ++m) {
    const auto i = static_cast<size_t>(m);
    // The layer's own plan is reused (made as every candidate is: at this host's scale).
    const PlanCost c = m == l.mode ? now : cost_of(m, l.budget, routing, candidate_);
    l.cost_ms[i] = kDecay * l.cost_ms[i] + c.layer_ms;
    l.over[i] = kDecay * l.over[i] + (c.token_straggler > bound ? 1.0 : 0.0);
  }
  // Pooled over the layers seen (each layer's sums as above): one candidate's cost differs from
  // micro-batch to micro-batch far more than two candidates differ on average, so a layer's own
  // few micro-batches rank them by chance.
  ++explored_;
  const double weight = pool();
  const double half = 0.5 * static_cast<double>(layers_.size());
  const int best = best_of(pooled_cost_, pooled_over_, half);
  // The layer's first explored micro-batch moves it without a margin: its mode was a guess (the
  // rule's, or the better of two candidates), so a layer planned from its first micro-batch and
  // one observed first end in the same mode.
  const double margin =
      l.seen == 1
          ? 0.0
          : std::max(kMoveMargin * pooled_cost_[static_cast<size_t>(l.mode)], 2e-3 * weight);
  if (best != l.mode && better(pooled_cost_, pooled_over_, half, best, l.mode, margin))
    l.mode = best;
}

double FeplbChooser::pool() {
  const auto n = modes_.size();
  pooled_cost_.assign(n, 0.0);
  pooled_over_.assign(n, 0.0);
  double weight = 0;  // the pooled sums' scale: explored micro-batches, decayed
  for (const Layer& o : layers_) {
    weight += total_weight(o);
    for (size_t i = 0; i < n; ++i) {
      pooled_cost_[i] += o.cost_ms[i];
      pooled_over_[i] += o.over[i];
    }
  }
  return weight;
}

// Candidate a over b: it passed the bound less often by `half` or more, or about as often and
// cost less by `margin`.
bool FeplbChooser::better(std::span<const double> cost, std::span<const double> over, double half,
                          int a, int b, double margin) {
  const double over_a = over[static_cast<size_t>(a)], over_b = over[static_cast<size_t>(b)];
  if (over_a < over_b - half) return true;
  if (over_a > over_b - half && over_b > over_a - half)
    return cost[static_cast<size_t>(a)] < cost[static_cast<size_t>(b)] - margin;
  return false;
}

int FeplbChooser::best_of(std::span<const double> cost, std::span<const double> over,
                          double half) const {
  int best = 0;
  for (int m = 1; m < static_cast<int>(modes_.size()); ++m) {
    if (better(cost, over, half, m, best, 0.0)) best = m;
  }
  return best;
}

bool FeplbChooser::explores(int64_t seen) const {
  return seen < kExploreFirst || ctx_.topo.num_ranks() <= kExploreAllGpusMax ||
         (seen - kExploreFirst + 1) % kExploreEvery == 0;
}

double FeplbChooser::total_weight(const Layer& l) const {
  // The weight of the explored micro-batches (each new one 1, the older ones decayed).
  const int64_t explored = ctx_.topo.num_ranks() <= kExploreAllGpusMax
                               ? l.seen
                               : std::min<int64_t>(l.seen, kExploreFirst) +
                                     std::max<int64_t>(0, (l.seen - kExploreFirst) / kExploreEvery);
  return (1.0 - std::pow(kDecay, static_cast<double>(explored))) / (1.0 - kDecay);
}

}  // namespace feplb
