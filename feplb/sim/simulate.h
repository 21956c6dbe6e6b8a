// Trace-driven simulation: every policy plans every step of a trace; the plans are validated and
// measured (metrics.h), the planners timed in-process. What `feplb simulate` runs.
#pragma once

#include <string>
#include <vector>

#include "feplb/core/cost_model.h"
#include "feplb/core/gpu_class.h"
#include "feplb/core/knobs.h"
#include "feplb/core/metrics.h"
#include "feplb/core/placement.h"
#include "feplb/core/placer.h"
#include "feplb/core/planners/planner.h"
#include "feplb/core/routing.h"
#include "feplb/core/topology.h"
#include "feplb/sim/workload.h"

namespace feplb {

struct SimulationConfig {
  std::vector<std::string> policies;  // planner names; "static" is added first when missing
  int gpus_per_node = 8;
  // The trace's first `warmup_steps` micro-batches (distinct step ids, in trace order) are history:
  // every planner observes them, none is planned or measured.
  int64_t warmup_steps = 0;
  // Homes and dynamic sets per layer (placement.h); empty: contiguous homes. Every policy plans
  // on these homes; feplb and feplb-paper use the dynamic sets when feplb_dyn_set = 1 /
  // paper_dyn_set = 2. It must have an entry for every layer of the trace.
  Placement placement;
  // Walk-forward (docs/placement.md): before micro-batch warmup_steps + j * replan_interval
  // (j >= 0; never before the first), the placement is recomputed by the placer (placer.h, from
  // the knobs) from the previous replan_window micro-batches of the trace only, starting from
  // `placement` (contiguous when empty). Planners are rebuilt on the new homes and observe the
  // window's steps again. 0: off.
  int64_t replan_interval = 0;
  int64_t replan_window = 0;  // micro-batches of history per replan; 0: replan_interval
  ExpertShape shape;
  Knobs knobs;
  std::string trace_label;  // shown in reports (e.g. the trace path)
  // GEMM cost model; null = roofline from the knobs. Must outlive simulate().
  const GemmCostModel* cost = nullptr;
  std::string cost_label = "roofline";  // how reports name the model
  // The GPU class the link and GEMM knobs came from (gpu_class.h), for the reports' headers.
  std::string gpu = std::string(gpu_class_list().front().name);
};

// Aggregates over steps: means, p95 (steps) and median/p99 (planner timings).
struct PolicySummary {
  double token_straggler = 0, token_straggler_p95 = 0;
  double token_max_over_mean = 0, token_max_over_mean_p95 = 0;
  double gemm_straggler_ms = 0, gemm_straggler_ms_p95 = 0;
  double weight_bytes_per_step = 0, token_bytes_per_step = 0;
  double guest_experts_per_step = 0;
  double nvlink_bytes_per_step = 0, network_bytes_per_step = 0;  // the plan's copies, by link
  double dispatch_nvlink_bytes_per_step = 0, dispatch_network_bytes_per_step = 0;
  double guest_slots_max = 0;     // max over steps of StepMetrics::max_guest_slots
  double fits_static_window = 0;  // fraction of steps in which no GPU waited for a copy
  double delayed_steps = 0;       // fraction of steps the balancing made slower
                                  // (StepMetrics::delays_layer: late copies or the plan)
  double window_slack_ms_p5 = 0;  // 5th percentile over steps with copies
  double copy_exposed_ms = 0, copy_exposed_ms_p95 = 0;
  double plan_exposed_ms = 0;                 // plan made before the dispatch (one-hop), mean
  double exposed_ms = 0, exposed_ms_p95 = 0;  // copies + plan (StepMetrics::exposed_ms)
  // Prefetch: bytes per step (wasted: unused), hit rate = used / prefetched, coverage = used /
  // guest weights needed (0 when none).
  double prefetch_bytes_per_step = 0, prefetch_wasted_bytes_per_step = 0;
  double prefetch_hit_rate = 0, prefetch_coverage = 0;
  double planner_us_median = 0, planner_us_p99 = 0;
  // The modes the plans were made in (StepMetrics::mode), with how many steps each, in order of
  // first use; empty where the planner names none.
  std::vector<std::pair<std::string, int64_t>> modes;
  double above_oracle_pct_of_mean = 0;   // mean of (S_T - S_T oracle) / mean rows * 100
  double inter_node_floor = 0;           // mean of the in-domain floor (oracle's S_T): the
                                         // imbalance between nodes that in-node balancing leaves
  double token_straggler_reduction = 0;  // 1 - S_T / S_T(static), from the means
  double gemm_straggler_reduction = 0;
};

struct PolicyResult {
  std::string name;
  DataMovement movement;
  std::vector<StepMetrics> steps;  // [measured trace steps]
  std::vector<GpuLoads> loads;     // [measured trace steps]
  PolicySummary summary;
};

// One recomputation of the placement in walk-forward mode.
struct Replan {
  int64_t micro_batch = 0;  // made before this micro-batch (0-based, distinct step ids)
  int64_t history_micro_batches = 0;
  Migration migration;  // against the placement in force until then
  double place_ms = 0;  // wall time of the placer, all layers
  std::vector<LayerPlaceStats> layers;
};

struct SimulationResult {
  SimulationResult(SimulationConfig c, Topology t) : config(std::move(c)), topo(std::move(t)) {}
  SimulationConfig config;
  Topology topo;
  std::string model;
  int top_k = 0;
  int64_t tokens_per_rank = 0;
  std::vector<std::pair<int64_t, int64_t>> step_ids;  // (step, layer) per measured trace step
  std::vector<PolicyResult> policies;
  std::vector<Replan> replans;  // walk-forward only, in order
  Placement final_placement;    // the placement in force at the end (empty: contiguous)
  // Home moves of every replan (weights + optimizer state) over the measured trace steps.
  double migration_bytes_per_step() const;

  const PolicyResult* find(const std::string& name) const;
};

// Aggregates per-step metrics (reductions left at 0; see apply_reductions).
PolicySummary summarise_steps(const std::vector<StepMetrics>& steps);
// Fills token/gemm_straggler_reduction of every summary against `base` (static's).
void apply_reductions(std::vector<PolicySummary*> summaries, const PolicySummary& base);

// Plans `step` into `plan` and returns the planner latency to charge it (us): the median of
// knobs.planner_reps timed runs, or knobs.planner_time_us where that is set (>= 0), once for the
// plan and once for each plan it made besides (Plan::extra_plans, of the first run: the later
// runs of the same counts may make none).
double timed_plan_us(Planner& planner, const RoutingStep& step, Plan& plan, const Knobs& knobs);

// Throws InputError on an impossible configuration (unknown policy, topology mismatch).
SimulationResult simulate(const Trace& trace, const SimulationConfig& config,
                          const Progress& progress = {});

}  // namespace feplb
