// feplb-paper: the scheduler of the FEPLB paper (arXiv 2604.19654), as described there.
//
// Each GPU has `dyn` dynamic experts. The paper does not say how they are chosen; by default
// (paper_dyn_set = 0) they are the `dyn` local experts with the most rows in the steps this
// planner has observed so far for the same layer (a walk-forward stand-in for the paper's
// history-based "Router Predictor"; the lowest-numbered local experts before any history). With
// paper_dyn_set = 1 they are always the lowest-numbered local experts; with paper_dyn_set = 2 they
// are the placement's dynamic sets (placer.h: the macro timescale's Router Predictor). Per NVLink
// domain, greedily:
//   d_max = most loaded GPU; e = its busiest dynamic expert not yet moved;
//   stop if rows(e) < tau;  d_min = least loaded GPU with a free guest slot;
//   move all of e (weights + rows) d_max -> d_min if that lowers the pair's max, else skip e;
// until d_max has no movable dynamic expert. Each expert moves at most once; at most max_num_dyn
// guests per helper; ties go to the lower index.
#include <algorithm>
#include <map>

#include "feplb/core/error.h"
#include "feplb/core/planners/policies.h"

namespace feplb {
namespace {

class FeplbPaperPlanner final : public Planner {
 public:
  using Planner::Planner;
  std::string_view name() const override { return "feplb-paper"; }

  void observe(const RoutingStep& routing) override {
    auto& h = history_[routing.layer];
    h.resize(routing.expert_counts.size(), 0);
    for (size_t e = 0; e < h.size(); ++e) h[e] += routing.expert_counts[e];
  }

  void make_plan(const RoutingStep& routing, Plan& out) override {
    const Topology& topo = ctx_.topo;
    const int E = topo.num_experts(), R = topo.num_ranks();
    const auto& c = routing.expert_counts;
    out.clear(E);
    choose_dynamic_sets(routing.layer, out.dynamic);
    home_loads(topo, routing, load_);
    moved_.assign(static_cast<size_t>(E), 0);
    guests_.assign(static_cast<size_t>(R), 0);

    for (int dom = 0; dom < topo.num_domains(); ++dom) {
      const int first = topo.first_gpu_of_domain(dom), last = first + topo.domain_size();
      // The most and least loaded GPUs from two heaps (ties: lower index); an entry whose GPU's
      // load has changed since is stale and dropped when it surfaces.
      max_heap_.clear();
      min_heap_.clear();
      for (int d = first; d < last; ++d) push(d);
      for (;;) {
        while (max_heap_.front().load != load_[max_heap_.front().gpu]) {
          std::pop_heap(max_heap_.begin(), max_heap_.end(), lower_);
          max_heap_.pop_back();
        }
        const int d_max = max_heap_.front().gpu;
        // d_max's dynamic experts still at home, busiest first.
        movable_.clear();
        for (int e : topo.local_experts(d_max)) {
          if (out.dynamic[e] && moved_[e] == 0) movable_.push_back(e);
        }
        sort_ids_descending(movable_, [&](int e) { return c[e]; });
        const int d_min = least_loaded_except(d_max);
        bool moved_one = false;
        for (int e : movable_) {
          if (c[e] < ctx_.knobs.tau || c[e] == 0)
            break;  // busier ones failed; smaller are below tau
          if (d_min < 0) break;
          if (load_[d_min] + c[e] >= load_[d_max]) continue;  // would not lower the max: skip e
          load_[d_max] -= c[e];
          load_[d_min] += c[e];
          moved_[e] = c[e];
          ++guests_[d_min];
          out.add_migration(e, d_max, d_min, c[e], ctx_.shape);
          push(d_max);
          push(d_min);
          moved_one = true;
          break;
        }
        if (!moved_one) break;
      }
    }
    out.add_home_slices(topo, routing, moved_);
  }

 private:
  void choose_dynamic_sets(int64_t layer, std::vector<uint8_t>& dynamic) {
    const Topology& topo = ctx_.topo;
    const auto it = history_.find(layer);
    const int dyn = static_cast<int>(std::min<int64_t>(ctx_.knobs.dyn, topo.experts_per_rank()));
    for (int g = 0; g < topo.num_ranks(); ++g) {
      if (ctx_.knobs.paper_dyn_set == 2) {  // the placement's (history-based) set
        placement_dynamic_set(ctx_, g, order_);
        for (int e : order_) dynamic[e] = 1;
        continue;
      }
      auto local = topo.local_experts(g);
      order_.assign(local.begin(), local.end());
      if (it != history_.end() && ctx_.knobs.paper_dyn_set == 0) {
        const auto& h = it->second;
        sort_ids_descending(order_, [&](int e) { return h[e]; });
      }
      for (int i = 0; i < dyn; ++i) dynamic[order_[i]] = 1;
    }
  }

  struct Entry {
    int64_t load;
    int gpu;
  };
  // Orders the max-heap (most load on top) and, reversed, the min-heap; ties: lower index on top.
  static constexpr auto lower_ = [](const Entry& a, const Entry& b) {
    return a.load != b.load ? a.load < b.load : a.gpu > b.gpu;
  };
  static constexpr auto higher_ = [](const Entry& a, const Entry& b) {
    return a.load != b.load ? a.load > b.load : a.gpu > b.gpu;
  };

  void push(int g) {
    max_heap_.push_back({load_[g], g});
    std::push_heap(max_heap_.begin(), max_heap_.end(), lower_);
    min_heap_.push_back({load_[g], g});
    std::push_heap(min_heap_.begin(), min_heap_.end(), higher_);
  }

  // The least loaded GPU other than `skip` with a free guest slot, or -1.
  int least_loaded_except(int skip) {
    // Stale entries, full GPUs and (`also`) duplicates of `skip` go.
    const auto drop_stale = [&](int also) {
      while (!min_heap_.empty()) {
        const Entry& t = min_heap_.front();
        if (t.load == load_[t.gpu] && guests_[t.gpu] < ctx_.knobs.max_num_dyn && t.gpu != also)
          return;
        std::pop_heap(min_heap_.begin(), min_heap_.end(), higher_);
        min_heap_.pop_back();
      }
    };
    drop_stale(-1);
    if (min_heap_.empty()) return -1;
    if (min_heap_.front().gpu != skip) return min_heap_.front().gpu;
    std::pop_heap(min_heap_.begin(), min_heap_.end(), higher_);
    const Entry held = min_heap_.back();
    min_heap_.pop_back();
    drop_stale(skip);
    const int found = min_heap_.empty() ? -1 : min_heap_.front().gpu;
    min_heap_.push_back(held);
    std::push_heap(min_heap_.begin(), min_heap_.end(), higher_);
    return found;
  }

  std::map<int64_t, std::vector<int64_t>> history_;  // layer -> rows per expert, summed
  std::vector<Entry> max_heap_, min_heap_;
  std::vector<int64_t> load_, moved_, guests_;
  std::vector<int> movable_, order_;
};

}  // namespace

std::unique_ptr<Planner> make_feplb_paper_planner(const PlannerContext& ctx) {
  FEPLB_REQUIRE_INPUT(ctx.knobs.paper_dyn_set <= 2, "--paper-dyn-set: {} must be 0, 1 or 2",
                      ctx.knobs.paper_dyn_set);
  return std::make_unique<FeplbPaperPlanner>(ctx);
}

}  // namespace feplb
