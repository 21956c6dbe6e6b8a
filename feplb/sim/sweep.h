// Sweeps: generate traces from every prior file at several EP sizes, simulate every policy on
// each, and summarise (per EP: pooled over priors; per prior). What `feplb report` runs to
// produce docs/results/*.md and bench/results/*.json.
#pragma once

#include <string>
#include <vector>

#include "feplb/sim/simulate.h"

namespace feplb {

struct SweepConfig {
  std::vector<std::string> prior_paths;  // real-model prior files
  std::vector<int> ranks = {2, 4, 8};    // EP sizes
  int num_experts = 128;                 // priors are widened to this (expand_prior)
  int top_k = 8;
  int gpus_per_node = 8;
  WorkloadSpec workload;  // num_ranks / top_k are set per run
  SimulationConfig sim;   // policies, shape, knobs
  std::string model = "glm5-128e";
};

struct SweepRun {
  int ranks = 0;
  std::string prior;  // file name without directory
  std::vector<std::string> policy_names;
  std::vector<PolicySummary> summaries;  // [policies]
};

// Pooled over every step of every prior at one EP size.
struct SweepPool {
  int ranks = 0;
  std::vector<std::string> policy_names;
  std::vector<PolicySummary> summaries;  // [policies], reductions against pooled static
  double mean_rows = 0;
};

struct SweepResult {
  SweepConfig config;
  std::vector<SweepRun> runs;
  std::vector<SweepPool> pools;  // one per EP size
};

SweepResult run_sweep(const SweepConfig& config, const Progress& progress = {});
std::string format_sweep_markdown(const SweepResult& result, const std::string& command);
std::string format_sweep_json(const SweepResult& result, const std::string& command);

}  // namespace feplb
