// Plan: the balancing decision for one (micro-batch, layer). Which GPU computes how many rows of
// each expert, and the copies that implies (weights and token rows to helpers, outputs back).
// Every planner produces one; validate() checks it against the routing and the topology.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "feplb/core/expert_shape.h"
#include "feplb/core/routing.h"
#include "feplb/core/topology.h"

namespace feplb {

// Where a slice's rows are when phase 2 starts.
enum class RowSource : uint8_t {
  kHome,    // dispatched to the expert's home GPU in phase 1; moved on by a token-row copy
  kSource,  // never left their source rank (FasterMoE shadowing: the weights came instead)
};

// `rows` token-expert rows of `expert` computed on `gpu`.
struct Slice {
  int32_t expert = 0;
  int32_t gpu = 0;
  int64_t rows = 0;
  RowSource source = RowSource::kHome;
};

enum class CopyKind : uint8_t {
  kWeights,     // the expert's weights, home -> helper (before the helper's GEMM)
  kTokenRows,   // dispatched rows, home -> helper (before the helper's GEMM)
  kOutputRows,  // expert outputs, helper -> home (after the helper's GEMM, before combine)
};

struct Copy {
  CopyKind kind = CopyKind::kWeights;
  int32_t expert = 0;
  int32_t src_gpu = 0;
  int32_t dst_gpu = 0;
  int64_t rows = 0;   // token rows carried (0 for weights)
  int64_t bytes = 0;
};

struct Plan {
  std::vector<Slice> slices;     // rows > 0 only, in the order the planner emitted them
  std::vector<Copy> copies;
  std::vector<uint8_t> dynamic;  // [num_experts]: 1 = computed after the plan (not static work)

  // Empties the plan for `num_experts` experts, keeping allocated capacity.
  void clear(int num_experts);
  // Rows of `expert` moved from its home to `helper`: adds the slice and its three copies.
  void add_migration(int expert, int home, int helper, int64_t rows, const ExpertShape& shape);
  // Appends, for every expert, a home slice with the rows its migrations left: moved_rows[e] rows
  // of expert e were sent away. Call once, after the migrations.
  void add_home_slices(const Topology& topo, const RoutingStep& routing,
                       const std::vector<int64_t>& moved_rows);
  int64_t weight_bytes() const;
  int64_t token_bytes() const;  // token rows to helpers plus outputs back
};

// What a planner promises; validate() enforces it.
struct PlanLimits {
  bool intra_domain_only = true;  // copies never leave an NVLink domain
  int64_t max_guest_experts = std::numeric_limits<int64_t>::max();  // per GPU (weight slots)
};

// Throws Error naming the first violated rule: every row computed exactly once, slices on valid
// GPUs, weights and rows copied to every helper, copies inside domains, guest slots respected.
void validate(const Plan& plan, const Topology& topo, const RoutingStep& routing,
              const ExpertShape& shape, const PlanLimits& limits);

// Canonical bytes of a plan (for determinism checks and golden files).
std::string serialize(const Plan& plan);

}  // namespace feplb
