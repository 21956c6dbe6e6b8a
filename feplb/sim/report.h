// Reporters for a SimulationResult: the terminal table, the JSON document (schema in
// docs/simulate.md) and the SVG picture of per-GPU load before and after each policy.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

#include "feplb/sim/simulate.h"

namespace feplb {

std::string format_table(const SimulationResult& result);
std::string format_json(const SimulationResult& result);
std::string plot_svg(const SimulationResult& result);

// The GPU class of `config` (gpu_class.h): name, device, whether measured, where its numbers come
// from, and the link rates and GEMM ceilings in force (knob flags may override the class). Every
// results file carries it under "gpu".
nlohmann::ordered_json gpu_json(const SimulationConfig& config);

// Index of the trace step the plot shows: the one where `static` has its largest token straggler.
size_t worst_static_step(const SimulationResult& result);

}  // namespace feplb
