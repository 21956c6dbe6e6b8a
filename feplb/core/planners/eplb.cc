// eplb: DeepSeek EPLB, as a training-time policy. Each layer has a
// physical layout of E + R*D expert slots (R = eplb_redundant_per_gpu, D GPUs; E/D + R slots per
// GPU), planned by EPLB's rebalance (eplb_rebalance.h) from the layer's last eplb_window
// micro-batches (never the current one) and replanned after every eplb_interval of them.
//
// How the layout maps onto our home-GPU model (docs/planners.md): an expert's home (the topology's
// contiguous placement) keeps its master weights, gradients and optimizer state whatever the
// layout, so its home never needs a copy. Every other (expert, GPU) pair of the layout is a
// resident replica: its weights stay on that GPU until a replan drops them. A replan installs
// the replicas the previous layout did not have (kReplicaWeights copies from the home, counted
// as weight bytes of the next micro-batch, moved between micro-batches). The tokens of an expert
// are dispatched straight to its replicas in phase 1, split evenly (EPLB's w/cnt model; the
// remainder to the lowest slots); a home that holds no slot of its own expert computes none of
// it. Two replicas of one expert on one GPU (possible upstream) compute as one slice.
//
// State lives in observe(): per layer, a ring of the last eplb_window counts and the layout.
// plan() only reads it, so it is repeatable and allocation-free; observe() allocates the first
// time it sees a layer and never after.
#include <algorithm>

#include "feplb/core/error.h"
#include "feplb/core/planners/eplb_rebalance.h"
#include "feplb/core/planners/policies.h"

namespace feplb {
namespace {

class EplbPlanner final : public Planner {
 public:
  explicit EplbPlanner(const PlannerContext& ctx) : Planner(ctx) {
    const Topology& topo = ctx_.topo;
    const Knobs& k = ctx_.knobs;
    FEPLB_REQUIRE_INPUT(k.eplb_policy <= 2, "--eplb-policy: {} is not 0, 1 or 2", k.eplb_policy);
    FEPLB_REQUIRE_INPUT(k.eplb_forbid_duplicates <= 1, "--eplb-forbid-duplicates: {} is not 0 or 1",
                        k.eplb_forbid_duplicates);
    params_.num_experts = topo.num_experts();
    params_.num_gpus = topo.num_ranks();
    params_.num_nodes = topo.num_domains();
    params_.num_replicas =
        static_cast<int>(topo.num_experts() + k.eplb_redundant_per_gpu * topo.num_ranks());
    params_.num_groups = static_cast<int>(k.eplb_groups);
    params_.policy = static_cast<eplb::Policy>(k.eplb_policy);
    params_.forbid_duplicates = k.eplb_forbid_duplicates != 0;
    eplb::check_params(params_);
    slots_per_gpu_ = params_.num_replicas / params_.num_gpus;
    // Before a layer's first replan: every GPU holds its own experts; the redundant slots are
    // empty.
    initial_.assign(static_cast<size_t>(params_.num_replicas), -1);
    for (int g = 0; g < topo.num_ranks(); ++g) {
      auto local = topo.local_experts(g);
      for (size_t i = 0; i < local.size(); ++i) {
        initial_[static_cast<size_t>(g) * slots_per_gpu_ + i] = local[i];
      }
    }
  }

  std::string_view name() const override { return "eplb"; }
  // Installs come from the home, which may sit on another node (the layout follows the groups).
  PlanLimits limits() const override { return {false, static_cast<int64_t>(slots_per_gpu_)}; }
  DataMovement data_movement() const override {
    return {"DeepEP", ctx_.knobs.deepep_sms, "NCCL P2P at replans", ctx_.knobs.nccl_sms, false};
  }

  void make_plan(const RoutingStep& routing, Plan& out) override {
    const Topology& topo = ctx_.topo;
    const int E = topo.num_experts(), R = topo.num_ranks();
    const auto& c = routing.expert_counts;
    const LayerState* st = find(routing.layer);
    const std::vector<int32_t>& layout = st ? st->phy2log : initial_;
    out.clear(E);

    // Replica count per expert and per (GPU, expert); then each replica's even share, in slot
    // order.
    replicas_.assign(static_cast<size_t>(E), 0);
    rows_on_.assign(static_cast<size_t>(R) * E, 0);
    held_.assign(static_cast<size_t>(R) * E, 0);
    for (int s = 0; s < params_.num_replicas; ++s) {
      if (layout[s] >= 0) ++replicas_[layout[s]];
    }
    seen_.assign(static_cast<size_t>(E), 0);
    for (int s = 0; s < params_.num_replicas; ++s) {
      const int e = layout[s];
      if (e < 0) continue;
      const int g = s / slots_per_gpu_;
      const int64_t share = c[e] / replicas_[e] + (seen_[e] < c[e] % replicas_[e] ? 1 : 0);
      ++seen_[e];
      rows_on_[key(g, e)] += share;
      held_[key(g, e)] = 1;
    }
    for (int e = 0; e < E; ++e) {
      for (int g = 0; g < R; ++g) {
        const int64_t rows = rows_on_[key(g, e)];
        if (rows > 0) {
          out.slices.push_back(
              {e, g, rows, g == topo.home(e) ? RowSource::kHome : RowSource::kDispatched});
        }
      }
    }
    for (int g = 0; g < R; ++g) {
      for (int e = 0; e < E; ++e) {
        if (!held_[key(g, e)] || g == topo.home(e)) continue;
        out.resident.push_back({e, g});
        if (st && st->installs_pending && !st->previous[key(g, e)]) {
          out.copies.push_back(
              {CopyKind::kReplicaWeights, e, topo.home(e), g, 0, ctx_.shape.weight_bytes()});
        }
      }
    }
  }

  void observe(const RoutingStep& routing) override {
    const int E = ctx_.topo.num_experts();
    const int64_t window = ctx_.knobs.eplb_window;
    LayerState& st = state_for(routing.layer);
    std::copy(routing.expert_counts.begin(), routing.expert_counts.end(),
              st.history.begin() + (st.observed % window) * E);
    ++st.observed;
    st.installs_pending = false;
    if (st.observed % ctx_.knobs.eplb_interval != 0) return;
    // Replan from the window; remember which (GPU, expert) pairs the old layout held.
    weight_.assign(static_cast<size_t>(E), 0.0);
    for (int64_t w = 0; w < std::min(st.observed, window); ++w) {
      for (int e = 0; e < E; ++e) {
        weight_[e] += static_cast<double>(st.history[static_cast<size_t>(w * E + e)]);
      }
    }
    std::fill(st.previous.begin(), st.previous.end(), 0);
    for (int s = 0; s < params_.num_replicas; ++s) {
      if (st.phy2log[s] >= 0) st.previous[key(s / slots_per_gpu_, st.phy2log[s])] = 1;
    }
    eplb::rebalance(weight_, params_, layout_, ws_);
    std::copy(layout_.phy2log.begin(), layout_.phy2log.end(), st.phy2log.begin());
    st.installs_pending = true;
  }

 private:
  struct LayerState {
    int64_t layer = 0;
    int64_t observed = 0;           // micro-batches of this layer seen
    std::vector<int64_t> history;   // [eplb_window, E] ring of expert counts
    std::vector<int32_t> phy2log;   // [P] the layout in force
    std::vector<uint8_t> previous;  // [R, E] pairs the layout before the last replan held
    bool installs_pending = false;  // the next plan installs what `previous` lacks
  };

  size_t key(int gpu, int expert) const {
    return static_cast<size_t>(gpu) * ctx_.topo.num_experts() + expert;
  }

  const LayerState* find(int64_t layer) const {
    for (const LayerState& s : layers_) {
      if (s.layer == layer) return &s;
    }
    return nullptr;
  }

  LayerState& state_for(int64_t layer) {
    for (LayerState& s : layers_) {
      if (s.layer == layer) return s;
    }
    LayerState& s = layers_.emplace_back();
    s.layer = layer;
    s.history.assign(static_cast<size_t>(ctx_.knobs.eplb_window * ctx_.topo.num_experts()), 0);
    s.phy2log = initial_;
    s.previous.assign(static_cast<size_t>(ctx_.topo.num_ranks()) * ctx_.topo.num_experts(), 0);
    return s;
  }

  eplb::Params params_;
  int slots_per_gpu_ = 0;
  std::vector<int32_t> initial_;  // [P]
  std::vector<LayerState> layers_;
  eplb::Layout layout_;
  eplb::Workspace ws_;
  std::vector<double> weight_;
  std::vector<int32_t> replicas_, seen_;  // [E]
  std::vector<int64_t> rows_on_;          // [R, E]
  std::vector<uint8_t> held_;             // [R, E]
};

}  // namespace

std::unique_ptr<Planner> make_eplb_planner(const PlannerContext& ctx) {
  return std::make_unique<EplbPlanner>(ctx);
}

}  // namespace feplb
