// llep: Least-Loaded Expert Parallelism (SalesforceAIResearch/LeastLoadedEP, arXiv 2601.17111):
// the LPT spill of compute_llep_lpt_plan, every micro-batch:
//   cap = int(llep_cap_factor * floor(total / GPUs)) (total if that floor is 0, at least 1);
//   pending[g] = g's native load; assigned = 0.
//   For each expert by count, largest first (ties: lower index; empty experts skipped): remove it
//   from its home's pending load; effective(g) = assigned[g] + pending[g]; the home takes what
//   fits under the cap (all of it if it can). The rest is spilled:
//     - if the home took some: repeatedly, the other GPUs by effective load (least first, ties:
//       lower index); the first with room takes min(rest, room), skipping a chunk smaller than
//       llep_min_chunk unless it is the whole rest; if none can, the least loaded takes the rest;
//     - if the home took nothing: one pass over the others in that order with the same rule, and
//       whatever is left goes to the first of them (the order sorted before the pass).
// Spilled rows go straight from their sources to the helper (the plan exists before the
// dispatch), and the expert's weights go home -> helper by NCCL P2P, on any GPU of the EP group.
// A helper that receives two chunks of one expert (the forced fallback can pick a helper already
// used) computes them as one slice with one weight copy; LLEP would send the weights twice.
#include <algorithm>
#include <numeric>

#include "feplb/core/planners/policies.h"

namespace feplb {
namespace {

class LlepPlanner final : public Planner {
 public:
  using Planner::Planner;
  std::string_view name() const override { return "llep"; }
  PlanLimits limits() const override {
    return {false, static_cast<int64_t>(ctx_.topo.num_experts())};
  }
  DataMovement data_movement() const override {
    return {"NCCL all-to-all", ctx_.knobs.nccl_sms, "NCCL P2P", ctx_.knobs.nccl_sms, true};
  }

  void make_plan(const RoutingStep& routing, Plan& out) override {
    const Topology& topo = ctx_.topo;
    const int E = topo.num_experts(), R = topo.num_ranks();
    const auto& c = routing.expert_counts;
    out.clear(E);
    out.planned_before_dispatch = true;  // the dispatch needs the plan: it waits for it
    home_loads(topo, routing, pending_);
    assigned_.assign(static_cast<size_t>(R), 0);
    rows_on_.assign(static_cast<size_t>(R) * E, 0);
    int64_t total = 0;
    for (int64_t l : pending_) total += l;
    const int64_t balanced = total / R;
    cap_ = std::max<int64_t>(1, balanced > 0 ? static_cast<int64_t>(ctx_.knobs.llep_cap_factor *
                                                                    static_cast<double>(balanced))
                                             : total);
    order_.resize(static_cast<size_t>(E));
    std::iota(order_.begin(), order_.end(), 0);
    sort_ids_descending(order_, [&](int e) { return c[e]; });

    for (int e : order_) {
      if (c[e] == 0) continue;
      const int home = topo.home(e);
      pending_[home] -= c[e];
      const int64_t room = cap_ - effective(home);
      if (room >= c[e]) {
        assign(e, home, c[e]);
      } else if (room > 0) {
        assign(e, home, room);
        int64_t rest = c[e] - room;
        while (rest > 0) {
          sort_others(home);
          if (others_.empty()) {
            assign(e, home, rest);
            break;
          }
          bool placed = false;
          for (int h : others_) {
            const int64_t chunk = chunk_for(h, rest);
            if (chunk == 0) continue;
            assign(e, h, chunk);
            rest -= chunk;
            placed = true;
            break;  // loads changed: re-sort for the next chunk
          }
          if (!placed) {
            assign(e, others_[0], rest);
            rest = 0;
          }
        }
      } else {
        sort_others(home);
        int64_t rest = c[e];
        for (int h : others_) {
          if (rest == 0) break;
          const int64_t chunk = chunk_for(h, rest);
          if (chunk == 0) continue;
          assign(e, h, chunk);
          rest -= chunk;
        }
        if (rest > 0) assign(e, others_.empty() ? home : others_[0], rest);
      }
    }

    for (int e = 0; e < E; ++e) {
      for (int g = 0; g < R; ++g) {
        const int64_t rows = rows_on_[static_cast<size_t>(g) * E + e];
        if (rows == 0) continue;
        const bool at_home = g == topo.home(e);
        out.slices.push_back({e, g, rows, at_home ? RowSource::kHome : RowSource::kDispatched});
        if (!at_home) {
          out.copies.push_back(
              {CopyKind::kWeights, e, topo.home(e), g, 0, ctx_.shape.weight_bytes()});
          out.dynamic[e] = 1;
        }
      }
    }
  }

 private:
  int64_t effective(int g) const { return assigned_[g] + pending_[g]; }

  // The other GPUs by effective load, least first (ties: lower index).
  void sort_others(int home) {
    others_.clear();
    for (int g = 0; g < ctx_.topo.num_ranks(); ++g) {
      if (g != home) others_.push_back(g);
    }
    sort_ids_ascending(others_, [&](int g) { return effective(g); });
  }

  // What helper h takes of `rest` rows: its room under the cap, unless that is a chunk below the
  // minimum that would leave rows behind (0: skip h).
  int64_t chunk_for(int h, int64_t rest) const {
    const int64_t room = cap_ - effective(h);
    if (room <= 0) return 0;
    const int64_t chunk = std::min(rest, room);
    return chunk < ctx_.knobs.llep_min_chunk && rest > chunk ? 0 : chunk;
  }

  void assign(int e, int g, int64_t rows) {
    rows_on_[static_cast<size_t>(g) * ctx_.topo.num_experts() + e] += rows;
    assigned_[g] += rows;
  }

  int64_t cap_ = 0;
  std::vector<int64_t> pending_, assigned_;  // [R]
  std::vector<int64_t> rows_on_;             // [R, E]
  std::vector<int> order_, others_;
};

}  // namespace

std::unique_ptr<Planner> make_llep_planner(const PlannerContext& ctx) {
  return std::make_unique<LlepPlanner>(ctx);
}

}  // namespace feplb
