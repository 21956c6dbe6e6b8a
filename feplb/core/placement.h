// Expert placement, the macro timescale of FEPLB: each layer's home GPU of every expert and each
// GPU's dynamic set, and the feplb-placement-v1 file that stores it (docs/placement.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "feplb/core/expert_shape.h"
#include "feplb/core/routing.h"
#include "feplb/core/topology.h"

namespace feplb {

inline constexpr std::string_view kPlacementFormat = "feplb-placement-v1";

// One MoE layer's placement.
struct LayerPlacement {
  int64_t layer = 0;
  std::vector<int> home;         // [num_experts]: home GPU of each expert, E / R per GPU
  std::vector<uint8_t> dynamic;  // [num_experts]: 1 = in its home GPU's dynamic set
};

struct Placement {
  int num_experts = 0;
  int num_ranks = 0;
  int gpus_per_node = 0;               // the topology it was made for
  std::vector<LayerPlacement> layers;  // ascending layer ids, each once

  // The entry of `layer`, or null.
  const LayerPlacement* find(int64_t layer) const;
  bool empty() const { return layers.empty(); }
};

// Contiguous homes (expert e on GPU e / (E / R)) for each of `layers`, each GPU's `dyn` (at most
// E / R) lowest-numbered experts dynamic: where a job starts.
Placement contiguous_placement(int num_ranks, int gpus_per_node, int num_experts,
                               const std::vector<int64_t>& layers, int64_t dyn);

// Marks each GPU's `dyn` (at most E / R) lowest-numbered experts of `layer`'s homes dynamic.
void set_lowest_dynamic(int num_ranks, int64_t dyn, LayerPlacement& layer);

// The layer ids of a trace, ascending.
std::vector<int64_t> trace_layers(const Trace& trace);

// The topology of one layer of `p`.
Topology layer_topology(const Placement& p, const LayerPlacement& layer);

// Throws InputError unless `p` fits a trace simulated with `gpus_per_node`: the same expert and
// GPU counts, the same GPUs per node, and an entry for every layer of the trace.
void check_placement_matches(const Placement& p, const Trace& trace, int gpus_per_node);

// Parses a feplb-placement-v1 document; checks every rule of docs/placement.md (every expert
// exactly once per layer, E / R experts per GPU, GPU ids in range and each once, dynamic experts
// local to their GPU) and throws InputError with a one-line message naming the field.
Placement parse_placement(std::string_view text);
// Reads `path`; errors are prefixed with the path.
Placement read_placement(const std::string& path);
// One JSON document, one GPU per line. `history` (may be empty) is kept as provenance.
std::string format_placement(const Placement& p, const std::string& history = "");

// What moving from one placement to another costs: every expert whose home GPU changes moves its
// weights and its optimizer state (optimizer_bytes_per_param per parameter) once, from the old
// home to the new one. Dynamic sets change for free (a label, no data).
struct Migration {
  int64_t rehomed_experts = 0;  // summed over layers
  int64_t across_nodes = 0;     // of which to another node (over the network)
  int64_t weight_bytes = 0;     // expert weights moved
  int64_t optimizer_bytes = 0;  // optimizer state moved
  int64_t network_bytes = 0;    // of weight + optimizer bytes, between nodes
  int64_t total_bytes() const { return weight_bytes + optimizer_bytes; }
};
// Layers of `to` missing from `from` are compared with contiguous homes.
Migration migration_between(const Placement& from, const Placement& to, const ExpertShape& shape,
                            double optimizer_bytes_per_param);

}  // namespace feplb
