// DeepSeek EPLB's placement algorithm (deepseek-ai/EPLB eplb.py),
// re-stated in C++ for one MoE layer: replicate the hottest experts into redundant physical slots
// and pack the slots onto GPUs (hierarchically: expert groups onto nodes first). The `eplb`
// planner (eplb.cc) runs it on a history window; it is exposed here so tests can check it against
// EPLB's own README example. Plain CPU code; no allocation once a Workspace has been sized.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace feplb::eplb {

enum class Policy : uint8_t {
  kAuto,          // as upstream: hierarchical when num_groups % num_nodes == 0, else global
  kHierarchical,  // groups -> nodes, replicate inside each node, slots -> GPUs of the node
  kGlobal,        // the hierarchical code with one group and one node
};

struct Params {
  int num_experts = 0;   // E logical experts
  int num_replicas = 0;  // P physical slots (E + redundant); P % num_gpus == 0
  int num_groups = 1;    // G contiguous expert groups; E % G == 0
  int num_nodes = 1;     // N nodes (NVLink domains); num_gpus % N == 0
  int num_gpus = 1;      // D GPUs; GPU of slot s = s / (P / D)
  Policy policy = Policy::kAuto;
  // Not upstream (EPLB issue #22): no two replicas of one expert on one GPU. An expert then gets at
  // most (GPUs per node) replicas, and packing skips GPUs that already hold one of its replicas
  // whenever a GPU with room that does not is left (if none is, the duplicate stays).
  bool forbid_duplicates = false;
};

// Throws InputError naming the first inconsistent field.
void check_params(const Params& params);
// The policy `params.policy` resolves to (kAuto -> kHierarchical or kGlobal).
Policy resolve_policy(const Params& params);

// One layer's placement, EPLB's return values for that layer.
struct Layout {
  std::vector<int32_t> phy2log;       // [P]: logical expert held by physical slot s
  std::vector<int32_t> replica_rank;  // [P]: 0 for an expert's first copy, then 1, 2, ...
  std::vector<int32_t> logcnt;        // [E]: replicas of each logical expert (>= 1)
};

// Scratch buffers, owned by the caller and reused across calls.
struct Workspace {
  std::vector<int> order;
  std::vector<double> pack_weight;
  std::vector<int32_t> pack_count, pack_items;
  std::vector<double> group_load, node_weight, phy_weight;
  std::vector<int32_t> group_pack, group_rank, log2mlog, mlog2log;
  std::vector<int32_t> phy2mlog, phy_rank, mlogcnt, pack, rank, pphy2phy;
};

// balanced_packing: puts n = weight.size() items into num_packs packs of exactly n / num_packs
// items each (n % num_packs == 0). Items in descending weight (ties: lower index first), each into
// the lightest pack that still has room (ties: lower pack). When n / num_packs == 1, item i goes to
// pack i. With non-empty `keys`, an item avoids packs that hold an item with the same key (see
// Params::forbid_duplicates). Writes pack_index[i] and rank_in_pack[i] (its position in the pack).
void balanced_packing(std::span<const double> weight, int num_packs, std::span<int32_t> pack_index,
                      std::span<int32_t> rank_in_pack, Workspace& ws,
                      std::span<const int32_t> keys = {});

// replicate_experts: physical slots 0..E-1 hold experts 0..E-1; each further slot goes to the
// expert with the largest load per replica weight[e] / logcnt[e] (ties: lower index). With
// max_count > 0 an expert gets at most max_count replicas while another one can take the slot.
void replicate_experts(std::span<const double> weight, int num_phy, std::span<int32_t> phy2log,
                       std::span<int32_t> replica_rank, std::span<int32_t> logcnt,
                       int max_count = 0);

// rebalance_experts for one layer: `weight` [E] are the loads (any non-negative scale).
void rebalance(std::span<const double> weight, const Params& params, Layout& out, Workspace& ws);

}  // namespace feplb::eplb
