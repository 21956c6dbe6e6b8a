// Workload generator: per-micro-batch routing drawn around an expert-popularity prior.
// Each rank's micro-batch is made of sequences; each sequence draws its own expert popularity
// from a Dirichlet centred on the prior (routing is correlated inside a sequence), and each of its
// tokens picks top_k distinct experts from it. Seeded and reproducible on every platform.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "feplb/core/routing.h"
#include "feplb/sim/prior.h"

namespace feplb {

struct WorkloadSpec {
  int num_ranks = 8;
  int64_t tokens_per_rank = 4096;
  int top_k = 8;
  int64_t seq_len = 4096;       // tokens per sequence (a rank's micro-batch holds S / seq_len)
  double concentration = 2000;  // Dirichlet total concentration; <= 0 means no per-sequence drift
  int64_t num_steps = 16;       // micro-batches; each has one entry per prior layer
  uint64_t seed = 1;
};

using Progress = std::function<void(int64_t done, int64_t total)>;

// Throws InputError on an impossible spec (e.g. top_k > experts, experts % ranks != 0).
Trace generate_trace(const Prior& prior, const WorkloadSpec& spec, const Progress& progress = {});

// One (step, layer) of routing; the building block of generate_trace, exposed for benchmarks.
RoutingStep generate_step(const std::vector<double>& popularity, const WorkloadSpec& spec,
                          int64_t step, int64_t layer);

// Top-k routing that reproduces one rank's counts exactly: [tokens, top_k] expert ids, each token's
// experts distinct. counts[e] <= tokens and sum(counts) == tokens * top_k (InputError otherwise).
// Lays the experts' slots out in expert order and gives token t slots t, t + S, t + 2S, ...
std::vector<int32_t> topk_from_counts(std::span<const int64_t> counts, int64_t tokens, int top_k);

}  // namespace feplb
