// Plan: the balancing decision for one (micro-batch, layer). Which GPU computes how many rows of
// each expert, where those rows come from, which expert weights a GPU holds besides its own
// (copied for this micro-batch, or resident replicas), and the copies all that implies.
// Every planner produces one; validate() checks it against the routing and the topology.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "feplb/core/expert_shape.h"
#include "feplb/core/routing.h"
#include "feplb/core/schedule.h"
#include "feplb/core/topology.h"

namespace feplb {

// Where a slice's rows are when phase 2 starts.
enum class RowSource : uint8_t {
  kHome,        // dispatched to the expert's home GPU in phase 1; moved on by a token-row copy
  kSource,      // never left their source rank (FasterMoE shadowing: the weights came instead)
  kDispatched,  // sent straight to this (non-home) GPU by the phase-1 EP dispatch, outputs back
                // by the combine: no token copy (EPLB replicas, LLEP spills, MoonEP destinations,
                // feplb's one-hop migrations)
};

// `rows` token-expert rows of `expert` computed on `gpu`.
struct Slice {
  int32_t expert = 0;
  int32_t gpu = 0;
  int64_t rows = 0;
  RowSource source = RowSource::kHome;
};

enum class CopyKind : uint8_t {
  kWeights,          // the expert's weights, home -> helper (before the helper's GEMM)
  kTokenRows,        // dispatched rows, home -> helper (before the helper's GEMM)
  kOutputRows,       // expert outputs, helper -> home (after the helper's GEMM, before combine)
  kReplicaWeights,   // weights of a new resident replica, home -> its GPU, installed between
                     // micro-batches (EPLB's re-layout): off this micro-batch's critical path
  kPrefetchWeights,  // the expert's weights, home -> a likely helper, issued before this
                     // micro-batch's routing is known (predicted from earlier micro-batches of the
                     // layer), behind earlier work (the attention block). Serves every slice of the
                     // expert on that GPU; unused, it is wasted bytes. Occupies a guest slot.
};

// Weights (for this micro-batch, prefetched, or a resident replica), as opposed to token rows.
inline bool is_weight_copy(CopyKind kind) {
  return kind == CopyKind::kWeights || kind == CopyKind::kReplicaWeights ||
         kind == CopyKind::kPrefetchWeights;
}

struct Copy {
  CopyKind kind = CopyKind::kWeights;
  int32_t expert = 0;
  int32_t src_gpu = 0;
  int32_t dst_gpu = 0;
  int64_t rows = 0;  // token rows carried (0 for weights)
  int64_t bytes = 0;
};

// Weights of `expert` kept on `gpu` (not its home) across micro-batches: an EPLB replica slot.
// They were installed by a kReplicaWeights copy in this plan or in an earlier one.
struct ResidentReplica {
  int32_t expert = 0;
  int32_t gpu = 0;
};

struct Plan {
  std::vector<Slice> slices;  // rows > 0 only, in the order the planner emitted them
  std::vector<Copy> copies;
  std::vector<uint8_t> dynamic;  // [num_experts]: 1 = computed after the plan (not static work)
  // Replica weights present on non-home GPUs during this micro-batch (the layout in force), whether
  // or not they compute rows. Empty for per-micro-batch planners.
  std::vector<ResidentReplica> resident;
  // The plan was made between the counts all-gather and the phase-1 dispatch, which needs it
  // (feplb's one-hop mode; LLEP, MoonEP and FasterMoE, whose dispatch sends rows where the plan
  // says): the planner delays the dispatch, so it is on every GPU's critical path. False: planned
  // while the dispatch and the GPUs' static experts run (the paper's two-phase path), or from
  // history between micro-batches (EPLB), or no plan at all (static).
  bool planned_before_dispatch = false;
  // The planner time reserved ahead of its phase-2 copies, us, where its mode plans a step more
  // than once (feplb's time budget with both tries, as its chooser picks it: twice the knobs');
  // -1: the knobs' (planner_reserve_us). Not part of serialize().
  double reserve_us = -1;
  // Plans made besides this one, on the same counts before it was ready (feplb's chooser costs
  // two candidates on its very first counts): its latency includes theirs, and a simulation
  // that charges a time per plan charges each of them too. Not part of serialize().
  int32_t extra_plans = 0;
  // The candidate modes it was chosen from, itself included (feplb's chooser plans a layer's first
  // counts in several, side by side): its time is theirs and their hand-off, not one plan of its
  // mode's (PlannerClock passes it over). Not part of serialize().
  int32_t candidates = 1;
  // The mode it was planned in, in a few words (feplb: FeplbConfig::label(); empty for the other
  // planners). Not part of serialize().
  std::string mode;
  // When its copies run and the order each GPU runs its guests in, as the planner modelled it:
  // written once by the planner (Planner::plan ends with ScheduleWriter); the metrics and the GPU
  // layer refuse a plan without one. Not part of serialize(plan): serialize(schedule).
  Schedule schedule;

  // Empties the plan for `num_experts` experts, keeping allocated capacity.
  void clear(int num_experts);
  // Rows of `expert` moved from its home to `helper`: adds the slice and its three copies (weights,
  // token rows home -> helper, outputs back).
  void add_migration(int expert, int home, int helper, int64_t rows, const ExpertShape& shape);
  // The same with the weights already on `helper` when `weights_prefetched` (a kPrefetchWeights
  // copy of this plan: no kWeights copy) and, when `one_hop`, the rows sent straight to `helper`
  // by the phase-1 dispatch (a kDispatched slice, outputs back by the combine: no row copies).
  void add_migration(int expert, int home, int helper, int64_t rows, const ExpertShape& shape,
                     bool weights_prefetched, bool one_hop);
  // A kPrefetchWeights copy of `expert`'s weights from `home` to `gpu`.
  void add_prefetch(int expert, int home, int gpu, const ExpertShape& shape);
  // Appends, for every expert, a home slice with the rows its migrations left: moved_rows[e] rows
  // of expert e were sent away. Call once, after the migrations.
  void add_home_slices(const Topology& topo, const RoutingStep& routing,
                       const std::vector<int64_t>& moved_rows);
  int64_t weight_bytes() const;  // weights copied for this micro-batch plus replicas installed
  int64_t token_bytes() const;   // token rows to helpers plus outputs back
};

// What a planner promises; validate() enforces it.
struct PlanLimits {
  bool intra_domain_only = true;  // copies never leave an NVLink domain
  // Per GPU: non-home experts whose weights it holds in this micro-batch, copied or resident.
  int64_t max_guest_experts = std::numeric_limits<int64_t>::max();
  // Every slice's rows are dispatched to the expert's home in phase 1 (RowSource::kHome) and moved
  // on from there: the two-phase plans the GPU layer (feplb/cuda) runs.
  bool rows_via_homes = false;
};

// Throws Error naming the first violated rule: every row computed exactly once, slices on valid
// GPUs, weights on every GPU that computes a guest expert (copied or prefetched in this plan, or
// resident; never two of these), rows
// copied to every helper that computes home-dispatched rows, copies inside domains, guest slots
// respected, every replica installed by this plan listed as resident.
void validate(const Plan& plan, const Topology& topo, const RoutingStep& routing,
              const ExpertShape& shape, const PlanLimits& limits);

// Canonical bytes of a plan (for determinism checks and golden files): its slices, copies,
// replicas, path and dynamic experts.
std::string serialize(const Plan& plan);
// Canonical bytes of a schedule: every number it holds, times bit for bit (hex floating point).
std::string serialize(const Schedule& schedule);

}  // namespace feplb
