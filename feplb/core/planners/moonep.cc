// moonep: MoonEP's exact planner (MoonshotAI/MoonEP; the Torch reference of its planning kernel,
// tests/planning_reference.py), every micro-batch:
//   1. CAP = S*K rows per GPU (here ceil(total / GPUs), which is S*K when every rank routes S*K
//      rows); balance[h] = rows of h's own experts - CAP.
//   2. Receiver quotas: repeat { h = argmax balance, u = argmin balance (ties: lower index); stop
//      if balance[h] <= 0; z[h][u] = -balance[u]; balance[h] -= z[h][u]; balance[u] = 0 }. Each
//      receiver is filled completely from one home group, so it hosts at most E/R remote experts.
//   3. Inside each home group h: repeat { d = the largest remaining quota z[h][d] (ties: lower
//      index), stop if it is 0; e = h's local expert with the most remaining rows (ties: lower
//      index); move min(rows, quota) of e to d }.
//   4. Each destination prefetches the weights of its remote experts (all of them: at most E/R
//      by step 2) from their homes.
// Every GPU then computes exactly CAP rows (when S*K divides evenly). Tokens go straight to their
// destination in the dispatch (a token's ordinal within its expert, in source-rank order, is
// matched against the cumulative allocation: no extra communication). MoonEP runs in one NVLink
// domain (CUDA VMM + NVSwitch); with several domains (EP=16 over 2 nodes) this planner still
// balances the whole EP group, as if it were one domain, and its copies cross the network.
// Token padding (token_padding) is not modelled.
#include <algorithm>

#include "feplb/core/error.h"
#include "feplb/core/planners/policies.h"

namespace feplb {
namespace {

class MoonEpPlanner final : public Planner {
 public:
  using Planner::Planner;
  std::string_view name() const override { return "moonep"; }
  // The E/R bound on remote experts per GPU is MoonEP's own guarantee; validate() holds it.
  PlanLimits limits() const override {
    return {false, static_cast<int64_t>(ctx_.topo.experts_per_rank())};
  }
  DataMovement data_movement() const override {
    return {"MoonEP NVLink kernels", ctx_.knobs.moonep_sms, "MoonEP prefetch kernels",
            ctx_.knobs.moonep_sms, true};
  }

  void make_plan(const RoutingStep& routing, Plan& out) override {
    const Topology& topo = ctx_.topo;
    const int E = topo.num_experts(), R = topo.num_ranks(), epn = topo.experts_per_rank();
    const auto& c = routing.expert_counts;
    out.clear(E);
    out.planned_before_dispatch = true;  // the dispatch needs the plan: it waits for it
    home_loads(topo, routing, balance_);
    int64_t total = 0;
    for (int64_t l : balance_) total += l;
    const int64_t cap = (total + R - 1) / R;
    for (int64_t& b : balance_) b -= cap;

    // 2. Receiver quotas z[h][u].
    quota_.assign(static_cast<size_t>(R) * R, 0);
    for (;;) {
      const int h =
          static_cast<int>(std::max_element(balance_.begin(), balance_.end()) - balance_.begin());
      const int u =
          static_cast<int>(std::min_element(balance_.begin(), balance_.end()) - balance_.begin());
      if (balance_[h] <= 0) break;
      const int64_t move = -balance_[u];
      quota_[static_cast<size_t>(h) * R + u] = move;
      balance_[h] -= move;
      balance_[u] = 0;
    }

    // 3. Split each home group's experts over its receivers: alloc[d, e] rows of e on d.
    alloc_.assign(static_cast<size_t>(R) * E, 0);
    for (int e = 0; e < E; ++e) alloc_[static_cast<size_t>(topo.home(e)) * E + e] = c[e];
    for (int h = 0; h < R; ++h) {
      auto local = topo.local_experts(h);
      remaining_.resize(static_cast<size_t>(epn));
      for (int j = 0; j < epn; ++j) remaining_[j] = c[local[j]];
      int64_t* quotas = &quota_[static_cast<size_t>(h) * R];
      for (;;) {
        const int d = static_cast<int>(std::max_element(quotas, quotas + R) - quotas);
        if (quotas[d] <= 0) break;
        const int j = static_cast<int>(std::max_element(remaining_.begin(), remaining_.end()) -
                                       remaining_.begin());
        const int64_t take = std::min(remaining_[j], quotas[d]);
        FEPLB_CHECK(take > 0, "moonep: GPU {} has a quota of {} rows and no rows left", d,
                    quotas[d]);
        alloc_[static_cast<size_t>(d) * E + local[j]] += take;
        alloc_[static_cast<size_t>(h) * E + local[j]] -= take;
        remaining_[j] -= take;
        quotas[d] -= take;
      }
    }

    for (int e = 0; e < E; ++e) {
      for (int d = 0; d < R; ++d) {
        const int64_t rows = alloc_[static_cast<size_t>(d) * E + e];
        if (rows == 0) continue;
        const bool at_home = d == topo.home(e);
        out.slices.push_back({e, d, rows, at_home ? RowSource::kHome : RowSource::kDispatched});
        if (!at_home) out.dynamic[e] = 1;
      }
    }
    // 4. Weight prefetch per destination, its remote segments by rows (most first; ties: higher
    //    expert id, as the reference sorts (rows, e) in reverse).
    for (int d = 0; d < R; ++d) {
      remote_.clear();
      for (int e = 0; e < E; ++e) {
        if (topo.home(e) != d && alloc_[static_cast<size_t>(d) * E + e] > 0) remote_.push_back(e);
      }
      const int64_t* row = &alloc_[static_cast<size_t>(d) * E];
      std::sort(remote_.begin(), remote_.end(),
                [&](int a, int b) { return row[a] != row[b] ? row[a] > row[b] : a > b; });
      for (int e : remote_) {
        out.copies.push_back(
            {CopyKind::kWeights, e, topo.home(e), d, 0, ctx_.shape.weight_bytes()});
      }
    }
  }

 private:
  std::vector<int64_t> balance_, quota_, alloc_, remaining_;
  std::vector<int> remote_;
};

}  // namespace

std::unique_ptr<Planner> make_moonep_planner(const PlannerContext& ctx) {
  return std::make_unique<MoonEpPlanner>(ctx);
}

}  // namespace feplb
