// feplb: our planner, the default. What it adds to the paper's greedy (feplb_paper.cc):
//  1. The dynamic set is chosen per micro-batch from the counts: each GPU's `dyn` busiest experts
//     (ties: lower index). The host knows the counts before it launches any GEMM, so it launches
//     the other (static) experts at once and plans meanwhile.
//  2. It balances to an exact target instead of moving whole experts only: per NVLink domain the
//     target is ceil(T / GPUs); a GPU above target + tolerance hands rows of its busiest dynamic
//     experts to the GPU with the most room, whole experts when they fit, otherwise a slice
//     (at least min_slice_rows, split points rounded to slice_align_rows, at most
//     max_helpers_per_expert helpers per expert).
//  3. Every copy must land while the receiving GPU still runs its own experts (metrics.h), with
//     the copy-engine bandwidth shared first-in first-out on the receiver's ingress and the
//     sender's egress, after the counts round trip and the planner's budget.
// Deterministic; O(E log E) per step with no allocation after the first call.
#include <algorithm>
#include <cmath>

#include "feplb/core/planners/policies.h"

namespace feplb {
namespace {

class FeplbPlanner final : public Planner {
 public:
  using Planner::Planner;
  std::string_view name() const override { return "feplb"; }

  void plan(const RoutingStep& routing, Plan& out) override {
    const Topology& topo = ctx_.topo;
    const Knobs& k = ctx_.knobs;
    const int E = topo.num_experts(), R = topo.num_ranks();
    const auto& c = routing.expert_counts;
    rows_ = &c;
    out.clear(E);
    home_loads(topo, routing, load_);
    moved_.assign(static_cast<size_t>(E), 0);
    guests_.assign(static_cast<size_t>(R), 0);
    in_ms_.assign(static_cast<size_t>(R), 0.0);
    out_ms_.assign(static_cast<size_t>(R), 0.0);
    holds_.assign(static_cast<size_t>(R), 0);
    choose_candidates(c, out.dynamic);
    if (k.window_check) static_windows(c);

    int64_t total = 0;
    for (int64_t l : load_) total += l;
    const int64_t tol = static_cast<int64_t>(std::floor(k.balance_tolerance * static_cast<double>(total) / R));

    for (int dom = 0; dom < topo.num_domains(); ++dom) {
      const int first = topo.first_gpu_of_domain(dom), n = topo.domain_size();
      int64_t dom_total = 0;
      donors_.clear();
      for (int g = first; g < first + n; ++g) dom_total += load_[g];
      const int64_t target = (dom_total + n - 1) / n, cap = target + tol;
      for (int g = first; g < first + n; ++g) {
        if (load_[g] > cap) donors_.push_back(g);
      }
      std::stable_sort(donors_.begin(), donors_.end(), [&](int a, int b) { return load_[a] > load_[b]; });
      for (int d : donors_) {
        for (int i = 0; i < num_candidates_ && load_[d] > cap; ++i) {
          const int e = candidates_[static_cast<size_t>(d) * num_candidates_ + i];
          spill_expert(e, d, first, n, target, cap, tol, out);
        }
      }
    }
    out.add_home_slices(topo, routing, moved_);
  }

 private:
  // Each GPU's `dyn` busiest local experts, busiest first: candidates_[gpu, i].
  void choose_candidates(const std::vector<int64_t>& c, std::vector<uint8_t>& dynamic) {
    const Topology& topo = ctx_.topo;
    num_candidates_ = static_cast<int>(std::min<int64_t>(ctx_.knobs.dyn, topo.experts_per_rank()));
    candidates_.resize(static_cast<size_t>(topo.num_ranks()) * num_candidates_);
    for (int g = 0; g < topo.num_ranks(); ++g) {
      auto local = topo.local_experts(g);
      order_.assign(local.begin(), local.end());
      std::partial_sort(order_.begin(), order_.begin() + num_candidates_, order_.end(),
                        [&](int a, int b) { return c[a] != c[b] ? c[a] > c[b] : a < b; });
      for (int i = 0; i < num_candidates_; ++i) {
        candidates_[static_cast<size_t>(g) * num_candidates_ + i] = order_[i];
        dynamic[order_[i]] = 1;
      }
    }
  }

  // budget_ms_[g]: how long copies into g may take. A receiver never gives rows away (its load
  // is below the cap), so it first runs all its own experts: their GEMM time, less the time
  // before any copy can start (counts round trip and the planner), is the window.
  void static_windows(const std::vector<int64_t>& c) {
    const Topology& topo = ctx_.topo;
    const double overhead_ms = (ctx_.knobs.counts_to_host_us + ctx_.knobs.planner_budget_us) * 1e-3;
    budget_ms_.assign(static_cast<size_t>(topo.num_ranks()), 0.0);
    for (int g = 0; g < topo.num_ranks(); ++g) {
      double ms = 0.0;
      for (int e : topo.local_experts(g)) ms += ctx_.cost->expert_ms(c[e]);
      budget_ms_[g] = ms - overhead_ms;
    }
  }

  double copy_ms(int64_t rows) const {
    const double bytes = static_cast<double>(ctx_.shape.weight_bytes() + rows * ctx_.shape.row_bytes());
    return bytes / (ctx_.knobs.copy_gbps * 1e9) * 1e3 + ctx_.knobs.copy_setup_us * 1e-3;
  }

  // Rows of expert e to take from donor d for helper h (0: no worthwhile slice fits h).
  int64_t slice_for(int e, int d, int h, int64_t target, int64_t cap, int64_t tol) const {
    const Knobs& k = ctx_.knobs;
    const int64_t avail = remaining(e);
    const int64_t excess = load_[d] - target, room = cap - load_[h];
    if (room <= 0) return 0;
    if (avail <= excess + tol && avail <= room) return avail;  // the whole rest of the expert
    int64_t rows = std::min({avail, excess, std::max<int64_t>(target - load_[h], 1)});
    if (rows < avail) {
      const int64_t aligned = rows - rows % k.slice_align_rows;
      if (aligned >= k.min_slice_rows && load_[d] - aligned <= cap) rows = aligned;
    }
    if (rows < k.min_slice_rows) rows = std::min({k.min_slice_rows, avail, room});
    if (avail - rows < k.min_slice_rows && avail <= room) rows = avail;  // no sliver left at home
    return rows >= k.min_slice_rows || rows == avail ? rows : 0;
  }

  int64_t remaining(int e) const { return (*rows_)[e] - moved_[e]; }

  void spill_expert(int e, int d, int first, int n, int64_t target, int64_t cap, int64_t tol,
                    Plan& out) {
    const Knobs& k = ctx_.knobs;
    std::fill(holds_.begin() + first, holds_.begin() + first + n, 0);
    int helpers = 0;
    while (load_[d] > cap && remaining(e) > 0 && helpers < k.max_helpers_per_expert) {
      // Receivers by room, most first (ties: lower index); take the first one that fits.
      receivers_.clear();
      for (int h = first; h < first + n; ++h) {
        if (h != d && !holds_[h] && guests_[h] < k.max_num_dyn && load_[h] < cap) receivers_.push_back(h);
      }
      std::stable_sort(receivers_.begin(), receivers_.end(),
                       [&](int a, int b) { return load_[a] < load_[b]; });
      int chosen = -1;
      int64_t rows = 0;
      for (int h : receivers_) {
        rows = slice_for(e, d, h, target, cap, tol);
        if (rows == 0) continue;
        const double t = copy_ms(rows);
        if (k.window_check && (in_ms_[h] + t > budget_ms_[h] || out_ms_[d] + t > budget_ms_[h])) continue;
        chosen = h;
        break;
      }
      if (chosen < 0) return;
      const double t = copy_ms(rows);
      in_ms_[chosen] += t;
      out_ms_[d] += t;
      load_[d] -= rows;
      load_[chosen] += rows;
      moved_[e] += rows;
      ++guests_[chosen];
      holds_[chosen] = 1;
      ++helpers;
      out.add_migration(e, d, chosen, rows, ctx_.shape);
    }
  }

 private:
  const std::vector<int64_t>* rows_ = nullptr;  // this step's expert_counts
  std::vector<int64_t> load_, moved_;
  std::vector<int64_t> guests_;
  std::vector<double> in_ms_, out_ms_, budget_ms_;
  std::vector<uint8_t> holds_;
  std::vector<int> candidates_, order_, donors_, receivers_;
  int num_candidates_ = 0;
};

}  // namespace

std::unique_ptr<Planner> make_feplb_planner(const PlannerContext& ctx) {
  return std::make_unique<FeplbPlanner>(ctx);
}

}  // namespace feplb
