// feplb: our planner, the default. What it adds to the paper's greedy (feplb_paper.cc):
//  1. The dynamic set is chosen per micro-batch from the counts: each GPU's `dyn` busiest experts
//     (ties: lower index). The host knows the counts before it launches any GEMM, so it launches
//     the other (static) experts at once and plans meanwhile. With feplb_dyn_set = 1 the
//     candidates are the placement's dynamic sets instead (history-based, placer.h), busiest first.
//  2. It balances to an exact target instead of moving whole experts only: per NVLink domain the
//     target is ceil(T / GPUs); a GPU above target + tolerance hands rows of its busiest dynamic
//     experts to the GPU with the most room, whole experts when they fit, otherwise a slice
//     (at least min_slice_rows, split points rounded to slice_align_rows, at most
//     max_helpers_per_expert helpers per expert).
//  3. Copies are timed (copy-engine bandwidth, first in first out on the sender's egress and the
//     receiver's ingress, after the counts round trip and the planner's budget). A copy must land
//     while the receiver still runs its own experts (hidden: copy_timing = 1, the default), or
//     (copy_timing = 2) be one after which the receiver, idle until it lands, finishes before the
//     donor: an exposed copy that never makes the layer slower (a little better balance on the most
//     skewed priors, at a small exposure; docs/planners.md).
// Deterministic; O(E log E) per step with no allocation after the first call.
#include <algorithm>
#include <cmath>

#include "feplb/core/error.h"
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
    choose_candidates(c, out.dynamic);
    if (k.copy_timing) own_gemm_times(c);

    int64_t total = 0;
    for (int64_t l : load_) total += l;
    const int64_t tol =
        static_cast<int64_t>(std::floor(k.balance_tolerance * static_cast<double>(total) / R));

    for (int dom = 0; dom < topo.num_domains(); ++dom) {
      const int first = topo.first_gpu_of_domain(dom), n = topo.domain_size();
      int64_t dom_total = 0;
      donors_.clear();
      for (int g = first; g < first + n; ++g) dom_total += load_[g];
      const int64_t target = (dom_total + n - 1) / n, cap = target + tol;
      for (int g = first; g < first + n; ++g) {
        if (load_[g] > cap) donors_.push_back(g);
      }
      sort_ids_descending(donors_, [&](int g) { return load_[g]; });
      for (int d : donors_) {
        const int* cand = &candidates_[candidate_begin_[d]];
        const int num_candidates = candidate_begin_[d + 1] - candidate_begin_[d];
        int64_t rest_rows = 0;  // rows of d's candidates not offered yet
        for (int i = 0; i < num_candidates; ++i) rest_rows += c[cand[i]];
        for (int i = 0; i < num_candidates && load_[d] > cap; ++i) {
          rest_rows -= c[cand[i]];
          spill_expert(cand[i], d, first, n, target, cap, tol, rest_rows, out);
        }
      }
    }
    out.add_home_slices(topo, routing, moved_);
  }

 private:
  // Each GPU's candidates, busiest first: candidates_[candidate_begin_[gpu] + i]. Its `dyn`
  // busiest local experts, or (feplb_dyn_set = 1) its experts in the placement's dynamic set.
  void choose_candidates(const std::vector<int64_t>& c, std::vector<uint8_t>& dynamic) {
    const Topology& topo = ctx_.topo;
    const bool from_placement = ctx_.knobs.feplb_dyn_set == 1;
    const int per_gpu =
        from_placement
            ? topo.experts_per_rank()
            : static_cast<int>(std::min<int64_t>(ctx_.knobs.dyn, topo.experts_per_rank()));
    candidates_.resize(static_cast<size_t>(topo.num_ranks()) * per_gpu);
    candidate_begin_.resize(static_cast<size_t>(topo.num_ranks()) + 1);
    const auto busier = [&](int a, int b) { return c[a] != c[b] ? c[a] > c[b] : a < b; };
    int next = 0;
    for (int g = 0; g < topo.num_ranks(); ++g) {
      candidate_begin_[g] = next;
      int n = per_gpu;
      if (from_placement) {
        placement_dynamic_set(ctx_, g, order_);
        n = static_cast<int>(order_.size());
        std::sort(order_.begin(), order_.end(), busier);
      } else {
        auto local = topo.local_experts(g);
        order_.assign(local.begin(), local.end());
        std::partial_sort(order_.begin(), order_.begin() + n, order_.end(), busier);
      }
      for (int i = 0; i < n; ++i) {
        candidates_[static_cast<size_t>(next++)] = order_[i];
        dynamic[order_[i]] = 1;
      }
    }
    candidate_begin_[topo.num_ranks()] = next;
  }

  // home_ms_[g]: modelled GEMM time of g's own rows that stay on g (updated as g gives rows
  // away). g runs them first, so copies into g that land within it (after the counts round trip
  // and the planner) are hidden.
  void own_gemm_times(const std::vector<int64_t>& c) {
    const Topology& topo = ctx_.topo;
    home_ms_.assign(static_cast<size_t>(topo.num_ranks()), 0.0);
    guest_ms_.assign(static_cast<size_t>(topo.num_ranks()), 0.0);
    for (int g = 0; g < topo.num_ranks(); ++g) {
      for (int e : topo.local_experts(g)) home_ms_[g] += ctx_.cost->expert_ms(c[e]);
    }
  }

  // Whether `rows` of e may go from d to h given when the copy would land. Hidden copies always
  // may. An exposed copy (h idles waiting for it) may only with copy_timing = 2, and only if h,
  // waiting and then computing its guests, still finishes before d does after giving the rows.
  bool copy_fits(int e, int d, int h, int64_t rows, double t) const {
    const double overhead_ms = (ctx_.knobs.counts_to_host_us + ctx_.knobs.planner_budget_us) * 1e-3;
    const double lands_ms = overhead_ms + std::max(in_ms_[h], out_ms_[d]) + t;
    if (lands_ms <= home_ms_[h]) return true;
    if (ctx_.knobs.copy_timing < 2) return false;
    const GemmCostModel& cost = *ctx_.cost;
    const double donor_after_ms =
        home_ms_[d] - cost.expert_ms(remaining(e)) + cost.expert_ms(remaining(e) - rows);
    return lands_ms + guest_ms_[h] + cost.expert_ms(rows) <= donor_after_ms;
  }

  double copy_ms(int64_t rows) const {
    const double bytes =
        static_cast<double>(ctx_.shape.weight_bytes() + rows * ctx_.shape.row_bytes());
    return bytes / (ctx_.knobs.copy_gbps * 1e9) * 1e3 +
           2 * ctx_.knobs.copy_setup_us * 1e-3;  // 2 copies
  }

  int64_t remaining(int e) const { return (*rows_)[e] - moved_[e]; }

  // Rows that `receivers` take in total when filled up to `level`.
  int64_t fill(int64_t level, int num) const {
    int64_t rows = 0;
    for (int i = 0; i < num; ++i) rows += std::max<int64_t>(0, level - load_[receivers_[i]]);
    return rows;
  }

  // The load the first `num` receivers are filled up to with rows of expert e from donor d.
  // Normally the domain target (greedy: fewest helpers). When d cannot reach the target even
  // with e's helpers filled to it plus all `rest_rows` of its later candidates, and e alone can
  // bring d down to a common level, d and e's helpers are levelled instead (water-filling): e.g.
  // one hot expert split evenly over 1 + num GPUs.
  int64_t helper_level(int e, int d, int num, int64_t target, int64_t rest_rows) const {
    const int64_t at_target = std::min(fill(target, num), remaining(e));
    if (at_target + rest_rows >= load_[d] - target) return target;
    int64_t lo = 0, hi = load_[d];  // the smallest level at which the helpers take what d sheds
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (fill(mid, num) >= load_[d] - mid)
        hi = mid;
      else
        lo = mid + 1;
    }
    if (lo <= target || load_[d] - lo > remaining(e)) return target;
    return lo;
  }

  // Rows of expert e that donor d gives helper h, which the level says should get `want`
  // (0: no worthwhile slice).
  int64_t slice_for(int e, int d, int h, int64_t want, int64_t target, int64_t cap,
                    int64_t tol) const {
    const Knobs& k = ctx_.knobs;
    const int64_t avail = remaining(e), room = cap - load_[h];
    if (avail <= load_[d] - target + tol && avail <= room) return avail;  // the whole rest of e
    int64_t rows = std::min({avail, want, load_[d] - target});
    if (rows < avail) {
      const int64_t aligned = rows - rows % k.slice_align_rows;
      if (aligned >= k.min_slice_rows &&
          load_[d] - aligned <= std::max(cap, load_[d] - rows + tol)) {
        rows = aligned;
      }
    }
    if (rows < k.min_slice_rows) rows = std::min({k.min_slice_rows, avail, room});
    if (avail - rows < k.min_slice_rows && avail <= room) rows = avail;  // no sliver left at home
    return rows >= k.min_slice_rows || rows == avail ? rows : 0;
  }

  void spill_expert(int e, int d, int first, int n, int64_t target, int64_t cap, int64_t tol,
                    int64_t rest_rows, Plan& out) {
    const Knobs& k = ctx_.knobs;
    // Receivers by room, most first (ties: lower index): the GPUs below the cap with a free
    // guest slot (a donor already brought down to the target may receive from another donor).
    receivers_.clear();
    for (int h = first; h < first + n; ++h) {
      if (h != d && guests_[h] < k.max_num_dyn && load_[h] < cap) receivers_.push_back(h);
    }
    sort_ids_ascending(receivers_, [&](int g) { return load_[g]; });
    const int num =
        static_cast<int>(std::min<int64_t>(receivers_.size(), k.max_helpers_per_expert));
    const int64_t level = helper_level(e, d, num, target, rest_rows);
    int helpers = 0;
    for (size_t i = 0; i < receivers_.size() && helpers < k.max_helpers_per_expert; ++i) {
      if (load_[d] <= cap || remaining(e) == 0) return;
      const int h = receivers_[i];
      const int64_t want = level - load_[h];
      const int64_t rows = slice_for(e, d, h, want, target, cap, tol);
      if (rows == 0) continue;
      const double t = copy_ms(rows);
      if (k.copy_timing) {
        if (!copy_fits(e, d, h, rows, t)) continue;
        home_ms_[d] +=
            ctx_.cost->expert_ms(remaining(e) - rows) - ctx_.cost->expert_ms(remaining(e));
        guest_ms_[h] += ctx_.cost->expert_ms(rows);
      }
      in_ms_[h] = std::max(in_ms_[h], out_ms_[d]) + t;
      out_ms_[d] = in_ms_[h];
      load_[d] -= rows;
      load_[h] += rows;
      moved_[e] += rows;
      ++guests_[h];
      ++helpers;
      out.add_migration(e, d, h, rows, ctx_.shape);
    }
  }

 private:
  const std::vector<int64_t>* rows_ = nullptr;  // this step's expert_counts
  std::vector<int64_t> load_, moved_;
  std::vector<int64_t> guests_;
  std::vector<double> in_ms_, out_ms_;      // [num_ranks] when the links' queued copies end
  std::vector<double> home_ms_, guest_ms_;  // [num_ranks] modelled GEMM time, own and guest
  std::vector<int> candidates_, candidate_begin_, order_, donors_, receivers_;
};

}  // namespace

std::unique_ptr<Planner> make_feplb_planner(const PlannerContext& ctx) {
  FEPLB_REQUIRE_INPUT(ctx.knobs.feplb_dyn_set <= 1, "--feplb-dyn-set: {} must be 0 or 1",
                      ctx.knobs.feplb_dyn_set);
  return std::make_unique<FeplbPlanner>(ctx);
}

}  // namespace feplb
