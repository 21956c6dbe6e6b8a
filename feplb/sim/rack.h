// Rack-scale NVLink domains (docs/results/rack.md): every policy as the EP group grows from one
// 8-GPU node to NVLink domains of 72 and 256 GPUs and to several racks joined by the network, on
// the skewed routing of `feplb trace gen --skew`; few experts per GPU with hot experts (real priors
// at EP=64, lognormal at EP=72); and GPU classes side by side. What `feplb report --rack` runs.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "feplb/sim/balance.h"
#include "feplb/sim/simulate.h"

namespace feplb {

// One EP size: `domains` NVLink domains of `domain_size` GPUs each.
struct RackPoint {
  int domains = 1;
  int domain_size = 8;
  int ranks() const { return domains * domain_size; }
  std::string label() const;  // "72", or "288 (4x72)" for several domains
};

// Parses "8,8x8,72,256,4x72": R is one NVLink domain of R GPUs, NxD is N domains of D GPUs.
// InputError naming `flag` otherwise.
std::vector<RackPoint> parse_rack_points(const std::string& text, const char* flag);
// The list parse_rack_points() reads back, e.g. "8,8x8,72,256,4x72".
std::string format_rack_points(const std::vector<RackPoint>& points);

// A GPU class as the report runs it: its knobs (the class applied, the user's knob flags kept)
// and its GEMM cost model.
struct RackGpu {
  std::string name;  // gpu_class.h
  Knobs knobs;
  const GemmCostModel* cost = nullptr;  // null: the roofline from `knobs`; must outlive the run
  std::string cost_label;
};

struct RackConfig {
  // 1. EP from one node to racks: lognormal popularity of max/mean `skew` over experts (as
  // `feplb trace gen --skew`, `skew_layers` layers), `experts_per_gpu` experts per GPU. The points:
  // one 8-GPU node, eight of them joined by the network, NVLink domains of 72 and 256, and four
  // racks of 72.
  std::vector<RackPoint> points = {{1, 8}, {8, 8}, {1, 72}, {1, 256}, {4, 72}};
  double skew = 5.0;
  int experts_per_gpu = 4;
  int skew_layers = 1;
  // 2. Few experts per GPU with hot experts, in one NVLink domain: the real priors (pooled; their
  // top-k must be top_k) at `prior_ranks` GPUs, and lognormal max/mean `hot_skew` at `hot_ranks`,
  // each with every count of `few_experts_per_gpu`.
  std::vector<std::string> prior_paths;
  int prior_ranks = 64;
  double hot_skew = 13.0;
  int hot_ranks = 72;
  std::vector<int> few_experts_per_gpu = {1, 2, 4};
  // 3. GPU classes side by side at `gpu_point` on section 1's workload. Sections 1 and 2 run with
  // `sim` (its knobs, cost model and GPU class).
  std::vector<RackGpu> gpus;
  RackPoint gpu_point = {1, 72};
  int top_k = 8;
  WorkloadSpec workload{.num_steps = 8};  // num_steps: measured micro-batches (`--steps`;
                                          // num_ranks, top_k set per run)
  int64_t warmup_steps = 8;  // history micro-batches before them (observed, not measured)
  SimulationConfig sim;      // policies (static first), shape, knobs, cost, GPU class
  // feplb's modes, simulated next to the policies wherever feplb is one (balance.h).
  std::vector<BalanceVariant> modes = feplb_modes();
  std::string model = "glm5-128e";
};

// One workload at one EP size and GPU class: every policy's cell (balance.h).
struct RackGroup {
  std::string section;   // "ep", "few" or "gpu"
  std::string workload;  // e.g. "lognormal max/mean 5" or "real priors (6)"
  std::string gpu;       // GPU class name
  int domain_size = 0;
  int experts = 0;
  double busiest_expert = 0;  // measured steps: mean of max_e rows / mean_e rows
  BalanceGroup group;         // ranks, domains, mean rows, one cell per policy and feplb mode

  int experts_per_gpu() const { return group.ranks > 0 ? experts / group.ranks : 0; }
};

struct RackResult {
  RackConfig config;
  std::vector<RackGroup> groups;    // section 1 in point order, then 2, then 3
  std::vector<std::string> priors;  // section 2: the priors used (file stems, top-k matched)

  const RackGroup* find(const std::string& section, int ranks, int experts,
                        const std::string& workload_prefix, const std::string& gpu) const;
};

// The labels of a group's cells: the policies, then feplb's modes when feplb is one of them.
std::vector<std::string> rack_labels(const RackConfig& config);

// Throws InputError on an impossible configuration.
RackResult run_rack(const RackConfig& config, const Progress& progress = {});
// `plot_dir` is where the SVGs are, relative to the Markdown file ("" when none were written).
std::string format_rack_markdown(const RackResult& result, const std::string& command,
                                 const std::string& plot_dir);
std::string format_rack_json(const RackResult& result, const std::string& command);
// (file name, SVG) pairs: stragglers against EP, planner time against EP.
std::vector<std::pair<std::string, std::string>> rack_plots(const RackResult& result);
// The file names rack_plots() gives its plots, in its order.
std::vector<std::string> rack_plot_names();

}  // namespace feplb
