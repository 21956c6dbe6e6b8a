#include "feplb/core/planners/eplb_rebalance.h"

#include <algorithm>
#include <numeric>

#include "feplb/core/error.h"

// Differences from upstream eplb.py, all deliberate: loads are summed and divided in double
// (upstream: float32), and the descending sort is stable (upstream's torch.sort is not), so ties
// go to the lower index. On distinct loads, such as EPLB's README example, the two agree.

namespace feplb::eplb {

void check_params(const Params& p) {
  FEPLB_REQUIRE_INPUT(p.num_experts >= 1, "eplb: {} experts", p.num_experts);
  FEPLB_REQUIRE_INPUT(p.num_gpus >= 1 && p.num_nodes >= 1 && p.num_gpus % p.num_nodes == 0,
                      "eplb: {} GPUs do not split into {} nodes", p.num_gpus, p.num_nodes);
  FEPLB_REQUIRE_INPUT(p.num_replicas >= p.num_experts && p.num_replicas % p.num_gpus == 0,
                      "eplb: {} physical slots for {} experts on {} GPUs (need >= experts and a "
                      "multiple of GPUs)",
                      p.num_replicas, p.num_experts, p.num_gpus);
  FEPLB_REQUIRE_INPUT(p.num_groups >= 1, "--eplb-groups: {} must be at least 1", p.num_groups);
  if (resolve_policy(p) == Policy::kHierarchical) {
    FEPLB_REQUIRE_INPUT(p.num_experts % p.num_groups == 0 && p.num_groups % p.num_nodes == 0,
                        "--eplb-policy 1 (hierarchical): {} experts in {} groups on {} nodes (need "
                        "experts % groups == 0 and groups % nodes == 0)",
                        p.num_experts, p.num_groups, p.num_nodes);
    FEPLB_REQUIRE_INPUT(p.num_replicas % p.num_nodes == 0 && p.num_experts % p.num_nodes == 0,
                        "eplb: {} slots / {} experts do not split evenly over {} nodes",
                        p.num_replicas, p.num_experts, p.num_nodes);
  }
}

Policy resolve_policy(const Params& p) {
  if (p.policy != Policy::kAuto) return p.policy;
  // Upstream checks groups % nodes only; experts % groups is needed to form the groups at all.
  return p.num_groups % p.num_nodes == 0 && p.num_experts % p.num_groups == 0
             ? Policy::kHierarchical
             : Policy::kGlobal;
}

void balanced_packing(std::span<const double> weight, int num_packs, std::span<int32_t> pack_index,
                      std::span<int32_t> rank_in_pack, Workspace& ws,
                      std::span<const int32_t> keys) {
  const int n = static_cast<int>(weight.size());
  const int per_pack = n / num_packs;
  if (per_pack == 1) {
    for (int i = 0; i < n; ++i) {
      pack_index[i] = i;
      rank_in_pack[i] = 0;
    }
    return;
  }
  ws.order.resize(static_cast<size_t>(n));
  std::iota(ws.order.begin(), ws.order.end(), 0);
  std::sort(ws.order.begin(), ws.order.end(),
            [&](int a, int b) { return weight[a] != weight[b] ? weight[a] > weight[b] : a < b; });
  ws.pack_weight.assign(static_cast<size_t>(num_packs), 0.0);
  ws.pack_count.assign(static_cast<size_t>(num_packs), 0);
  ws.pack_items.resize(static_cast<size_t>(n));  // [num_packs, per_pack]: item ids
  auto holds_key = [&](int p, int32_t key) {
    for (int j = 0; j < ws.pack_count[p]; ++j) {
      if (keys[ws.pack_items[static_cast<size_t>(p) * per_pack + j]] == key) return true;
    }
    return false;
  };
  for (int item : ws.order) {
    int best = -1, best_any = -1;  // lightest pack with room (without the item's key; any)
    for (int p = 0; p < num_packs; ++p) {
      if (ws.pack_count[p] >= per_pack) continue;
      if (best_any < 0 || ws.pack_weight[p] < ws.pack_weight[best_any]) best_any = p;
      if (!keys.empty() && holds_key(p, keys[item])) continue;
      if (best < 0 || ws.pack_weight[p] < ws.pack_weight[best]) best = p;
    }
    const int p = best >= 0 ? best : best_any;
    pack_index[item] = p;
    rank_in_pack[item] = ws.pack_count[p];
    ws.pack_items[static_cast<size_t>(p) * per_pack + ws.pack_count[p]] = item;
    ws.pack_weight[p] += weight[item];
    ++ws.pack_count[p];
  }
}

void replicate_experts(std::span<const double> weight, int num_phy, std::span<int32_t> phy2log,
                       std::span<int32_t> replica_rank, std::span<int32_t> logcnt, int max_count) {
  const int num_log = static_cast<int>(weight.size());
  for (int e = 0; e < num_log; ++e) {
    phy2log[e] = e;
    replica_rank[e] = 0;
    logcnt[e] = 1;
  }
  for (int s = num_log; s < num_phy; ++s) {
    int best = -1, best_any = 0;  // argmax of load per replica (under the cap; any)
    for (int e = 0; e < num_log; ++e) {
      const double per = weight[e] / logcnt[e];
      if (per > weight[best_any] / logcnt[best_any]) best_any = e;
      if (max_count > 0 && logcnt[e] >= max_count) continue;
      if (best < 0 || per > weight[best] / logcnt[best]) best = e;
    }
    const int e = best >= 0 ? best : best_any;
    phy2log[s] = e;
    replica_rank[s] = logcnt[e];
    ++logcnt[e];
  }
}

void rebalance(std::span<const double> weight, const Params& params, Layout& out, Workspace& ws) {
  const bool hierarchical = resolve_policy(params) == Policy::kHierarchical;
  const int E = params.num_experts, P = params.num_replicas, D = params.num_gpus;
  const int G = hierarchical ? params.num_groups : 1, N = hierarchical ? params.num_nodes : 1;
  const int group_size = E / G, groups_per_node = G / N, phy_per_gpu = P / D;
  const int log_per_node = E / N, phy_per_node = P / N, gpus_per_node = D / N;
  out.phy2log.resize(static_cast<size_t>(P));
  out.replica_rank.resize(static_cast<size_t>(P));
  out.logcnt.resize(static_cast<size_t>(E));

  // 1. Groups -> nodes (G / N groups each), then number experts "middle-logically": node n owns
  //    middle ids [n E/N, (n+1) E/N); a group keeps its experts' order.
  ws.group_load.assign(static_cast<size_t>(G), 0.0);
  for (int e = 0; e < E; ++e) ws.group_load[e / group_size] += weight[e];
  ws.group_pack.resize(static_cast<size_t>(G));
  ws.group_rank.resize(static_cast<size_t>(G));
  balanced_packing(ws.group_load, N, ws.group_pack, ws.group_rank, ws);
  ws.log2mlog.resize(static_cast<size_t>(E));
  ws.mlog2log.resize(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) {
    const int g = e / group_size;
    const int mlog =
        (ws.group_pack[g] * groups_per_node + ws.group_rank[g]) * group_size + e % group_size;
    ws.log2mlog[e] = mlog;
    ws.mlog2log[mlog] = e;
  }

  ws.node_weight.resize(static_cast<size_t>(log_per_node));
  ws.phy2mlog.resize(static_cast<size_t>(phy_per_node));
  ws.phy_rank.resize(static_cast<size_t>(phy_per_node));
  ws.mlogcnt.resize(static_cast<size_t>(log_per_node));
  ws.phy_weight.resize(static_cast<size_t>(phy_per_node));
  ws.pack.resize(static_cast<size_t>(phy_per_node));
  ws.rank.resize(static_cast<size_t>(phy_per_node));
  ws.pphy2phy.resize(static_cast<size_t>(phy_per_node));
  for (int n = 0; n < N; ++n) {
    // 2. Replicate inside the node: its E/N experts get its P/N slots.
    for (int j = 0; j < log_per_node; ++j) {
      ws.node_weight[j] = weight[ws.mlog2log[n * log_per_node + j]];
    }
    replicate_experts(ws.node_weight, phy_per_node, ws.phy2mlog, ws.phy_rank, ws.mlogcnt,
                      params.forbid_duplicates ? gpus_per_node : 0);
    // 3. Physical experts -> the node's GPUs (P/D each), each weighing its share of the load.
    for (int i = 0; i < phy_per_node; ++i) {
      ws.phy_weight[i] = ws.node_weight[ws.phy2mlog[i]] / ws.mlogcnt[ws.phy2mlog[i]];
    }
    balanced_packing(ws.phy_weight, gpus_per_node, ws.pack, ws.rank, ws,
                     params.forbid_duplicates ? std::span<const int32_t>(ws.phy2mlog)
                                              : std::span<const int32_t>());
    for (int i = 0; i < phy_per_node; ++i) ws.pphy2phy[ws.pack[i] * phy_per_gpu + ws.rank[i]] = i;
    // 4. Back to logical ids: slot n P/N + gpu_in_node P/D + rank_in_gpu.
    for (int pp = 0; pp < phy_per_node; ++pp) {
      const int phy = ws.pphy2phy[pp];
      out.phy2log[static_cast<size_t>(n) * phy_per_node + pp] =
          ws.mlog2log[n * log_per_node + ws.phy2mlog[phy]];
      out.replica_rank[static_cast<size_t>(n) * phy_per_node + pp] = ws.phy_rank[phy];
    }
    for (int j = 0; j < log_per_node; ++j) {
      out.logcnt[ws.mlog2log[n * log_per_node + j]] = ws.mlogcnt[j];
    }
  }
}

}  // namespace feplb::eplb
