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

// Widens a prior to `num_experts` (a multiple of its own count E) by splitting each real expert
// into `num_experts / E` consecutive experts that share its popularity in random proportions
// (Dirichlet(4, ..., 4), from `seed`). With contiguous placement at the same EP size every GPU
// keeps exactly its real share of the load; the split experts differ, as real experts do.
Prior expand_prior(const Prior& prior, int num_experts, uint64_t seed);

// Max over experts of popularity / mean popularity (the skew knob; MoonEP's maxvio + 1).
double max_over_mean(const std::vector<double>& popularity);

}  // namespace feplb
