// Topology of one expert-parallel (EP) group: GPUs, NVLink domains, experts and their home GPUs.
// Plain data, no CUDA. An NVLink domain is one node's GPUs; rows may only move inside a domain.
#pragma once

#include <span>
#include <string>
#include <vector>

namespace feplb {

class Topology {
 public:
  // Contiguous placement: expert e lives on GPU e / (E / R). Throws InputError when E % R != 0,
  // or when R > gpus_per_node and R % gpus_per_node != 0. An EP group smaller than a node
  // (R <= gpus_per_node) is one NVLink domain of R GPUs.
  static Topology contiguous(int num_ranks, int gpus_per_node, int num_experts);
  // Explicit placement: home[e] = GPU of expert e; every GPU must hold exactly E / R experts.
  static Topology with_placement(int num_ranks, int gpus_per_node, std::vector<int> home);

  int num_ranks() const { return num_ranks_; }
  int num_experts() const { return num_experts_; }
  int experts_per_rank() const { return num_experts_ / num_ranks_; }
  int domain_size() const { return domain_size_; }
  int num_domains() const { return num_ranks_ / domain_size_; }
  int domain_of(int gpu) const { return gpu / domain_size_; }
  int first_gpu_of_domain(int domain) const { return domain * domain_size_; }
  bool same_domain(int a, int b) const { return domain_of(a) == domain_of(b); }
  int home(int expert) const { return home_[expert]; }
  std::span<const int> homes() const { return home_; }
  // The experts whose home is `gpu`, ascending.  // [experts_per_rank]
  std::span<const int> local_experts(int gpu) const {
    return {local_.data() + static_cast<size_t>(gpu) * experts_per_rank(),
            static_cast<size_t>(experts_per_rank())};
  }
  std::string describe() const;

 private:
  Topology(int num_ranks, int gpus_per_node, std::vector<int> home);
  int num_ranks_ = 0;
  int num_experts_ = 0;
  int domain_size_ = 0;
  std::vector<int> home_;   // [num_experts]
  std::vector<int> local_;  // [num_ranks, experts_per_rank]
};

}  // namespace feplb
