// Reporters for a SimulationResult: the terminal table, the JSON document (schema in
// docs/metrics.md) and the SVG picture of per-GPU load before and after each policy.
#pragma once

#include <string>

#include "feplb/sim/simulate.h"

namespace feplb {

std::string format_table(const SimulationResult& result);
std::string format_json(const SimulationResult& result);
std::string plot_svg(const SimulationResult& result);

// Index of the trace step the plot shows: the one where `static` has its largest token straggler.
size_t worst_static_step(const SimulationResult& result);

}  // namespace feplb
