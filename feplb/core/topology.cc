#include "feplb/core/topology.h"

#include <algorithm>

#include "feplb/core/error.h"

namespace feplb {

Topology::Topology(int num_ranks, int gpus_per_node, std::vector<int> home)
    : num_ranks_(num_ranks), num_experts_(static_cast<int>(home.size())), home_(std::move(home)) {
  FEPLB_REQUIRE_INPUT(num_ranks_ >= 1, "num_ranks: {} must be at least 1", num_ranks_);
  FEPLB_REQUIRE_INPUT(gpus_per_node >= 1, "gpus_per_node: {} must be at least 1", gpus_per_node);
  FEPLB_REQUIRE_INPUT(num_experts_ >= 1, "num_experts: {} must be at least 1", num_experts_);
  FEPLB_REQUIRE_INPUT(num_experts_ % num_ranks_ == 0,
                      "num_experts: {} is not divisible by num_ranks {}", num_experts_, num_ranks_);
  FEPLB_REQUIRE_INPUT(num_ranks_ <= gpus_per_node || num_ranks_ % gpus_per_node == 0,
                      "num_ranks: {} is not divisible by gpus_per_node {}", num_ranks_,
                      gpus_per_node);
  domain_size_ = std::min(num_ranks_, gpus_per_node);
  const int per_rank = experts_per_rank();
  std::vector<int> filled(num_ranks_, 0);
  local_.assign(static_cast<size_t>(num_experts_), -1);
  for (int e = 0; e < num_experts_; ++e) {
    const int g = home_[e];
    FEPLB_REQUIRE_INPUT(g >= 0 && g < num_ranks_,
                        "placement: expert {} has home GPU {} outside [0, {})", e, g, num_ranks_);
    FEPLB_REQUIRE_INPUT(filled[g] < per_rank, "placement: GPU {} holds more than {} experts", g,
                        per_rank);
    local_[static_cast<size_t>(g) * per_rank + filled[g]++] = e;
  }
}

Topology Topology::contiguous(int num_ranks, int gpus_per_node, int num_experts) {
  FEPLB_REQUIRE_INPUT(num_ranks >= 1, "num_ranks: {} must be at least 1", num_ranks);
  FEPLB_REQUIRE_INPUT(num_experts >= 1, "num_experts: {} must be at least 1", num_experts);
  FEPLB_REQUIRE_INPUT(num_experts % num_ranks == 0,
                      "num_experts: {} is not divisible by num_ranks {}", num_experts, num_ranks);
  std::vector<int> home(static_cast<size_t>(num_experts));
  const int per_rank = num_experts / num_ranks;
  for (int e = 0; e < num_experts; ++e) home[e] = e / per_rank;
  return Topology(num_ranks, gpus_per_node, std::move(home));
}

Topology Topology::with_placement(int num_ranks, int gpus_per_node, std::vector<int> home) {
  return Topology(num_ranks, gpus_per_node, std::move(home));
}

std::string Topology::describe() const {
  return fmt::format("EP={} ({} NVLink domain{} of {} GPUs), {} experts ({} per GPU)", num_ranks_,
                     num_domains(), num_domains() == 1 ? "" : "s", domain_size_, num_experts_,
                     experts_per_rank());
}

}  // namespace feplb
