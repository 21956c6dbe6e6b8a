// The anchors side by side (docs/results/balance.md): every policy, the 2026 anchors (EPLB, LLEP,
// MoonEP) included, on real-prior traces and lognormal skew levels at several EP sizes. Balance
// against the weight bytes it costs, the links and SMs each transport uses, a Pareto study of
// policy settings, and what feplb leaves between nodes (with a history-based home placement).
// What `feplb report --anchors` runs.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "feplb/core/expert_shape.h"
#include "feplb/sim/prior.h"
#include "feplb/sim/simulate.h"

namespace feplb {

// Another setting of one policy, simulated for the Pareto study (real priors, one EP size).
struct BalanceVariant {
  std::string label;  // e.g. "feplb tol 5%"
  std::string policy;
  std::vector<KnobOverride> knobs;
  bool placed_homes = false;  // with homes placed from history (BalanceConfig::placed_policies)
};

// feplb's balance tolerance (contiguous and placed homes), EPLB's replan interval, redundancy,
// policy and duplicate rule, LLEP's cap.
std::vector<BalanceVariant> default_balance_variants();

// feplb's modes beyond its default: weights prefetched before routing, rows in one hop, both.
std::vector<BalanceVariant> feplb_modes();
// The many-donor section's: feplb_modes(), GEMM time balanced alone (balance_time_weight 1) and,
// with prefetch (and one-hop), within a token-straggler budget of 5% of the unbalanced one
// (time_balance_budget).
std::vector<BalanceVariant> many_donor_modes();

struct BalanceConfig {
  std::vector<std::string> prior_paths;               // real-model priors (data/priors)
  std::vector<double> skews = {1.2, 2.0, 5.0, 10.0};  // lognormal max/mean over experts
  int skew_layers = 3;                                // layers (own popularity each) per skew
  uint64_t skew_seed = 1;
  std::vector<int> ranks = {2, 4, 8, 16};
  int num_experts = 128;
  int top_k = 8;
  int gpus_per_node = 8;
  WorkloadSpec workload;      // num_steps: measured micro-batches (num_ranks/top_k set per run)
  int64_t warmup_steps = 16;  // history micro-batches before them (observed, not measured)
  SimulationConfig sim;       // policies (static first), shape, knobs
  std::string model = "glm5-128e";
  int pareto_ranks = 8;
  std::vector<BalanceVariant> variants = default_balance_variants();
  // Real priors, every EP: static, feplb and oracle again with homes placed from the warm-up
  // history (EPLB, one expert per group: experts onto nodes, then onto GPUs; no replicas).
  std::vector<std::string> placed_policies = {"static", "feplb", "oracle"};

  // Many-donor skew (several GPUs of a domain overloaded at once, the others deeply under): the
  // generator's many-donor mode (many_donor_prior) and the real priors that show it, per expert
  // shape and EP size; every policy and feplb's modes. GEMM times from the measured table in
  // cost_dir whose shape matches, the roofline otherwise.
  struct Shape {
    std::string name;
    ExpertShape shape;
  };
  std::vector<Shape> many_donor_shapes = {{"Qwen3-235B-like", *shape_for_model("qwen3-235b")},
                                          {"GLM-5", *shape_for_model("glm5")},
                                          {"Qwen3-30B-like", {2048, 768, Dtype::kBf16}}};
  std::vector<int> many_donor_ranks = {8, 16};
  int many_donor_target_ranks = 8;  // its targets (and the modes report's workloads) at this EP
  std::vector<double> many_donor_hot = {1.87, 1.65, 1.21};  // x the mean, per NVLink domain
  double many_donor_cold_min = 0.2;
  double many_donor_expert_skew = 2.0;  // max/mean over a GPU's experts
  // Real priors that show it (paths); empty: those of prior_paths that do (shows_many_donors).
  std::vector<std::string> many_donor_priors;
  std::vector<BalanceVariant> many_donor_modes = feplb::many_donor_modes();
  std::string cost_dir;  // measured GEMM tables (data/cost); empty: the roofline
};

// One label (a policy, a variant, or a policy with placed homes) over a group of steps.
struct BalanceCell {
  std::string label;
  std::string policy;
  DataMovement movement;
  PolicySummary summary;           // reductions against the group's static
  double max_token_straggler = 0;  // worst step
  double max_token_max_over_mean = 0;
  double max_guest_slots = 0;
  double max_network_bytes = 0;  // balancing copies between nodes, worst step
  double oracle_straggler = 0;   // mean in-domain floor: the imbalance left between nodes
  bool placed = false;           // homes placed from history
  bool variant = false;          // a Pareto-study variant
};

// feplb's target against the 2026 anchors: at least kAnchorTargetReduction less token straggler
// than static, copies fitting the window in at least `min_fits` of the steps, and GEMM straggler +
// exposed time no higher than LLEP's and MoonEP's (those absent from the group are not compared).
constexpr double kAnchorTargetReduction = 0.95;
double gemm_plus_exposed(const BalanceCell& c);
bool meets_anchor_target(const BalanceCell& feplb, const BalanceCell* llep,
                         const BalanceCell* moonep, double min_fits);

// Real priors pooled, or one lognormal skew level, at one EP size.
struct BalanceGroup {
  std::string workload;  // many-donor groups: the workload, shape and cost model
  std::string shape_name;
  ExpertShape shape;
  std::string cost_label;
  int ranks = 0;
  int domains = 1;
  double skew = 0;                 // 0: the real priors
  double mean_rows = 0;            // mean rows per GPU per step
  double rehomed_experts = 0;      // placed homes: experts whose home moved, mean per layer
  std::vector<BalanceCell> cells;  // main policies, placed homes, then variants

  const BalanceCell* find(const std::string& label) const;
};

struct BalanceResult {
  BalanceConfig config;
  std::vector<BalanceGroup> groups;
  std::vector<BalanceGroup> many_donor;        // per shape, EP size and workload
  std::vector<std::string> many_donor_priors;  // the real priors used there (stems)

  const BalanceGroup* find(int ranks, double skew) const;
};

// Whether a prior shows many-donor skew on `ranks` GPUs with contiguous homes: in some layer at
// least two GPUs above 1.2 x the mean load and at least two below 0.6 x.
bool shows_many_donors(const Prior& prior, int ranks);

// Per cell of `group`: 1 if it is on the token-straggler / weight-bytes Pareto front of the runtime
// settings (the oracle, a yardstick, is left out): no other one has fewer or equal weight bytes and
// a lower or equal straggler, one of them strictly (exact ties: the first listed stays).
// With `contiguous_only`, settings with placed homes are left out too.
std::vector<uint8_t> pareto_front(const BalanceGroup& group, bool contiguous_only = false);

// Throws InputError on an impossible configuration.
BalanceResult run_balance(const BalanceConfig& config, const Progress& progress = {});
// `plot_dir` is where the SVGs are, relative to the Markdown file ("" when none were written).
std::string format_balance_markdown(const BalanceResult& result, const std::string& command,
                                    const std::string& plot_dir);
std::string format_balance_json(const BalanceResult& result, const std::string& command);
// The file names balance_plots() writes, in its order.
std::vector<std::string> balance_plot_names();
// (file name, SVG) pairs: token straggler, GEMM straggler, weight bytes, Pareto, cross-node.
std::vector<std::pair<std::string, std::string>> balance_plots(const BalanceResult& result);

}  // namespace feplb
