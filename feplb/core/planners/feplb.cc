// feplb: our planner, the default. What it adds to the paper's greedy (feplb_paper.cc):
//  1. The dynamic set is chosen per micro-batch from the counts: each GPU's `dyn` busiest experts
//     (ties: lower index). The host knows the counts before it launches any GEMM, so it launches
//     the other (static) experts at once and plans meanwhile. With feplb_dyn_set = 1 the
//     candidates are the placement's dynamic sets instead (history-based, placer.h), busiest first.
//  2. It balances to an exact target instead of moving whole experts only: per NVLink domain the
//     target is ceil(T / GPUs); a GPU above target + tolerance hands rows of its busiest dynamic
//     experts to the GPU with the most room, whole experts when they fit, otherwise a slice
//     (at least min_slice_rows, split points rounded to slice_align_rows, at most
//     max_helpers_per_expert helpers per expert). Donors take turns, one expert each, the most
//     loaded first, so that several hot GPUs share the receivers' links (rather than the hottest
//     filling them all and the next finding every window closed).
//  3. Copies are timed (copy-engine bandwidth on CopyLinks: one copy per link at a time, a later
//     copy in the sender's or the receiver's idle gap where it fits; after the counts round trip
//     and the planner's budget). A copy must land
//     while the receiver still has work whose copies landed: its own experts, then each donor's
//     guests once that donor's copies landed, in landing order (hidden: copy_timing = 1, the
//     default; guests_in_time()), or
//     (copy_timing = 2) be one after which the receiver, idle until it lands, finishes before the
//     donor: an exposed copy that rarely makes the layer slower (a little better balance on the
//     most skewed priors, at a small exposure; docs/planners.md), or (copy_timing = 3) be one after
//     which the receiver, its own work, the wait and its guests included, finishes by the GEMM
//     time of the busiest GPU that gives nothing away (a lower bound of the slowest GPU's): a late
//     copy that does not delay the layer.
//  4. Weights before routing (prefetch = 1): after each step, the (expert, helper) pairs its plan
//     used over the layer's last prefetch_history micro-batches predict the next micro-batch of
//     the layer (most frequent, then most recent, then most rows first), as many as land within
//     prefetch_window_us on the FIFO links and fit the guest slots. The plan lists them as
//     kPrefetchWeights copies (issued before routing), offers an expert first to the helpers that
//     hold its weights, and copies no weights there: only the rows must fit the window.
//  5. Rows in one hop (one_hop = 1): planned before the dispatch, migrated rows are kDispatched
//     (no row copies; outputs back by the combine); the counts round trip and the planner then
//     delay every GPU (metrics charge it), and weight copies start when the GEMMs start. Nothing
//     has to start before the plan, so every local expert is a candidate (not only `dyn`).
// Receivers: an expert goes first to the GPUs holding its prefetched weights, then to the least
// loaded GPUs (ties: lower index) whose copy lands in time (receiver_tree.h: a tournament tree over
// the domain's GPUs finds one in O(log n) typical steps), each taking what its room and its window
// allow; a slice that would land too late is cut to what lands in time. A donor whose egress is
// busy must leave a receiver that keeps room below the target the window for a minimum slice, so
// that a late copy does not strand the receiver's room. An expert gets
// max_helpers_per_expert helpers, more when it alone holds more than its donor's excess can give to
// them: up to 2 x min(rows, excess) / target, e.g. a hot expert of 5 GPUs' share over 10 helpers.
// A helper that takes less than an even share of the donor's excess (its room or window was less)
// does not count against the limit.
// Deterministic; O(E log E + R + migrations x log R) per step with no allocation after the first
// call.
#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <numeric>

#include "feplb/core/copy_links.h"
#include "feplb/core/error.h"
#include "feplb/core/planners/policies.h"
#include "feplb/core/planners/receiver_tree.h"

namespace feplb {
namespace {

// time_balance_budget > 0: the blends of GEMM time and rows bisected, most time first (all time is
// tried apart, balanced within the budget's row cap: plan_capped).
constexpr double kTimeWeights[] = {0.5, 0.25, 0.1};
// Receivers from the tree that get no slice (their copy cannot land in time after all) before an
// expert gives up on further helpers.
constexpr int kMaxMisses = 8;
// Balancing time: row counts below this have their GEMM time tabled (8 bytes each); larger
// ones ask the cost model.
constexpr int64_t kGemmTableRows = 1 << 18;
// Time levelling (level_time): the most hand-backs per domain and plan.
constexpr int kMaxLevelMoves = 64;
// GPUs with at most this many local experts choose their candidates by insertion.
constexpr size_t kFewLocalExperts = 32;

// Bisection over [lo, hi] for a predicate false then true: the first x where it holds (hi if none
// before it).
template <typename Pred>
int64_t first_true(int64_t lo, int64_t hi, Pred pred) {
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (pred(mid))
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}
// first_true() starting from a guess: steps of 1, 2, 4, ... away from it until the answer is
// bracketed, then bisection (O(log distance) calls, a few when the guess is close). Like
// first_true(), it never asks pred(hi).
template <typename Pred>
int64_t first_true_near(int64_t lo, int64_t hi, int64_t guess, Pred pred) {
  if (lo >= hi) return lo;
  guess = std::clamp(guess, lo, hi - 1);
  if (pred(guess)) {
    for (int64_t step = 1;; step *= 2) {
      const int64_t probe = guess - step;
      if (probe < lo) return first_true(lo, guess, pred);
      if (!pred(probe)) return first_true(probe + 1, guess, pred);
      guess = probe;
    }
  }
  for (int64_t step = 1;; step *= 2) {
    const int64_t probe = guess + step;
    if (probe >= hi) return first_true(guess + 1, hi, pred);
    if (pred(probe)) return first_true(guess + 1, probe, pred);
    guess = probe;
  }
}
// Bisection over [lo, hi] for a predicate true then false: the last x where it holds (lo if none
// after it).
template <typename Pred>
int64_t last_true(int64_t lo, int64_t hi, Pred pred) {
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (pred(mid))
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

class FeplbPlanner final : public Planner {
 public:
  explicit FeplbPlanner(const PlannerContext& ctx)
      : Planner(ctx),
        weight_ms_(link_ms(ctx.shape.weight_bytes(), ctx.knobs.copy_gbps, ctx.knobs.copy_setup_us)),
        row_ms_(static_cast<double>(ctx.shape.row_bytes()) / (ctx.knobs.copy_gbps * 1e9) * 1e3),
        unit_ms_(ctx.cost ? row_unit_ms(*ctx.cost) : 0.0) {}
  std::string_view name() const override { return "feplb"; }
  // One hop (one_hop = 1) dispatches migrated rows straight to their helpers.
  PlanLimits limits() const override {
    PlanLimits l = Planner::limits();
    l.rows_via_homes = ctx_.knobs.one_hop == 0;
    return l;
  }

  void make_plan(const RoutingStep& routing, Plan& out) override {
    const Knobs& k = ctx_.knobs;
    if (k.time_balance_budget <= 0) {
      plan_weighted(routing, out, k.balance_time_weight);
      // A second plan aims at the load with the first one's added fixed costs.
      if (by_time_ && added_load(added_)) {
        aim_added_ = true;
        plan_weighted(routing, out, k.balance_time_weight);
      }
      return;
    }
    // The most time-balanced plan whose token straggler stays within the budget (a fraction of
    // the unbalanced one). Two tries, each levelled within the budget's row cap (level_time):
    // the blends from time towards rows bisected (a blend nearer rows leaves fewer rows on the
    // busiest GPU), rows when none keeps within it; and time balanced under the row cap
    // (plan_capped), kept instead when it keeps within the budget with a lower GEMM straggler.
    // Neither wins everywhere: on the many-donor workloads of balance.md, the capped plan is the
    // better one with small experts (whose GEMMs' fixed costs make rows and time differ most),
    // a blend often the better one with large ones.
    home_loads(ctx_.topo, routing, rows_at_);
    const double budget = k.time_balance_budget * row_straggler();
    const auto row_budget = static_cast<int64_t>(std::floor(budget));
    constexpr int kBlends = static_cast<int>(std::size(kTimeWeights));
    int lo = 0, hi = kBlends;  // hi: the best blend that kept within it so far (kBlends: none)
    bool last_kept = false;    // `out` holds that plan
    while (lo < hi) {
      const int mid = lo + (hi - lo) / 2;
      plan_weighted(routing, out, kTimeWeights[mid]);
      last_kept = row_straggler() <= budget;
      if (last_kept) {
        hi = mid;
        kept_ = out;  // copied, not swapped: each buffer keeps its role, so warm plans never
                      // allocate
      } else {
        lo = mid + 1;
      }
    }
    // (Aiming the chosen blend again with its slices' added cost, as a fixed blend does, was
    // measured: it moved the GEMM straggler by at most 0.004 ms on balance.md §8's workloads for
    // one more plan per step.)
    if (hi == kBlends)
      plan_weighted(routing, out, 0.0);
    else if (!last_kept)
      out = kept_;
    level_time(out, row_budget);
    const double blend_ms = gemm_straggler_ms(out);
    kept_ = out;
    plan_capped(routing, out, budget);
    if (row_straggler() <= budget) {
      level_time(out, row_budget);
      if (gemm_straggler_ms(out) < blend_ms) return;
    }
    out = kept_;
  }

  // The plan's modelled GEMM straggler: the largest GPU's GEMM time above the mean.
  double gemm_straggler_ms(const Plan& plan) {
    const int R = ctx_.topo.num_ranks();
    straggler_ms_.assign(static_cast<size_t>(R), 0.0);
    for (const Slice& sl : plan.slices) straggler_ms_[sl.gpu] += gemm_ms(sl.rows);
    double most = 0.0, sum = 0.0;
    for (const double ms : straggler_ms_) {
      most = std::max(most, ms);
      sum += ms;
    }
    return most - sum / R;
  }

  // Levels GEMM time along the plan's own slices. Per domain, the GPU with the largest modelled
  // GEMM time moves rows from one of its slices to another slice of the same expert, the move
  // that lowers the domain's largest time most, until none does: a guest slice's rows back to the
  // expert's slice at its home, or, rows in one hop, its own rows on to the expert's helpers and a
  // guest slice's rows on to the expert's other helpers. A guest slice may go whole (its GEMM's
  // fixed cost leaves the GPU, and its weights copy the plan; a prefetch stays, issued before
  // routing); otherwise a slice keeps min_slice_rows and moves are multiples of slice_align_rows.
  // The receiving GPU stays within `row_budget` rows of the domain's mean. No slice is added (no
  // GEMM's fixed cost), and no copy grows: a rows copy only shrinks (it lands earlier), rows in one
  // hop travel in the dispatch. O(kMaxLevelMoves x (domain size + a GPU's slices' moves)) per
  // domain, no allocation once warm.
  void level_time(Plan& out, int64_t row_budget) {
    const Topology& topo = ctx_.topo;
    const Knobs& k = ctx_.knobs;
    const int E = topo.num_experts(), R = topo.num_ranks(), n = topo.domain_size();
    std::vector<Slice>& slices = out.slices;
    // Each GPU's time and rows; each expert's slice at its home; each GPU's guest slices that
    // have one there (counting sort).
    level_ms_.assign(static_cast<size_t>(R), 0.0);
    level_rows_.assign(static_cast<size_t>(R), 0);
    home_slice_.assign(static_cast<size_t>(E), -1);
    for (size_t i = 0; i < slices.size(); ++i) {
      const Slice& sl = slices[i];
      level_ms_[sl.gpu] += gemm_ms(sl.rows);
      level_rows_[sl.gpu] += sl.rows;
      if (topo.home(sl.expert) == sl.gpu) home_slice_[sl.expert] = static_cast<int>(i);
    }
    const auto guest = [&](const Slice& sl) {
      return topo.home(sl.expert) != sl.gpu && home_slice_[sl.expert] >= 0;
    };
    // The guest slices bucketed by `key` (a GPU or an expert, < num_keys): begin[key] .. begin[key
    // + 1] in `index` (counting sort).
    const auto bucket = [&](auto key, int num_keys, std::vector<int>& begin,
                            std::vector<int>& index) {
      begin.assign(static_cast<size_t>(num_keys) + 1, 0);
      for (const Slice& sl : slices) begin[key(sl) + 1] += guest(sl) ? 1 : 0;
      for (int i = 0; i < num_keys; ++i) begin[i + 1] += begin[i];
      index.resize(static_cast<size_t>(begin[num_keys]));
      fill_.assign(begin.begin(), begin.end() - 1);
      for (size_t i = 0; i < slices.size(); ++i) {
        if (guest(slices[i]))
          index[static_cast<size_t>(fill_[key(slices[i])]++)] = static_cast<int>(i);
      }
    };
    bucket([](const Slice& sl) { return sl.gpu; }, R, level_begin_, level_slice_);
    bucket([](const Slice& sl) { return sl.expert; }, E, guest_begin_, guest_slice_);
    const int64_t a = k.slice_align_rows;
    bool moved = false;
    for (int dom = 0; dom < topo.num_domains(); ++dom) {
      const int first = topo.first_gpu_of_domain(dom);
      int64_t dom_rows = 0;
      for (int g = first; g < first + n; ++g) dom_rows += level_rows_[g];
      const int64_t row_cap = dom_rows / n + row_budget;
      for (int iter = 0; iter < std::min(4 * n, kMaxLevelMoves); ++iter) {
        // The domain's three largest times (GPU M the largest).
        int top[3] = {-1, -1, -1};
        for (int g = first; g < first + n; ++g) {
          for (int t = 0; t < 3; ++t) {
            if (top[t] < 0 || level_ms_[g] > level_ms_[top[t]]) {
              for (int u = 2; u > t; --u) top[u] = top[u - 1];
              top[t] = g;
              break;
            }
          }
        }
        const int M = top[0];
        // The best move from M: the new largest time, the slices from and to, the rows.
        double best_ms = level_ms_[M];
        int best_from = -1, best_to = -1;
        int64_t best_r = 0;
        const auto consider = [&](int from, int to) {
          const Slice& fs = slices[static_cast<size_t>(from)];
          const Slice& ts = slices[static_cast<size_t>(to)];
          const int g = ts.gpu;
          if (fs.rows == 0 || ts.rows == 0) return;  // a slice given up
          const int64_t room = row_cap - level_rows_[g];
          double other = 0;  // the largest time but M's and g's
          for (const int t : top) {
            if (t >= 0 && t != M && t != g) {
              other = level_ms_[t];
              break;
            }
          }
          const auto m_ms = [&](int64_t r) {
            return level_ms_[M] - gemm_ms(fs.rows) + gemm_ms(fs.rows - r);
          };
          const auto g_ms = [&](int64_t r) {
            return level_ms_[g] - gemm_ms(ts.rows) + gemm_ms(ts.rows + r);
          };
          const auto offer = [&](int64_t r) {
            const double top_ms = std::max({m_ms(r), g_ms(r), other});
            if (top_ms < best_ms - 1e-9) {
              best_ms = top_ms;
              best_from = from;
              best_to = to;
              best_r = r;
            }
          };
          // A guest slice may go whole (its GEMM, fixed cost included, leaves M).
          if (topo.home(fs.expert) != M && fs.rows <= room) offer(fs.rows);
          const int64_t most = std::min(fs.rows - k.min_slice_rows, room) / a;
          if (most <= 0) return;
          // Where g's time passes M's: the best part is there or one step before.
          const int64_t cross =
              first_true(1, most + 1, [&](int64_t q) { return g_ms(q * a) >= m_ms(q * a); });
          if (cross > 1) offer((cross - 1) * a);
          if (cross <= most) offer(cross * a);
        };
        // M's guest slices back to their homes, or (rows in one hop) on to the expert's other
        // helpers.
        for (int i = level_begin_[M]; i < level_begin_[M + 1]; ++i) {
          const int gs = level_slice_[static_cast<size_t>(i)];
          const Slice& sl = slices[static_cast<size_t>(gs)];
          consider(gs, home_slice_[sl.expert]);
          if (sl.source != RowSource::kDispatched) continue;
          for (int j = guest_begin_[sl.expert]; j < guest_begin_[sl.expert + 1]; ++j) {
            const int os = guest_slice_[static_cast<size_t>(j)];
            const Slice& o = slices[static_cast<size_t>(os)];
            if (o.gpu != M && o.source == RowSource::kDispatched) consider(gs, os);
          }
        }
        // M's own rows on to the helpers its experts' rows reach in one hop (no copy grows).
        for (const int e : topo.local_experts(M)) {
          if (home_slice_[e] < 0) continue;
          for (int i = guest_begin_[e]; i < guest_begin_[e + 1]; ++i) {
            const int gs = guest_slice_[static_cast<size_t>(i)];
            if (slices[static_cast<size_t>(gs)].source == RowSource::kDispatched)
              consider(home_slice_[e], gs);
          }
        }
        if (best_from < 0) break;
        if (!moved) level_before_ = out;  // copied, not swapped: no allocation once warm
        Slice& fs = slices[static_cast<size_t>(best_from)];
        Slice& ts = slices[static_cast<size_t>(best_to)];
        level_ms_[M] += gemm_ms(fs.rows - best_r) - gemm_ms(fs.rows);
        level_ms_[ts.gpu] += gemm_ms(ts.rows + best_r) - gemm_ms(ts.rows);
        level_rows_[M] -= best_r;
        level_rows_[ts.gpu] += best_r;
        fs.rows -= best_r;
        ts.rows += best_r;
        moved = true;
      }
    }
    if (!moved) return;
    // The moved slices' copies follow them: rows (home -> helper) and outputs (back) shrink, and a
    // slice given up whole takes its weights copy with it (a prefetch stays: it was issued before
    // routing).
    size_t w = 0;
    for (size_t c = 0; c < out.copies.size(); ++c) {
      Copy& cp = out.copies[c];
      const bool rows = cp.kind == CopyKind::kTokenRows || cp.kind == CopyKind::kOutputRows;
      if (rows || cp.kind == CopyKind::kWeights) {
        const int helper = cp.kind == CopyKind::kOutputRows ? cp.src_gpu : cp.dst_gpu;
        for (int i = level_begin_[helper]; i < level_begin_[helper + 1]; ++i) {
          const Slice& sl = slices[static_cast<size_t>(level_slice_[i])];
          if (sl.expert != cp.expert) continue;
          if (sl.rows == 0) cp.bytes = -1;  // dropped below
          if (rows && sl.rows > 0) {
            cp.rows = sl.rows;
            cp.bytes = sl.rows * ctx_.shape.row_bytes();
          }
        }
      }
      if (cp.bytes >= 0) out.copies[w++] = cp;
    }
    out.copies.resize(w);
    std::erase_if(slices, [](const Slice& sl) { return sl.rows == 0; });
    // A shrunk or dropped copy can still delay a later one: the idle gap a busy receiver left in
    // a sender's egress (CopyLinks) may close before the copy that ran in it. The levelling stays
    // only if no copy lands later than it did.
    if (!no_copy_lands_later(level_before_, out)) out = level_before_;
  }

  // Whether every copy of `after` (the copies of `before`, in order, some shrunk, some gone) lands
  // no later than it did in `before`.
  bool no_copy_lands_later(const Plan& before, const Plan& after) {
    const Knobs& k = ctx_.knobs;
    const double start_ms = planned_copy_start_ms(before, k);
    const auto was = copy_timer_.time(before, ctx_.topo, k, start_ms);
    level_end_.resize(was.size());
    for (size_t i = 0; i < was.size(); ++i) level_end_[i] = was[i].timed ? was[i].end_ms : 0.0;
    const auto now = copy_timer_.time(after, ctx_.topo, k, start_ms);
    size_t j = 0;
    for (size_t i = 0; i < now.size(); ++i, ++j) {
      const Copy& c = after.copies[i];
      const auto same = [&](const Copy& b) {
        return b.kind == c.kind && b.expert == c.expert && b.src_gpu == c.src_gpu &&
               b.dst_gpu == c.dst_gpu;
      };
      while (j < before.copies.size() && !same(before.copies[j])) ++j;
      if (j == before.copies.size()) return false;  // not a subsequence: keep the plan as it was
      if (now[i].timed && now[i].end_ms > level_end_[j] + 1e-12) return false;
    }
    return true;
  }

  // GEMM time balanced within a row cap: no GPU ends more than `budget` rows above its domain's
  // mean (a donor above it gives rows even beyond its receivers' time room once its own load is
  // within the cap), aimed a second time with the slices' added fixed cost.
  void plan_capped(const RoutingStep& routing, Plan& out, double budget) {
    row_budget_ = static_cast<int64_t>(std::floor(budget));
    plan_weighted(routing, out, 1.0);
    if (added_load(added_)) {
      aim_added_ = true;
      plan_weighted(routing, out, 1.0);
    }
    row_budget_ = -1;
  }

  // Balancing time, every slice adds its GEMM's fixed cost, so a plan aimed at the domain's load
  // before balancing leaves its donors above it (the receivers filled up first). The load the plan
  // just made added per domain, for a second plan to aim at its share (aim_added_); false if
  // none.
  bool added_load(std::vector<int64_t>& added) const {
    const int n = ctx_.topo.domain_size();
    added.resize(static_cast<size_t>(ctx_.topo.num_domains()));
    bool any = false;
    for (int dom = 0; dom < ctx_.topo.num_domains(); ++dom) {
      const auto first = load_.begin() + ctx_.topo.first_gpu_of_domain(dom);
      added[dom] =
          std::max<int64_t>(0, std::accumulate(first, first + n, int64_t{0}) - dom_load_[dom]);
      any = any || added[dom] > 0;
    }
    return any;
  }

  // The plan with loads blending rows and GEMM time by `time_weight` (units()).
  void plan_weighted(const RoutingStep& routing, Plan& out, double time_weight) {
    time_weight_ = time_weight;
    by_time_ = time_weight > 0;
    fixed_units_ = by_time_ ? units(8192) - 8192 : 0;
    const Topology& topo = ctx_.topo;
    const Knobs& k = ctx_.knobs;
    const int E = topo.num_experts(), R = topo.num_ranks();
    const auto& c = routing.expert_counts;
    rows_ = &c;
    out.clear(E);
    out.planned_before_dispatch = k.one_hop != 0;
    home_loads(topo, routing, rows_at_);
    if (by_time_) {
      load_.assign(static_cast<size_t>(R), 0);
      for (int e = 0; e < E; ++e) load_[topo.home(e)] += units(c[e]);
    } else {
      load_.assign(rows_at_.begin(), rows_at_.end());
    }
    moved_.assign(static_cast<size_t>(E), 0);
    guests_.assign(static_cast<size_t>(R), 0);
    excluded_.assign(static_cast<size_t>(R), 0);
    late_finish_ms_.assign(static_cast<size_t>(R), 0.0);
    arrivals_.resize(static_cast<size_t>(R));
    for (auto& a : arrivals_) a.clear();
    next_candidate_.resize(static_cast<size_t>(R));
    rest_.resize(static_cast<size_t>(R));
    leaf_of_.resize(static_cast<size_t>(R));
    choose_candidates(c, out.dynamic);
    own_gemm_times(c);
    // Phase-2 copies start once the plan exists: after the counts round trip and the planner
    // (two-phase), or when the GEMMs start (one-hop: planned before the dispatch).
    const double start_ms = planned_copy_start_ms(out, k);
    start_ms_ = start_ms;
    links_.reset(R, start_ms);
    add_prefetches(routing.layer, out);

    int64_t total = 0;
    for (int64_t l : load_) total += l;
    const int64_t tol =
        static_cast<int64_t>(std::floor(k.balance_tolerance * static_cast<double>(total) / R));
    // Per domain the exact target and the cap a GPU may end at. With copy_timing = 3, a late copy
    // must let its receiver finish by the slowest GPU's GEMM time, bounded below by the busiest
    // GPU that gives nothing away (a receiver's work only grows).
    const int D = topo.num_domains(), n = topo.domain_size();
    finish_by_ms_ = 0.0;
    dom_target_.resize(static_cast<size_t>(D));
    dom_load_.resize(static_cast<size_t>(D));
    for (int dom = 0; dom < D; ++dom) {
      const int first = topo.first_gpu_of_domain(dom);
      int64_t dom_total = 0;
      for (int g = first; g < first + n; ++g) dom_total += load_[g];
      dom_load_[dom] = dom_total;
      const int64_t target = (dom_total + (aim_added_ ? added_[dom] : 0) + n - 1) / n;
      dom_target_[dom] = target;
      for (int g = first; g < first + n; ++g) {
        if (load_[g] <= target + tol) finish_by_ms_ = std::max(finish_by_ms_, home_ms_[g]);
      }
    }

    for (int dom = 0; dom < D; ++dom) {
      const int first = topo.first_gpu_of_domain(dom);
      const int64_t target = dom_target_[dom], cap = target + tol;
      cap_ = cap;
      row_cap_ = std::numeric_limits<int64_t>::max();
      if (row_budget_ >= 0) {
        int64_t dom_rows = 0;
        for (int g = first; g < first + n; ++g) dom_rows += rows_at_[g];
        row_cap_ = dom_rows / n + row_budget_;
      }
      donors_.clear();
      tree_.reset(n, k.copy_timing >= 2);
      for (int i = 0; i < n; ++i) {
        const int g = first + i;
        if (over(g)) donors_.push_back(g);
        leaf_of_[g] = i;
        tree_.put(i, g, eligible(g), leaf(g));
      }
      tree_.build();
      // Donors take turns, one candidate each, the most loaded first: several hot GPUs then share
      // the receivers' ingress links instead of the first one filling them all.
      for (int d : donors_) {
        next_candidate_[d] = candidate_begin_[d];
        rest_[d] = 0;  // load of d's candidates not offered yet
        for (int i = candidate_begin_[d]; i < candidate_begin_[d + 1]; ++i) {
          rest_[d] += units(c[candidates_[i]]);
        }
      }
      const auto later = [&](int a, int b) {  // heap order: the most loaded, then the lowest GPU
        return load_[a] != load_[b] ? load_[a] < load_[b] : a > b;
      };
      std::make_heap(donors_.begin(), donors_.end(), later);
      while (!donors_.empty()) {
        std::pop_heap(donors_.begin(), donors_.end(), later);
        const int d = donors_.back();
        donors_.pop_back();
        if (!over(d) || next_candidate_[d] == candidate_begin_[d + 1]) {
          if (eligible(d)) refresh(d);  // a donor brought below the cap may receive from others
          continue;
        }
        const int e = candidates_[next_candidate_[d]++];
        rest_[d] -= units(c[e]);
        spill_expert(e, d, target, cap, tol, rest_[d], out);
        donors_.push_back(d);
        std::push_heap(donors_.begin(), donors_.end(), later);
      }
    }
    out.add_home_slices(topo, routing, moved_);
    aim_added_ = false;
  }

  // With prefetch: records the (expert, helper) pairs this step's plan used and predicts the
  // layer's next micro-batch from them (the prediction plan() reads, before routing).
  void observe(const RoutingStep& routing) override {
    if (!ctx_.knobs.prefetch) return;
    make_plan(routing, scratch_);  // the plan this step got: same counts, same prediction
    LayerPrefetch& lp = layer_state(routing.layer);
    const int64_t H = ctx_.knobs.prefetch_history;
    if (static_cast<int64_t>(lp.history.size()) < H) lp.history.emplace_back();
    auto& slot = lp.history[static_cast<size_t>(lp.next % H)];
    slot.clear();
    for (const Slice& sl : scratch_.slices) {
      if (sl.gpu != ctx_.topo.home(sl.expert))
        slot.push_back({sl.expert, sl.gpu, lp.next, sl.rows, 1});
    }
    ++lp.next;
    predict(lp);
  }

  std::span<const Copy> prefetch(int64_t layer) const override {
    for (const LayerPrefetch& lp : layers_) {
      if (lp.layer == layer) return lp.predicted;
    }
    return {};
  }

 private:
  struct Pair {
    int expert, gpu;
    int64_t step, rows, count;
  };
  struct LayerPrefetch {
    int64_t layer = 0;
    int64_t next = 0;                        // micro-batches recorded
    std::vector<std::vector<Pair>> history;  // ring of the last prefetch_history plans' pairs
    std::vector<Copy> predicted;             // kPrefetchWeights, in issue order
  };
  LayerPrefetch& layer_state(int64_t layer) {
    for (LayerPrefetch& lp : layers_) {
      if (lp.layer == layer) return lp;
    }
    layers_.emplace_back();
    layers_.back().layer = layer;
    return layers_.back();
  }

  // Ranks the recorded pairs and keeps those whose weights land within the prefetch window on the
  // FIFO links (from -window), at most max_num_dyn per GPU.
  void predict(LayerPrefetch& lp) {
    const Topology& topo = ctx_.topo;
    const Knobs& k = ctx_.knobs;
    merged_.clear();
    for (const auto& h : lp.history) merged_.insert(merged_.end(), h.begin(), h.end());
    std::sort(merged_.begin(), merged_.end(), [](const Pair& a, const Pair& b) {
      return a.expert != b.expert ? a.expert < b.expert
             : a.gpu != b.gpu     ? a.gpu < b.gpu
                                  : a.step > b.step;
    });
    size_t w = 0;  // one entry per pair: count, latest step, its rows then
    for (size_t i = 0; i < merged_.size(); ++i) {
      if (w > 0 && merged_[w - 1].expert == merged_[i].expert &&
          merged_[w - 1].gpu == merged_[i].gpu) {
        ++merged_[w - 1].count;
      } else {
        merged_[w++] = merged_[i];
      }
    }
    merged_.resize(w);
    std::sort(merged_.begin(), merged_.end(), [](const Pair& a, const Pair& b) {
      if (a.count != b.count) return a.count > b.count;
      if (a.step != b.step) return a.step > b.step;
      if (a.rows != b.rows) return a.rows > b.rows;
      return a.expert != b.expert ? a.expert < b.expert : a.gpu < b.gpu;
    });
    const int R = topo.num_ranks();
    const double window_ms = k.prefetch_window_us * 1e-3;
    const double t = static_cast<double>(ctx_.shape.weight_bytes()) / (k.copy_gbps * 1e9) * 1e3 +
                     k.copy_setup_us * 1e-3;
    pre_in_.assign(static_cast<size_t>(R), 0.0);
    pre_out_.assign(static_cast<size_t>(R), 0.0);
    pre_slots_.assign(static_cast<size_t>(R), 0);
    lp.predicted.clear();
    for (const Pair& p : merged_) {
      const int home = topo.home(p.expert);
      if (pre_slots_[p.gpu] >= k.max_num_dyn) continue;
      const double end = std::max(pre_in_[p.gpu], pre_out_[home]) + t;
      if (end > window_ms) continue;
      pre_in_[p.gpu] = pre_out_[home] = end;
      ++pre_slots_[p.gpu];
      lp.predicted.push_back(
          {CopyKind::kPrefetchWeights, p.expert, home, p.gpu, 0, ctx_.shape.weight_bytes()});
    }
  }

  // Adds the layer's predicted prefetches to `out`, takes their guest slots, indexes them by
  // expert (pre_begin_/pre_gpu_), and queues them on the links from -window ahead of phase 2.
  void add_prefetches(int64_t layer, Plan& out) {
    const Topology& topo = ctx_.topo;
    const int E = topo.num_experts(), R = topo.num_ranks();
    pre_begin_.assign(static_cast<size_t>(E) + 1, 0);
    if (!ctx_.knobs.prefetch) return;
    const auto pairs = prefetch(layer);
    if (pairs.empty()) return;
    const double t =
        static_cast<double>(ctx_.shape.weight_bytes()) / (ctx_.knobs.copy_gbps * 1e9) * 1e3 +
        ctx_.knobs.copy_setup_us * 1e-3;
    pre_in_.assign(static_cast<size_t>(R), -ctx_.knobs.prefetch_window_us * 1e-3);
    pre_out_.assign(static_cast<size_t>(R), -ctx_.knobs.prefetch_window_us * 1e-3);
    for (const Copy& p : pairs) {
      const int e = p.expert, g = p.dst_gpu, home = p.src_gpu;
      out.copies.push_back(p);
      ++guests_[g];
      ++pre_begin_[e + 1];
      const double end = std::max(pre_in_[g], pre_out_[home]) + t;
      pre_in_[g] = pre_out_[home] = end;
    }
    for (int g = 0; g < R; ++g) links_.start_at(g, pre_in_[g], pre_out_[g]);
    for (int e = 0; e < E; ++e) pre_begin_[e + 1] += pre_begin_[e];
    pre_gpu_.resize(pairs.size());
    fill_.assign(pre_begin_.begin(), pre_begin_.end() - 1);
    for (const Copy& p : pairs) pre_gpu_[static_cast<size_t>(fill_[p.expert]++)] = p.dst_gpu;
  }

  bool prefetched(int e, int h) const {
    for (int i = pre_begin_[e]; i < pre_begin_[e + 1]; ++i) {
      if (pre_gpu_[i] == h) return true;
    }
    return false;
  }

  // Each GPU's candidates, busiest first: candidates_[candidate_begin_[gpu] + i]. Its `dyn`
  // busiest local experts, or (feplb_dyn_set = 1) its experts in the placement's dynamic set;
  // then more (its busiest others, one local expert left to start at once) while they hold fewer
  // than dyn_cover x its rows above its domain's mean. Expects rows_at_ = home_loads().
  void choose_candidates(const std::vector<int64_t>& c, std::vector<uint8_t>& dynamic) {
    const Topology& topo = ctx_.topo;
    const Knobs& k = ctx_.knobs;
    const bool from_placement = k.feplb_dyn_set == 1;
    // One-hop plans before the dispatch, so no expert must start before the plan: every local
    // expert is a candidate. Two-phase: the `dyn` busiest (the others start at once).
    const int local_n = topo.experts_per_rank();
    const int per_gpu =
        from_placement || k.one_hop ? local_n : static_cast<int>(std::min<int64_t>(k.dyn, local_n));
    const bool cover =
        !k.one_hop && k.dyn_cover > 0 && (from_placement || (per_gpu > 0 && per_gpu < local_n));
    candidates_.resize(static_cast<size_t>(topo.num_ranks()) * local_n);
    in_set_.resize(static_cast<size_t>(topo.num_experts()), 0);
    candidate_begin_.resize(static_cast<size_t>(topo.num_ranks()) + 1);
    const auto busier = [&](int a, int b) { return c[a] != c[b] ? c[a] > c[b] : a < b; };
    const int n_dom = topo.domain_size();
    double dom_mean = 0.0;  // rows per GPU in g's domain
    int next = 0;
    for (int g = 0; g < topo.num_ranks(); ++g) {
      candidate_begin_[g] = next;
      int* const top = candidates_.data() + next;  // g's candidates, busiest first
      int n = per_gpu;
      const auto local = topo.local_experts(g);
      // The rows g's candidates should hold to bring it to its domain's mean.
      if (cover && g % n_dom == 0) {  // a domain's first GPU (domains are contiguous)
        const auto first = rows_at_.begin() + g;
        dom_mean = static_cast<double>(std::accumulate(first, first + n_dom, int64_t{0})) / n_dom;
      }
      double wanted = cover ? k.dyn_cover * (static_cast<double>(rows_at_[g]) - dom_mean) : 0.0;
      const auto held = [&](int num) {
        int64_t rows = 0;
        for (int i = 0; i < num; ++i) rows += c[top[i]];
        return static_cast<double>(rows);
      };
      if (from_placement && !k.one_hop) {
        placement_dynamic_set(ctx_, g, order_);
        n = static_cast<int>(order_.size());
        std::sort(order_.begin(), order_.end(), busier);
        std::copy(order_.begin(), order_.end(), top);
        if (n == 0) wanted = 0.0;              // an empty set stays empty
        if (wanted > 0 && held(n) < wanted) {  // the other local experts after it, busiest first
          for (int e : order_) in_set_[e] = 1;
          int m = n;
          for (int e : local) {
            if (!in_set_[e]) top[m++] = e;
          }
          for (int e : order_) in_set_[e] = 0;
          std::sort(top + n, top + m, busier);
        }
      } else if (local.size() <= kFewLocalExperts) {
        // The n busiest by insertion, straight into place (busier is a total order, so this is
        // what any sort gives).
        const auto insert_busiest = [&](int num) {
          int kept = 0;
          for (int e : local) {
            if (num == 0 || (kept == num && !busier(e, top[num - 1]))) continue;
            int q = kept < num ? kept++ : num - 1;
            for (; q > 0 && busier(e, top[q - 1]); --q) top[q] = top[q - 1];
            top[q] = e;
          }
        };
        insert_busiest(n);
        if (wanted > 0 && held(n) < wanted) insert_busiest(local_n - 1);
      } else {
        order_.assign(local.begin(), local.end());
        std::partial_sort(order_.begin(), order_.begin() + n, order_.end(), busier);
        std::copy(order_.begin(), order_.begin() + n, top);
        if (wanted > 0 && held(n) < wanted) {
          std::sort(order_.begin(), order_.end(), busier);
          std::copy(order_.begin(), order_.end() - 1, top);
        }
      }
      if (wanted > 0) {  // the fewest busiest (at least n) that hold the rows wanted
        int64_t rows = 0;
        int num = 0;
        for (; num < local_n - 1 && (num < n || static_cast<double>(rows) < wanted); ++num)
          rows += c[top[num]];
        n = std::max(n, num);
      }
      for (int i = 0; i < n; ++i) dynamic[top[i]] = 1;
      next += n;
    }
    candidate_begin_[topo.num_ranks()] = next;
  }

  // home_ms_[g]: modelled GEMM time of the work g can run without waiting for a copy: its own
  // rows that stay on it (updated as g gives rows away), and guests that need no copy (one-hop
  // rows of prefetched experts). g runs it first, so copies into g that land within it are hidden.
  // guest_ms_[g]: GEMM time of the work that waits for copies. Zero without copy timing.
  void own_gemm_times(const std::vector<int64_t>& c) {
    const Topology& topo = ctx_.topo;
    home_ms_.assign(static_cast<size_t>(topo.num_ranks()), 0.0);
    guest_ms_.assign(static_cast<size_t>(topo.num_ranks()), 0.0);
    if (!ctx_.knobs.copy_timing) return;
    for (int g = 0; g < topo.num_ranks(); ++g) {
      for (int e : topo.local_experts(g)) home_ms_[g] += gemm_ms(c[e]);
    }
  }

  // Whether `rows` of e may go from d to h given when the copy would land. Hidden copies always
  // may. A late copy (h idles waiting for it) may with copy_timing = 2 if h, waiting and then
  // computing its guests, still finishes before d does after giving the rows, and so do d's earlier
  // late receivers (late_finish_ms_); with copy_timing = 3
  // if h, its own work, the wait and its guests included, finishes by finish_by_ms_ (no later than
  // the slowest GPU's GEMMs, so the layer is not delayed).
  bool copy_fits(int e, int d, int h, int64_t rows, double t) const {
    const double lands_ms = links_.start(d, h, t) + t;
    if (lands_ms <= home_ms_[h]) return true;
    if (ctx_.knobs.copy_timing == 1) {
      return lands_ms <= window_ms(h) && guests_in_time(h, d, lands_ms, gemm_ms(rows));
    }
    if (ctx_.knobs.copy_timing == 3) {
      return std::max(home_ms_[h], lands_ms) + guest_ms_[h] + gemm_ms(rows) <= finish_by_ms_;
    }
    if (ctx_.knobs.copy_timing < 2) return false;
    // d after giving the rows must still finish last among its late receivers, this one included.
    const double donor_after_ms =
        home_ms_[d] - gemm_ms(remaining(e)) + gemm_ms(remaining(e) - rows);
    return std::max(late_finish_ms_[d], lands_ms + guest_ms_[h] + gemm_ms(rows)) <= donor_after_ms;
  }

  // Time the phase-2 copies of one migration take on the links (0: none needed), computed as the
  // copy timer does (link_ms()).
  double copy_ms(int64_t rows, bool weights) const {
    const Knobs& k = ctx_.knobs;
    const bool row_copy = !k.one_hop;
    return (weights ? weight_ms_ : 0.0) +
           (row_copy ? link_ms(rows * ctx_.shape.row_bytes(), k.copy_gbps, k.copy_setup_us) : 0.0);
  }

  int64_t remaining(int e) const { return (*rows_)[e] - moved_[e]; }
  // Whether d must give more away: above the cap, or above the row cap.
  bool over(int d) const { return load_[d] > cap_ || rows_at_[d] > row_cap_; }
  // The rows of e that bring d down to `level` units and below the row cap.
  int64_t shed_rows(int e, int d, int64_t level) const {
    return std::max(rows_shedding(e, load_[d] - level), rows_at_[d] - row_cap_);
  }

  // Loads are in units: rows, or (balance_time_weight = 1) modelled GEMM time in row equivalents,
  // the cost of an expert GEMM over `rows` rows divided by unit_ms_ (the cost of one more row at
  // large row counts): the same as rows where the GEMM is linear, more where a fixed cost
  // dominates; in between, that blend of the two.
  int64_t units(int64_t rows) const {
    if (!by_time_) return rows;
    const double time = gemm_ms(rows) / unit_ms_;
    // Non-negative: rounds half up without libm's llround (this is the planner's inner loop).
    return static_cast<int64_t>((1.0 - time_weight_) * static_cast<double>(rows) +
                                time_weight_ * time + 0.5);
  }
  // The cost model's time for one expert GEMM over `rows` rows; balancing time, looked up in a
  // table (units() asks it in the planner's inner loop).
  double gemm_ms(int64_t rows) const {
    if (!by_time_ || rows >= kGemmTableRows) return ctx_.cost->expert_ms(rows);
    if (rows >= static_cast<int64_t>(gemm_ms_.size())) grow_gemm_table(rows);
    return gemm_ms_[static_cast<size_t>(rows)];
  }
  // Extends gemm_ms_ to cover `rows` (doubling, at most kGemmTableRows: it grows only while the
  // steps' largest expert count does).
  void grow_gemm_table(int64_t rows) const {
    const size_t old = gemm_ms_.size();
    gemm_ms_.resize(
        std::min<size_t>(std::max<size_t>(static_cast<size_t>(rows) + 1, 2 * old), kGemmTableRows));
    for (size_t r = old; r < gemm_ms_.size(); ++r) {
      gemm_ms_[r] = r == 0 ? 0.0 : ctx_.cost->expert_ms(static_cast<int64_t>(r));
    }
  }
  // The load d sheds by giving `rows` more of e away.
  int64_t give_units(int e, int64_t rows) const {
    return by_time_ ? units(remaining(e)) - units(remaining(e) - rows) : rows;
  }
  // The fewest rows of e whose giving sheds at least `u` units (all of e's if none do).
  int64_t rows_shedding(int e, int64_t u) const {
    if (!by_time_) return u;
    // Where the GEMM is linear, giving u rows sheds u units: the search starts there.
    return first_true_near(0, remaining(e), u, [&](int64_t s) { return give_units(e, s) >= u; });
  }
  // The most rows (at most `limit`) a receiver takes as a new slice within `u` units.
  int64_t rows_within(int64_t u, int64_t limit) const {
    if (!by_time_) return u;
    if (u <= 0 || limit <= 0) return 0;
    // Where the GEMM is linear, s rows cost s plus the fixed cost: the search starts there.
    return first_true_near(0, limit + 1, u - fixed_units_,
                           [&](int64_t s) { return s > limit || units(s) > u; }) -
           1;
  }
  // The token straggler of rows_at_ within the NVLink domains (what balancing can remove): the
  // largest of a GPU's rows above its domain's mean.
  double row_straggler() const {
    const int n = ctx_.topo.domain_size();
    double worst = 0;
    for (int dom = 0; dom < ctx_.topo.num_domains(); ++dom) {
      const auto first = rows_at_.begin() + ctx_.topo.first_gpu_of_domain(dom);
      const int64_t total = std::accumulate(first, first + n, int64_t{0});
      const int64_t most = *std::max_element(first, first + n);
      worst = std::max(worst, static_cast<double>(most) - static_cast<double>(total) / n);
    }
    return worst;
  }
  static double row_unit_ms(const GemmCostModel& cost) {
    const double slope = (cost.expert_ms(16384) - cost.expert_ms(8192)) / 8192.0;
    return slope > 0 ? slope : cost.expert_ms(8192) / 8192.0;
  }

  // Whether g has room: below the cap (under a row cap, time room is not required: a donor above
  // the row cap may have to give beyond it) and below the row cap.
  bool has_room(int g) const {
    return (load_[g] < cap_ || row_budget_ >= 0) && rows_at_[g] < row_cap_;
  }
  // Whether g may receive: room, a free guest slot and, when copies must be hidden, a window that
  // still fits the shortest copy (a weight copy).
  bool eligible(int g) const {
    return has_room(g) && guests_[g] < ctx_.knobs.max_num_dyn &&
           (ctx_.knobs.copy_timing != 1 || window_ms(g) - links_.in_ms(g) >= copy_ms(0, true));
  }
  ReceiverTree::Leaf leaf(int g) const {
    return {load_[g], window_ms(g), links_.in_ms(g), guest_ms_[g]};
  }
  // By when a hidden copy into g must land at the latest. A receiver runs its own work, then each
  // donor's guests once all that donor's copies to it have landed, donors in the order their last
  // copies land (the GPU layer waits per donor). A copy that lands while g still has work whose
  // copies have landed is hidden, so with copy_timing = 1 the bound is its own work plus all its
  // guests' (guests_in_time() checks the order); otherwise its own work.
  double window_ms(int g) const {
    return home_ms_[g] + (ctx_.knobs.copy_timing == 1 ? guest_ms_[g] : 0.0);
  }
  // Whether h, given a copy from d that lands at `lands_ms` and `gemm` ms more of d's guests,
  // still never waits: each donor's guests (their last copy's landing, their GEMM time), in
  // landing order, land by the time h has run its own work and the guests before them.
  // O(donors to h x log) with no allocation once warm.
  bool guests_in_time(int h, int d, double lands_ms, double gemm) const {
    std::vector<Arrival>& a = arrival_scratch_;
    a.assign(arrivals_[h].begin(), arrivals_[h].end());
    arrive(a, d, lands_ms, gemm);
    std::sort(a.begin(), a.end(), [](const Arrival& x, const Arrival& y) {
      return x.lands_ms != y.lands_ms ? x.lands_ms < y.lands_ms : x.donor < y.donor;
    });
    double ready_ms = home_ms_[h];  // when h has run all the work whose copies landed before
    for (const Arrival& x : a) {
      if (x.lands_ms > ready_ms) return false;
      ready_ms += x.gemm_ms;
    }
    return true;
  }
  void refresh(int g) { tree_.set(leaf_of_[g], g, eligible(g), leaf(g)); }

  // Sets g aside while the current expert is spilled (one slice per GPU and expert): `in_tree`
  // takes it out of the tree (it is put back, with its state then, when the expert is done);
  // otherwise searches pass over it.
  void exclude(int g, bool in_tree) {
    if (!excluded_[g]) excluded_list_.push_back(g);
    excluded_[g] = in_tree ? 2 : 1;
    if (in_tree) tree_.set(leaf_of_[g], g, false, {});
  }

  // Rows that the first `num` receivers take in total when filled up to `level`.
  int64_t fill(int64_t level, int num) const {
    int64_t rows = 0;
    for (int i = 0; i < num; ++i) rows += std::max<int64_t>(0, level - load_[receivers_[i]]);
    return rows;
  }

  // The load the first `num` receivers are filled up to with rows of expert e from donor d.
  // Normally the domain target (greedy: fewest helpers). When d cannot reach the target even
  // with e's helpers filled to it plus the load `rest` of its later candidates, and e alone can
  // bring d down to a common level, d and e's helpers are levelled instead (water-filling): e.g.
  // one hot expert split evenly over 1 + num GPUs.
  int64_t helper_level(int e, int d, int num, int64_t target, int64_t rest) const {
    const int64_t whole = units(remaining(e));
    const int64_t at_target = std::min(fill(target, num), whole);
    if (at_target + rest >= load_[d] - target) return target;
    // The smallest level at which the helpers take what d sheds.
    const int64_t lo = first_true(
        0, load_[d], [&](int64_t level) { return fill(level, num) >= load_[d] - level; });
    if (lo <= target || load_[d] - lo > whole) return target;
    return lo;
  }

  // Rows of expert e that donor d gives helper h, which the level says should get `want`
  // (0: no worthwhile slice).
  int64_t slice_for(int e, int d, int h, int64_t want, int64_t target, int64_t cap,
                    int64_t tol) const {
    const Knobs& k = ctx_.knobs;
    const int64_t avail = remaining(e), room = cap - load_[h], row_room = row_cap_ - rows_at_[h];
    // the whole rest of e as a new slice on h
    const bool whole_fits = units(avail) <= room && avail <= row_room;
    if (give_units(e, avail) <= load_[d] - target + tol && whole_fits) return avail;
    int64_t rows = std::min({avail, rows_within(want, avail), shed_rows(e, d, target), row_room});
    if (rows < avail) {
      const int64_t aligned = rows - rows % k.slice_align_rows;
      if (aligned >= k.min_slice_rows && load_[d] - give_units(e, aligned) <=
                                             std::max(cap, load_[d] - give_units(e, rows) + tol)) {
        rows = aligned;
      }
    }
    if (rows < k.min_slice_rows)
      rows = std::min({k.min_slice_rows, avail, rows_within(room, avail), row_room});
    // Above the row cap, d gives what it must even beyond h's room (within h's row room).
    rows = std::max(rows, std::min({avail, rows_at_[d] - row_cap_, row_room}));
    if (avail - rows < k.min_slice_rows && whole_fits) rows = avail;  // no sliver left at home
    return rows >= k.min_slice_rows || rows == avail ? rows : 0;
  }

  // `rows` of e from d to h, or, when their copy would land too late, the most that land in time:
  // a multiple of slice_align_rows, at least min_slice_rows, leaving no sliver at home (0: none).
  int64_t rows_in_time(int e, int d, int h, int64_t rows, bool weights_there) const {
    const Knobs& k = ctx_.knobs;
    const auto fits = [&](int64_t r) {
      const double t = copy_ms(r, !weights_there);
      return t <= 0 || copy_fits(e, d, h, r, t);
    };
    if (fits(rows)) return rows;
    const int64_t top = std::min(rows - 1, remaining(e) - k.min_slice_rows);
    const int64_t lo = (k.min_slice_rows + k.slice_align_rows - 1) / k.slice_align_rows;
    const int64_t hi = top / k.slice_align_rows;  // the largest multiple that fits, in [lo, hi]
    if (hi < lo || !fits(lo * k.slice_align_rows)) return 0;
    return last_true(lo, hi, [&](int64_t m) { return fits(m * k.slice_align_rows); }) *
           k.slice_align_rows;
  }

  // The next receiver for e from d: the least loaded GPU in the tree whose copy of the slice it
  // would get (its room, at most what d has to shed) lands in time, or failing that one whose copy
  // of a minimum slice does. Appends it to receivers_ and sets it aside; false if none.
  bool next_receiver(int e, int d, int64_t target, int64_t tol, bool gather) {
    const Knobs& k = ctx_.knobs;
    ReceiverTree::Need need;
    need.timing = static_cast<int>(k.copy_timing);
    // Gathering, the copies to the receivers found so far are queued on d's egress first.
    need.out_ms = gather ? gather_out_ms_ : links_.out_ms(d);
    need.fixed_ms = copy_ms(0, true);
    need.per_row_ms = k.one_hop ? 0.0 : row_ms_;
    need.rows = std::min(remaining(e), shed_rows(e, d, target - tol));
    need.finish_by_ms = k.copy_timing == 3 ? finish_by_ms_ : home_ms_[d];
    need.skip = excluded_.data();
    // The least loaded receiver whose copy of the excess lands in time, else one whose copy of a
    // minimum slice does. When the donor's egress is busy (its earlier copies are queued), the
    // first must also leave a receiver that keeps room for as much again below the target the
    // window for a minimum slice: a late copy into a short window would strand the rest of the
    // receiver's room behind it.
    if (need.out_ms > start_ms_) {
      need.reserve_to = target;
      need.reserve_rows = std::max(k.min_slice_rows, need.rows);
      need.reserve_ms = copy_ms(k.min_slice_rows, true);
    }
    const int h = find_receiver(need, !gather && excluded_list_.empty());
    if (h < 0) return false;
    if (gather) {
      const int64_t rows = std::min(
          gather_rows_, std::max<int64_t>(0, rows_within(target - load_[h], gather_rows_)));
      gather_rows_ -= rows;
      gather_out_ms_ = std::max(gather_out_ms_, links_.in_ms(h)) + copy_ms(rows, !prefetched(e, h));
    }
    exclude(h, gather);
    receivers_.push_back(h);
    return true;
  }

  // The receiver next_receiver() takes for `need`: the least loaded whose copy lands in time, else
  // (no reserve then) one whose copy of a minimum slice does; -1 if none. `reusable`: no GPU is
  // set aside, so the answer depends on `need` and the tree only, and the last such answer is
  // reused while neither changed (a donor often asks the same for its next candidate expert, e.g.
  // when no receiver has room for a slice).
  int find_receiver(ReceiverTree::Need need, bool reusable) {
    const Knobs& k = ctx_.knobs;
    if (reusable && last_find_.version == tree_.version() && same_need(last_find_.need, need))
      return last_find_.gpu;
    const ReceiverTree::Need asked = need;
    int h = tree_.find(need);
    need.reserve_to = 0;
    if (h < 0 && need.per_row_ms > 0 && need.rows > k.min_slice_rows) {
      need.rows = k.min_slice_rows;
      h = tree_.find(need);
    }
    if (reusable) last_find_ = {tree_.version(), asked, h};
    return h;
  }
  static bool same_need(const ReceiverTree::Need& a, const ReceiverTree::Need& b) {
    return a.timing == b.timing && a.out_ms == b.out_ms && a.fixed_ms == b.fixed_ms &&
           a.per_row_ms == b.per_row_ms && a.rows == b.rows && a.reserve_to == b.reserve_to &&
           a.reserve_rows == b.reserve_rows && a.reserve_ms == b.reserve_ms &&
           a.finish_by_ms == b.finish_by_ms && a.skip == b.skip;
  }

  // Helpers expert e may have: max_helpers_per_expert, or 2 x min(rows, d's excess) / target when
  // that is more (a hot expert), at most the domain's other GPUs.
  int helpers_allowed(int e, int d, int64_t target) const {
    const int64_t excess = std::min(units(remaining(e)), load_[d] - target);
    const int64_t hot = target > 0 ? (2 * excess + target - 1) / target : 0;
    return static_cast<int>(std::min<int64_t>(ctx_.topo.domain_size() - 1,
                                              std::max(ctx_.knobs.max_helpers_per_expert, hot)));
  }

  // Spills donor d's expert e to helpers; `rest`: the load of d's candidates after e.
  void spill_expert(int e, int d, int64_t target, int64_t cap, int64_t tol, int64_t rest,
                    Plan& out) {
    const Knobs& k = ctx_.knobs;
    // The GPUs holding e's prefetched weights first, least loaded first; they are not offered
    // again from the tree.
    receivers_.clear();
    for (int i = pre_begin_[e]; i < pre_begin_[e + 1]; ++i) {
      const int h = pre_gpu_[i];
      if (h != d && has_room(h) && ctx_.topo.same_domain(h, d)) receivers_.push_back(h);
    }
    sort_ids_ascending(receivers_, [&](int g) { return load_[g]; });
    const size_t held = receivers_.size();
    for (size_t i = 0; i < held; ++i) exclude(receivers_[i], false);
    int allowed = helpers_allowed(e, d, target);
    int64_t level = target;
    if (units(remaining(e)) + rest < load_[d] - target) {
      // d cannot reach the target: level it with e's helpers, gathered first.
      gather_out_ms_ = links_.out_ms(d);
      gather_rows_ = std::min(remaining(e), shed_rows(e, d, target));
      while (static_cast<int>(receivers_.size()) < allowed &&
             next_receiver(e, d, target, tol, true)) {
      }
      const int num = static_cast<int>(std::min<size_t>(receivers_.size(), allowed));
      level = helper_level(e, d, num, target, rest);
    }
    // An even share of what d sheds over its allowed helpers: a helper with room for less (filled
    // by earlier donors) does not count against the limit, like one whose window took less.
    const int64_t share =
        (std::min(remaining(e), shed_rows(e, d, target)) + allowed - 1) / std::max(allowed, 1);
    int helpers = 0, misses = 0;
    for (size_t i = 0; helpers < allowed && misses < kMaxMisses; ++i) {
      if (!over(d) || remaining(e) == 0) break;
      if (i == receivers_.size() && !next_receiver(e, d, target, tol, false)) break;
      const int h = receivers_[i];
      int64_t rows = slice_for(e, d, h, level - load_[h], target, cap, tol);
      // From the tree, receivers come least loaded first: if this one has no room for a slice,
      // none after it has.
      if (rows == 0 && i >= held) break;
      const bool weights_there = prefetched(e, h);
      const int64_t wanted = rows;
      if (rows > 0 && k.copy_timing) rows = rows_in_time(e, d, h, rows, weights_there);
      if (rows == 0) {
        misses += i >= held ? 1 : 0;
        continue;
      }
      // A helper whose window or room took only part of its share does not count against the
      // limit.
      if ((rows < wanted || rows < share) && allowed < ctx_.topo.domain_size() - 1) ++allowed;
      const double t = copy_ms(rows, !weights_there);
      if (k.copy_timing) {
        home_ms_[d] += gemm_ms(remaining(e) - rows) - gemm_ms(remaining(e));
        (t > 0 ? guest_ms_ : home_ms_)[h] += gemm_ms(rows);
      }
      if (t > 0) {
        const double lands_ms = links_.add(d, h, t);
        arrive(arrivals_[h], d, lands_ms, gemm_ms(rows));
        if (k.copy_timing == 2 && lands_ms > home_ms_[h])
          late_finish_ms_[d] = std::max(late_finish_ms_[d], lands_ms + guest_ms_[h]);
      }
      load_[d] -= give_units(e, rows);
      load_[h] += units(rows);
      rows_at_[d] -= rows;
      rows_at_[h] += rows;
      moved_[e] += rows;
      if (!weights_there) ++guests_[h];
      ++helpers;
      out.add_migration(e, d, h, rows, ctx_.shape, weights_there, k.one_hop != 0);
      if (excluded_[h] == 1) refresh(h);  // still in the tree: its new state now
    }
    // The receivers set aside are offered again, with their state now.
    for (int g : excluded_list_) {
      if (excluded_[g] == 2) refresh(g);
      excluded_[g] = 0;
    }
    excluded_list_.clear();
  }

 private:
  // Copy times: one expert's weights (setup included); one more row (the receivers' tree's
  // estimate).
  const double weight_ms_, row_ms_;
  double time_weight_ = 0;   // this plan's blend of rows and GEMM time in loads (units())
  bool by_time_ = false;     // time_weight_ > 0
  int64_t fixed_units_ = 0;  // by time: a GEMM's fixed cost where it is linear (units(s) - s)
  const double unit_ms_;     // by time: the GEMM time of one row, at large row counts
  mutable std::vector<double> gemm_ms_;         // by time: GEMM time by rows (ms), grown on demand
  std::vector<int64_t> rows_at_;                // [num_ranks] rows each GPU computes, as planned
  const std::vector<int64_t>* rows_ = nullptr;  // this step's expert_counts
  std::vector<int64_t> load_, moved_;
  std::vector<int64_t> guests_;
  CopyLinks links_;                         // when the queued copies run
  std::vector<double> home_ms_, guest_ms_;  // [num_ranks] modelled GEMM time, own and guest
  std::vector<int> candidates_, candidate_begin_, order_, donors_, receivers_;
  std::vector<int64_t> dom_target_;  // [num_domains]
  std::vector<int64_t> dom_load_;    // [num_domains] the domain's load before balancing
  // By time: the load a first plan's slices added per domain, which the next plan aims at
  // (aim_added_).
  std::vector<int64_t> added_;
  bool aim_added_ = false;
  int64_t cap_ = 0;
  int64_t row_budget_ = -1;  // >= 0: a GPU may end at most this many rows above its domain's mean
  int64_t row_cap_ = std::numeric_limits<int64_t>::max();  // the domain's row cap
  // Per receiver, the donors whose guests wait for copies: when their last copy lands and the
  // GEMM time of their guests there (window_ms()).
  struct Arrival {
    int donor;
    double lands_ms, gemm_ms;
  };
  // Into a receiver's donors: a copy from d that lands at `lands_ms`, with `gemm_ms` more of d's
  // guests.
  static void arrive(std::vector<Arrival>& a, int d, double lands_ms, double gemm_ms) {
    const auto it =
        std::find_if(a.begin(), a.end(), [d](const Arrival& x) { return x.donor == d; });
    if (it == a.end()) {
      a.push_back({d, lands_ms, gemm_ms});
    } else {
      it->lands_ms = std::max(it->lands_ms, lands_ms);
      it->gemm_ms += gemm_ms;
    }
  }
  std::vector<std::vector<Arrival>> arrivals_;    // [num_ranks]
  mutable std::vector<Arrival> arrival_scratch_;  // guests_in_time()
  std::vector<double> late_finish_ms_;  // [num_ranks] copy_timing 2: when each donor's late
                                        // receivers finish
  std::vector<uint8_t> in_set_;         // [num_experts] choose_candidates(): in the placement's set
  std::vector<int> next_candidate_;     // [num_ranks] a donor's next candidate (candidates_ index)
  std::vector<int64_t> rest_;           // [num_ranks] load of a donor's candidates not offered yet
  double finish_by_ms_ = 0;             // copy_timing = 3: late receivers finish by this
  // Gathering helpers for a hot expert: when d's egress is free after the copies to those found so
  // far, and the rows not yet assigned to them.
  double gather_out_ms_ = 0;
  double start_ms_ = 0;
  int64_t gather_rows_ = 0;
  ReceiverTree tree_;  // the domain's receivers
  struct LastFind {
    uint64_t version = 0;  // the tree's version when it was searched (0: none)
    ReceiverTree::Need need;
    int gpu = -1;
  };
  LastFind last_find_;             // find_receiver()'s last reusable answer
  std::vector<int> leaf_of_;       // [num_ranks] tree leaf
  std::vector<uint8_t> excluded_;  // [num_ranks] 1: passed over, 2: out of the tree
                                   // [num_ranks] set aside for the expert being spilled
  std::vector<int> excluded_list_;
  // Prefetch: per layer history and prediction; this plan's prefetches by expert.
  std::vector<LayerPrefetch> layers_;
  std::vector<Pair> merged_;
  std::vector<double> pre_in_, pre_out_;
  std::vector<int64_t> pre_slots_;
  std::vector<int> pre_begin_, pre_gpu_, fill_;
  // level_time(): each GPU's guest slices (by index, [level_begin_[g], level_begin_[g + 1])), each
  // expert's slice at its home, each GPU's modelled GEMM time and rows.
  std::vector<int> level_begin_, level_slice_, home_slice_;
  std::vector<int> guest_begin_, guest_slice_;  // the guest slices by expert
  Plan level_before_;                           // the plan before levelling
  CopyTimer copy_timer_;
  std::vector<double> level_end_;  // when level_before_'s copies land
  std::vector<double> level_ms_;
  std::vector<int64_t> level_rows_;
  Plan scratch_;
  std::vector<double> straggler_ms_;  // [num_ranks] gemm_straggler_ms()
  Plan kept_;  // time_balance_budget: the best plan kept within the budget so far
};

}  // namespace

std::unique_ptr<Planner> make_feplb_planner(const PlannerContext& ctx) {
  FEPLB_REQUIRE_INPUT(ctx.knobs.feplb_dyn_set <= 1, "--feplb-dyn-set: {} must be 0 or 1",
                      ctx.knobs.feplb_dyn_set);
  FEPLB_REQUIRE_INPUT(ctx.knobs.copy_timing <= 3, "--copy-timing: {} must be 0, 1, 2 or 3",
                      ctx.knobs.copy_timing);
  FEPLB_REQUIRE_INPUT(
      ctx.cost || (ctx.knobs.balance_time_weight == 0 && ctx.knobs.time_balance_budget == 0 &&
                   ctx.knobs.copy_timing == 0),
      "feplb: copy timing and time balancing need a GEMM cost model");
  return std::make_unique<FeplbPlanner>(ctx);
}

}  // namespace feplb
