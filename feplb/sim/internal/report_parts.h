// Pieces the reports share inside feplb_sim: the balance report's steps per label, group summary
// and cell JSON (also used by rack.cc), and the GPU class's JSON (report.cc, used by every report).
// Internal to feplb_sim (not installed: it includes nlohmann-json's forward declarations).
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "feplb/sim/balance.h"
#include "feplb/sim/simulate.h"

namespace feplb {

// Steps of one label (a policy, a variant, or a policy with placed homes), collected over the
// workloads of a group before they are summarised (also used by the rack report, rack.h).
struct BalanceSteps {
  std::string label, policy;
  DataMovement movement;
  bool placed = false, variant = false;
  std::vector<StepMetrics> steps;
};
// Appends `pr`'s steps to the entry labelled `label` (a new one if there is none).
void collect_steps(std::vector<BalanceSteps>& acc, const std::string& label, const PolicyResult& pr,
                   bool placed, bool variant);
// One cell per entry of `acc` (its summary, worst steps and in-domain floor), reductions against
// the entry labelled "static" (which must exist).
BalanceGroup summarise_group(int ranks, int domains, double skew, std::vector<BalanceSteps>& acc);
// The JSON of one cell, as format_balance_json writes it.
nlohmann::ordered_json balance_cell_json(const BalanceCell& cell);

// The GPU class of `config` (gpu_class.h): name, device, whether measured, where its numbers come
// from, and the link rates and GEMM ceilings in force (knob flags may override the class). Every
// results file carries it under "gpu".
nlohmann::ordered_json gpu_json(const SimulationConfig& config);

// How a policy moves data (its "transport" object in every results file).
nlohmann::ordered_json data_movement_json(const DataMovement& movement);

}  // namespace feplb
