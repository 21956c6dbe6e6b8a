// Expert-popularity priors: the long-run share of token-expert rows each expert receives, per
// layer. Either read from a real-model file (data/priors/, schema in its README) or drawn as
// lognormal popularity with a target skew. Per-micro-batch routing is sampled around a prior
// (workload.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace feplb {

struct Prior {
  std::string model;                            // e.g. "OLMoE-1B-7B-0924" or "lognormal"
  std::string source;                           // where it came from (file, or generator settings)
  int top_k = 0;                                // the model's top-k (0 when not known)
  std::vector<int64_t> layer_ids;               // [num_layers]
  std::vector<std::vector<double>> popularity;  // [num_layers, num_experts], each row sums to 1

  int num_experts() const {
    return popularity.empty() ? 0 : static_cast<int>(popularity[0].size());
  }
  int num_layers() const { return static_cast<int>(popularity.size()); }
};

// Reads a prior file (schema: data/priors/README.md). Throws InputError naming the field.
Prior read_prior(const std::string& path);
Prior parse_prior(const std::string& text);

// Lognormal popularity p_e ~ exp(sigma * z_e), z_e ~ N(0,1) drawn from `seed`, with sigma found by
// bisection so that max_e p_e / mean_e p_e == target_max_over_mean, for each of `num_layers`
// layers.
Prior lognormal_prior(int num_experts, double target_max_over_mean, int num_layers, uint64_t seed);

// Many-donor skew: several GPUs of every NVLink domain overloaded at once while the others sit
// deeply below the mean, as real priors show at EP=8 (e.g. 1.87, 1.65 and 1.21 x the mean on
// three GPUs, the rest at 0.2-0.6 x). With contiguous homes (E / R experts per GPU), per layer and
// per domain of `gpus_per_node` GPUs (the last may be smaller): the GPUs in a seeded random order
// get `hot_loads` x the mean load (one entry per hot GPU; fewer entries than GPUs in a domain),
// the others loads spaced evenly from `cold_min` x the mean up to what keeps the domain's mean at
// 1 (so the coldest is at `cold_min`, the warmest cold one at 2 x cold mean - cold_min). Inside
// each GPU its experts share its load by lognormal popularity with max/mean `expert_skew` over
// the GPU's experts. InputError when the loads cannot average 1 (hot loads summing to the domain
// size or more, cold_min above the cold mean) or a load is not positive.
Prior many_donor_prior(int num_experts, int num_ranks, int gpus_per_node,
                       const std::vector<double>& hot_loads, double cold_min, double expert_skew,
                       int num_layers, uint64_t seed);

// Widens a prior to `num_experts` (a multiple of its own count E) by splitting each real expert
// into `num_experts / E` consecutive experts that share its popularity in random proportions
// (Dirichlet(4, ..., 4), from `seed`). With contiguous placement at the same EP size every GPU
// keeps exactly its real share of the load; the split experts differ, as real experts do.
Prior expand_prior(const Prior& prior, int num_experts, uint64_t seed);

// Max over experts of popularity / mean popularity (the skew knob; MoonEP's maxvio + 1).
double max_over_mean(const std::vector<double>& popularity);

}  // namespace feplb
