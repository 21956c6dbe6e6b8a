// fastermoe: FasterMoE's shadow-expert rule (PPoPP'22; laekov/fastmoe shadow_policy.py), applied to
// per-expert global counts as the paper intends, with H200 constants:
//   B = expert rows sorted descending; per-token compute comp = 6 H F / gemm_peak;
//   per-token transfer feat = H * dtype / bw; one expert's weights model = weight_bytes / bw;
//   shadow the k hottest experts for the largest prefix k where
//   3 comp B[k] + 4 feat B[k] + k model < 3 comp B[0] + 4 feat B[0]   (greedy, stops at the first
//   miss).
// A shadowed expert's weights are broadcast from its home to every GPU of the EP group, and each
// GPU computes its own tokens for it (they are never dispatched). bw is the intra-node copy rate in
// one NVLink domain and the network rate when the group spans nodes (the broadcast crosses it).
#include <algorithm>
#include <numeric>

#include "feplb/core/planners/policies.h"

namespace feplb {
namespace {

class FasterMoePlanner final : public Planner {
 public:
  using Planner::Planner;
  std::string_view name() const override { return "fastermoe"; }
  PlanLimits limits() const override {
    return {false, static_cast<int64_t>(ctx_.topo.num_experts())};
  }
  // FasterMoE's smart schedule exchanges tokens with NCCL send/recv and broadcasts shadows.
  DataMovement data_movement() const override {
    return {"NCCL all-to-all", ctx_.knobs.nccl_sms, "NCCL broadcast", ctx_.knobs.nccl_sms, true};
  }

  void make_plan(const RoutingStep& routing, Plan& out) override {
    const Topology& topo = ctx_.topo;
    const int E = topo.num_experts(), R = topo.num_ranks();
    const auto& c = routing.expert_counts;
    out.clear(E);
    out.planned_before_dispatch = true;  // the dispatch needs the plan: it waits for it
    const double bw =
        (topo.num_domains() > 1 ? ctx_.knobs.internode_gbps : ctx_.knobs.copy_gbps) * 1e9;
    const double comp = ctx_.shape.flops_per_row() / (ctx_.knobs.gemm_peak_tflops * 1e12);
    const double feat = static_cast<double>(ctx_.shape.row_bytes()) / bw;
    const double model = static_cast<double>(ctx_.shape.weight_bytes()) / bw;

    order_.resize(static_cast<size_t>(E));
    std::iota(order_.begin(), order_.end(), 0);
    sort_ids_descending(order_, [&](int e) { return c[e]; });
    auto cost = [&](int64_t rows) { return (3 * comp + 4 * feat) * static_cast<double>(rows); };
    double best = cost(c[order_[0]]), shadow_cost = 0.0;
    int num_shadows = 0;
    for (int i = 0; i + 1 < E; ++i) {
      shadow_cost += model;
      const double lat = cost(c[order_[i + 1]]) + shadow_cost;
      if (lat >= best) break;
      best = lat;
      num_shadows = i + 1;
    }

    moved_.assign(static_cast<size_t>(E), 0);
    for (int i = 0; i < num_shadows; ++i) {
      const int e = order_[i], home = topo.home(e);
      out.dynamic[e] = 1;
      for (int g = 0; g < R; ++g) {
        if (g == home) continue;
        out.copies.push_back({CopyKind::kWeights, e, home, g, 0, ctx_.shape.weight_bytes()});
        const int64_t own = routing.at(g, e);
        if (own > 0) out.slices.push_back({e, g, own, RowSource::kSource});
        moved_[e] += own;
      }
    }
    out.add_home_slices(topo, routing, moved_);
  }

 private:
  std::vector<int> order_;
  std::vector<int64_t> moved_;
};

}  // namespace

std::unique_ptr<Planner> make_fastermoe_planner(const PlannerContext& ctx) {
  return std::make_unique<FasterMoePlanner>(ctx);
}

}  // namespace feplb
