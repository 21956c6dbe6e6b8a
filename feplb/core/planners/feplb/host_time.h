// What feplb's chooser measures of its own planning on the host it runs on
// (FeplbChooser::measure_mode_times): synthetic micro-batches to plan.
#pragma once

#include <cstdint>
#include <vector>

#include "feplb/core/routing.h"
#include "feplb/core/topology.h"

namespace feplb::feplb_detail {

// The expert counts of micro-batch `index` of a synthetic stream, into `totals` [num_experts]:
// num_ranks x rows_per_rank rows over the experts by a lognormal popularity (sigma 0.8: the
// busiest expert about 5 to 7 times the mean at 128 to 1,024 experts), drawn afresh for every
// micro-batch. Deterministic in (seed, index).
void synthetic_totals(const Topology& topo, int64_t rows_per_rank, uint64_t seed, int64_t index,
                      std::vector<int64_t>& totals);
// That micro-batch as routing (layer index % 4), each expert's rows spread evenly over the
// source ranks, into `out` (resized to the topology).
void synthetic_step(const Topology& topo, int64_t rows_per_rank, uint64_t seed, int64_t index,
                    RoutingStep& out);

}  // namespace feplb::feplb_detail
