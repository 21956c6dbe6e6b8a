// Routing data: how many token-expert rows each source rank sends to each expert, per
// (micro-batch, layer), and a Trace of many of them (the feplb-trace-v1 file, see
// docs/trace-format.md).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "feplb/core/expert_shape.h"

namespace feplb {

struct RoutingStep {
  int64_t step = 0;
  int64_t layer = 0;
  int num_ranks = 0;
  int num_experts = 0;
  std::vector<int64_t> counts;         // [num_ranks, num_experts]: rows src rank -> expert
  std::vector<int64_t> expert_counts;  // [num_experts]: sum over source ranks
  // Optional (docs/trace-format.md): [num_ranks] tokens each source rank had in this step (empty:
  // the trace's tokens_per_rank for every rank), and the token-expert rows it dropped (capacity
  // factor; empty: none). Row src sums to tokens[src] * top_k - dropped[src].
  std::vector<int64_t> tokens;
  std::vector<int64_t> dropped;

  RoutingStep() = default;
  RoutingStep(int64_t step_idx, int64_t layer_idx, int ranks, int experts);
  int64_t& at(int src, int expert) {
    return counts[static_cast<size_t>(src) * num_experts + expert];
  }
  int64_t at(int src, int expert) const {
    return counts[static_cast<size_t>(src) * num_experts + expert];
  }
  std::span<const int64_t> row(int src) const {
    return {counts.data() + static_cast<size_t>(src) * num_experts,
            static_cast<size_t>(num_experts)};
  }
  // Recomputes expert_counts from counts.
  void sum_experts();
  int64_t total_rows() const;
};

struct Trace {
  std::string model;
  int num_experts = 0;
  int top_k = 0;
  int num_ranks = 0;
  int64_t tokens_per_rank = 0;
  std::optional<ExpertShape> expert_shape;  // optional "expert_shape" object
  std::string generator_json;  // optional "generator" object, kept verbatim ("" if none)
  std::vector<RoutingStep> steps;

  // Token-expert rows rank `src` routed in `step`: tokens * top_k, less the rows it dropped.
  int64_t tokens_of(const RoutingStep& step, int src) const {
    return step.tokens.empty() ? tokens_per_rank : step.tokens[static_cast<size_t>(src)];
  }
  int64_t dropped_of(const RoutingStep& step, int src) const {
    return step.dropped.empty() ? 0 : step.dropped[static_cast<size_t>(src)];
  }
  int64_t rows_of(const RoutingStep& step, int src) const {
    return tokens_of(step, src) * top_k - dropped_of(step, src);
  }
  // Every rank has tokens_per_rank tokens and drops nothing, in every step.
  bool uniform() const;
};

}  // namespace feplb
