// feplb's default against every explicit mode and the anchors, on every workload the other reports
// run (docs/results/modes.md): the real priors at EP 2, 4 and 8 (core.md), the many-donor
// workloads with three expert shapes (balance.md section 8), EP from one node to racks and few
// experts per GPU with hot experts (rack.md sections 1 and 2). What `feplb report --modes` runs.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "feplb/sim/balance.h"
#include "feplb/sim/simulate.h"

namespace feplb {

// feplb's explicit modes: two-phase or one-hop, weights prefetched or not, rows or GEMM time
// (within a token-straggler budget of 5% of the unbalanced one, 40 us reserved for the planner),
// copies hidden or late (copy_timing 1 or 3): every switch set, so none is left to the default.
std::vector<BalanceVariant> explicit_feplb_modes();

struct ModesConfig {
  std::vector<std::string> prior_paths;  // the real priors (data/priors)
  std::string cost_dir;                  // measured GEMM tables (data/cost); empty: roofline
  WorkloadSpec workload;                 // tokens, seq_len, concentration, seed, num_steps (core)
  SimulationConfig sim;                  // knobs, GPU class (policies and shape set per workload)
  bool core = true, many_donor = true, rack = true, large_domains = true;
  // The large-domain section: one NVLink domain of each size, each count of experts per GPU.
  std::vector<int> large_domain_ranks = {32, 64, 72, 256};
  std::vector<int> large_domain_experts_per_gpu = {2, 4, 8};
  std::string only;  // run only the workloads whose "section: name" contains this (empty: all)
  std::vector<BalanceVariant> modes = explicit_feplb_modes();
};

// One workload: the default, every mode and the anchors.
struct ModesWorkload {
  std::string section;  // "core", "many-donor", "rack", "few experts", "large domains"
  std::string name;     // e.g. "olmoe-1b-7b__olmoe-repo__arxiv, EP=8"
  std::string shape_name;
  int ranks = 0;
  int experts = 0;
  std::vector<BalanceCell> cells;  // static, feplb (the default), llep, moonep, then the modes

  const BalanceCell* find(const std::string& label) const;
  // The explicit mode with the least GEMM straggler + exposed time among those that remove at
  // least 95% of the token straggler (all of them if none does).
  const BalanceCell* best_mode(const std::vector<BalanceVariant>& modes) const;
};

// The default's target on one workload: its GEMM straggler + exposed time within 5% (or 0.005 ms,
// whichever is larger) of the best explicit mode's; no higher than LLEP's and MoonEP's where the
// best mode is; at least 95% of the token straggler removed where the best mode removes that much.
struct ModesVerdict {
  bool near_best = false, beats_anchors = true, token_ok = true;
  bool met() const { return near_best && beats_anchors && token_ok; }
};
ModesVerdict judge(const ModesWorkload& w, const std::vector<BalanceVariant>& modes);

struct ModesResult {
  ModesConfig config;
  std::vector<ModesWorkload> workloads;
};

// Throws InputError on an impossible configuration.
ModesResult run_modes(const ModesConfig& config, const Progress& progress = {});
std::string format_modes_markdown(const ModesResult& result, const std::string& command,
                                  const std::string& plot_dir);
std::string format_modes_json(const ModesResult& result, const std::string& command);
// (file name, SVG): the default's and the anchors' GEMM straggler + exposed time against the
// best explicit mode's, per workload.
std::vector<std::pair<std::string, std::string>> modes_plots(const ModesResult& result);

}  // namespace feplb
