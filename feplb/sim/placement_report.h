// `feplb report --placement` (docs/results/placement.md): walk-forward placement on real-prior
// traces at EP=16 and EP=8 against contiguous homes, its migration, and the placer's timing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "feplb/sim/simulate.h"

namespace feplb {

// How a setting's homes are chosen.
enum class HomesSource : uint8_t {
  kContiguous,   // expert e on GPU e / (E / R), never moved
  kWalkForward,  // replanned every replan_interval micro-batches from the previous window
  kOnce,         // placed once from the warm-up micro-batches, never replanned
};

// One simulated setting of a group: its homes and knobs, and the policies reported from it.
struct PlacementSetting {
  std::string label;  // e.g. "walk-forward, history sets"
  HomesSource homes = HomesSource::kContiguous;
  std::vector<std::string> policies;  // simulated (static is added) and reported
  std::vector<KnobOverride> knobs;
  int64_t window = 0;            // micro-batches of history per replan; 0: the config's
  bool report_migration = true;  // false: same homes as an earlier setting
};

// A workload at one EP size and the settings simulated on it.
struct PlacementGroupSpec {
  std::string name;  // e.g. "EP=16, 2 nodes"
  int ranks = 16;
  double concentration = 2000;  // the generator's Dirichlet concentration (volatility)
  std::vector<PlacementSetting> settings;
};

// EP=16 over two nodes (contiguous, walk-forward, from scratch, placed once, short window) and
// EP=8 in one node on the default and a volatile workload (dynamic sets per micro-batch or from
// history, on contiguous and placed homes, and the dynamic-set scores).
std::vector<PlacementGroupSpec> default_placement_groups();

struct PlacementReportConfig {
  std::vector<std::string> prior_paths;  // real-model priors (data/priors)
  int num_experts = 128;
  int top_k = 8;
  int gpus_per_node = 8;
  WorkloadSpec workload{.num_steps = 96};  // num_steps: measured micro-batches (`--steps`);
                                           // concentration per group
  int64_t warmup_steps = 32;  // history before the first measured micro-batch (and first replan)
  int64_t replan_interval = 32;
  int64_t replan_window = 32;
  SimulationConfig sim;  // shape, knobs, cost model
  std::string model = "glm5-128e";
  std::vector<PlacementGroupSpec> groups = default_placement_groups();
  // Placer timing: one layer's history of this many micro-batches, placed `timing_reps` times.
  int64_t timing_steps = 1000;
  int timing_reps = 5;
  std::vector<int> timing_ranks = {16, 8};
  std::string timing_prior = "olmoe-1b-7b__olmoe-repo__arxiv";  // its first layer; else the first
};

// One (setting, policy) pooled over the group's priors (static always, as the base).
struct PlacementCell {
  std::string setting, policy;
  PolicySummary summary;  // reductions against the setting's own static
};

// Home moves of one setting, over its replans (walk-forward or once) and priors.
struct PlacementMigration {
  std::string setting;
  int64_t replans = 0;              // summed over priors
  double rehomed_first = 0;         // experts per layer at the first replan (mean over priors)
  double rehomed_later = 0;         // experts per layer per later replan (mean)
  double across_nodes = 0;          // experts per layer per replan moved to another node (mean)
  double bytes_per_step = 0;        // all replans' bytes over the measured steps
  double later_bytes_per_step = 0;  // the replans after the first, over the measured steps
  double place_ms_median = 0;       // the placer's wall time per replan (all layers)
  double first_bytes = 0;           // bytes of the first replan, all layers (mean over priors)
  double first_network_bytes = 0;   // of which between nodes
};

struct PlacementGroup {
  PlacementGroupSpec spec;
  int domains = 1;
  double mean_rows = 0;
  std::vector<PlacementCell> cells;
  std::vector<PlacementMigration> migrations;

  const PlacementCell* find(const std::string& setting, const std::string& policy) const;
  const PlacementMigration* migration(const std::string& setting) const;
};

struct PlacementTiming {
  int ranks = 0, domains = 0, experts = 0;
  int64_t steps = 0;
  std::string mode;  // "improve" or "from scratch"
  double median_ms = 0, min_ms = 0, max_ms = 0;
  int64_t rehomed = 0;
};

struct PlacementReportResult {
  PlacementReportConfig config;
  std::vector<PlacementGroup> groups;
  std::vector<PlacementTiming> timings;
  std::string timing_prior;  // the prior (file stem) and layer the timing history came from
  std::string machine;       // CPU model and core count, from /proc/cpuinfo

  const PlacementGroup* find(const std::string& name) const;
};

// Throws InputError on an impossible configuration.
PlacementReportResult run_placement_report(const PlacementReportConfig& config,
                                           const Progress& progress = {});
std::string format_placement_markdown(const PlacementReportResult& result,
                                      const std::string& command);
std::string format_placement_json(const PlacementReportResult& result, const std::string& command);

}  // namespace feplb
